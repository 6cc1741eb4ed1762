"""The HTML report's table sections: the summary against the baseline, the flags (compile health, noisy cells,
mismatches, cells that did not run), parity, each run's environment and settings, and the reduced-precision and
scaling tables."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from fwbench.report import dtypes, kernels, scaling
from fwbench.report.flags import NOISY_REL_CI, compile_flags, is_noisy, precision_flags, precision_key
from fwbench.report.html.markup import cell_label, esc, extra_section, maybe_fold, ratio_text, table, value_html
from fwbench.spec import shape_text
from fwbench.speedups import ALPHA, GroupedPair, PairSummary, rel_half_width, runtimes_in
from fwbench.store import ResultRecord, RunRecord
from fwbench.units import format_seconds_noise, short_id


def _speedup_html(summary: PairSummary) -> str:
    text = ratio_text(summary.geomean_ratio)
    if summary.ci_low is not None and summary.ci_high is not None:
        text += f' <span class="muted">[{summary.ci_low:.3g}–{summary.ci_high:.3g}]</span>'
        if summary.ci_low > 1:
            text = f'<span class="faster">{text}</span>'
        elif summary.ci_high < 1:
            text = f'<span class="slower">{text}</span>'
    return text


def _failed(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {esc(status)}" for status, n in counts.items()) or "0"


def summary_rows(pairs: Sequence[GroupedPair], with_group: bool) -> list[list[str]]:
    rows = []
    for pair in pairs:
        s = pair.summary
        compared = sum(1 for c in pair.cells if c.ratio is not None)
        machine = f" machine {short_id(pair.hardware_id)}" if len({p.hardware_id for p in pairs}) > 1 else ""
        group = [esc(f"run {pair.run_id}{machine} {pair.phase} {pair.dtype} {pair.device}")] if with_group else []
        rows.append(
            group
            + [
                esc(s.runtime),
                str(s.n_common),
                _speedup_html(s),
                str(s.n_faster),
                str(s.n_slower),
                str(compared - s.n_faster - s.n_slower),
                _failed(s.failed_baseline),
                _failed(s.failed_runtime),
            ]
        )
    return rows


SUMMARY_HEADERS = [
    "runtime",
    "cells both ok",
    "geometric-mean speed-up [95% CI]",
    "sig. faster",
    "sig. slower",
    "no sig. diff.",
    "baseline could not run",
    "runtime could not run",
]


def summary_section(pairs: Sequence[GroupedPair], baseline: str | None, results: Sequence[ResultRecord]) -> str:
    """The pair summaries against the baseline, one row per runtime and (run, phase, dtype, device) group."""
    parts = ['<section id="summary"><h2>Summary against the baseline</h2>']
    if baseline is None or not pairs:
        present = ", ".join(esc(r) for r in runtimes_in(results)) or "none"
        parts.append(
            f"<p>No comparison: the baseline {esc(baseline)} shares no cells with another runtime here "
            f"(runtimes: {present}).</p></section>"
        )
        return "\n".join(parts)
    with_group = len({(p.run_id, p.hardware_id, p.phase, p.dtype, p.device) for p in pairs}) > 1
    headers = (["group"] if with_group else []) + SUMMARY_HEADERS
    offset = 1 if with_group else 0
    parts.append(table(headers, summary_rows(pairs, with_group), numeric=[offset + i for i in (1, 2, 3, 4, 5)]))
    parts.append(
        f"<p class=small>Speed-up = time of {esc(baseline)} / time of the runtime, per cell (&gt; 1: the "
        "runtime is faster); for cells measured interleaved, from paired blocks that ran back to back. The geometric "
        "mean is over the cells both completed <em>ok</em> (never a mean of seconds), with a seeded "
        "percentile-bootstrap 95% CI over cells; green/red when that CI excludes 1. Significant: Student-t over the "
        f"rounds (fresh worker processes; at least 3), Holm-adjusted over the pair's cells, p &lt; {ALPHA}."
        " <em>Could not run</em> counts the non-ok cells of each side among the cells both have. Ratios never "
        "mix runs, phases, dtypes or devices.</p></section>"
    )
    return "\n".join(parts)


def _grouped(
    rows: Sequence[ResultRecord], what: Callable[[ResultRecord], tuple[Any, ...]], multi_run: bool
) -> tuple[int, list[list[str]]]:
    """Cells grouped by (run, model, runtime, ``what(row)``): one table row per group with its cell count
    and every shape; returns (cells, table rows)."""
    groups: dict[tuple[Any, ...], list[str]] = {}
    for r in rows:
        groups.setdefault((r.run_id, r.model, r.runtime, *what(r)), []).append(
            shape_text(r.batch_size, r.seq_len, r.workers, r.procs, r.scaling)
        )
    table = [
        ([esc(key[0])] if multi_run else []) + [esc(k) for k in key[1:]] + [str(len(shapes)), esc(", ".join(shapes))]
        for key, shapes in groups.items()
    ]
    return len(rows), table


def flags_section(results: Sequence[ResultRecord], multi_run: bool) -> str:
    """Compile-health flags, noisy cells, parity mismatches and the other cells that did not run; cells
    with the same model, runtime and message are one row listing their shapes."""
    run = ["run"] if multi_run else []
    n_compile, compile_rows = _grouped(
        [r for r in results if compile_flags(r)], lambda r: ("; ".join(compile_flags(r)),), multi_run
    )
    noisy_rows = [
        cell_label(r, multi_run)
        + [f"±{rel_half_width(r):.1%}", esc(format_seconds_noise(r.median_s, r.ci_low_s, r.ci_high_s))]
        for r in results
        if is_noisy(r)
    ]
    n_mismatch, mismatch_rows = _grouped(
        [r for r in results if r.status == "mismatch"], lambda r: (r.reason,), multi_run
    )
    n_other, other_rows = _grouped(
        [r for r in results if r.status not in ("ok", "mismatch")], lambda r: (r.status, r.reason), multi_run
    )
    tail = ["cells", "shapes"]
    count_column = len(run) + 3
    return "\n".join(
        [
            '<section id="flags"><h2>Flags</h2>',
            maybe_fold(
                "Compile health (recompiles or retraces in the timed loop, graph breaks, eager fallbacks)",
                n_compile,
                len(compile_rows),
                table(run + ["model", "runtime", "flags"] + tail, compile_rows, numeric=[count_column]),
            ),
            maybe_fold(
                f"Noisy cells (95% CI half-width &gt; {NOISY_REL_CI:.0%} of the median)",
                len(noisy_rows),
                len(noisy_rows),
                table(
                    run + ["model", "runtime", "shape", "CI half-width", "median"],
                    noisy_rows,
                    numeric=[len(run) + 3, len(run) + 4],
                ),
            ),
            maybe_fold(
                "Parity mismatches (outputs differ from the float64 reference; no time reported)",
                n_mismatch,
                len(mismatch_rows),
                table(run + ["model", "runtime", "reason"] + tail, mismatch_rows, numeric=[count_column]),
            ),
            maybe_fold(
                "Other cells that did not run (oom, timeout, error, skipped)",
                n_other,
                len(other_rows),
                table(run + ["model", "runtime", "status", "reason"] + tail, other_rows, numeric=[count_column + 1]),
            ),
            "</section>",
        ]
    )


def _error_text(value: float | None) -> str:
    return f"{math.nan if value is None else value:.2e}"


def _computed_in(row: ResultRecord) -> str:
    """The op classes' dtypes a cell's framework showed (details.precision), or why there are none."""
    seen = row.precision
    if seen is None:
        return "—"
    if seen.error:
        return f"not observed: {esc(seen.error)}"
    if not seen.observable:
        return "not observable (an engine's compiled artefact)"
    return "<br>".join(f"{esc(op)}: {esc(', '.join(names))}" for op, names in seen.observed.items()) or "—"


def parity_section(results: Sequence[ResultRecord], multi_run: bool) -> str:
    """One row per stored parity check: relative L2 and max-abs error of each output against the reference, the
    dtypes the framework's graph showed per op class, and the precision flag (fwbench.report.flags)."""
    precision = precision_flags(results)
    rows, classes = [], []
    for r in results:
        check = r.parity
        if check is None:
            continue
        errors = (
            "<br>".join(
                f"{esc(name)}: rel L2 {_error_text(v.rel_l2)}, max abs {_error_text(v.max_abs)}"
                for name, v in check.outputs.items()
            )
            or "—"
        )
        ok = check.passed
        computed = _computed_in(r)
        rows.append(
            ([esc(r.run_id)] if multi_run else [])
            + [
                esc(r.model),
                esc(r.runtime),
                esc(r.dtype),
                esc(" × ".join("—" if s is None else str(s) for s in check.shape)),
                "ok" if ok else "<b>MISMATCH</b>",
                esc(check.tolerance_rel_l2),
                esc(check.reference),
                errors,
                computed + (f"<br><b>{esc(precision[precision_key(r)])}</b>" if precision_key(r) in precision else ""),
            ]
        )
        classes.append("" if ok else "bad")
    headers = (["run"] if multi_run else []) + [
        "model",
        "runtime",
        "dtype",
        "checked at (batch × seq)",
        "parity",
        "tolerance (rel L2)",
        "reference",
        "error per output",
        "computed in (observed)",
    ]
    body = table(headers, rows, row_classes=classes) if rows else "<p>No parity checks are stored here.</p>"
    return (
        f'<section id="parity"><h2>Parity</h2><p class=small>Each runtime is checked once per model in a run, '
        f"by its first cell, after the timing, on the model's parity shape.</p>{body}</section>"
    )


def environment_section(runs: Sequence[RunRecord]) -> str:
    """Each run's metadata, settings and environment record, as stored."""
    parts = ['<section id="environment"><h2>Environment and settings</h2>']
    for index, run in enumerate(runs):
        meta = [
            ("run", run.id),
            ("created", run.created),
            ("finished", run.finished or "not finished"),
            ("suite", run.suite),
            ("fwbench version", run.fwbench_version),
            ("cells planned", run.planned.size),
            *([("shard", f"{run.shard} of plan {str(run.plan_hash)[:12]}")] if run.shard else []),
            *(
                [("merged from", "; ".join(f"{p['file']} run {p['run_id']}" for p in run.sources))]
                if run.sources
                else []
            ),
        ]
        kv = [[esc(k), esc(v)] for k, v in meta] + [["command", f"<code>{esc(run.command)}</code>"]]
        settings = [[esc(k), value_html(v)] for k, v in sorted(run.settings.items())]
        env = [[esc(k), value_html(v)] for k, v in sorted(run.environment.items())]
        open_attr = " open" if index == 0 else ""
        parts.append(
            f"<details{open_attr}><summary>run {esc(run.id)}: {esc(run.created)}, {esc(run.suite or 'no suite')}, "
            f"{esc(run.planned.size)} cells</summary>"
            + table(["", ""], kv, css="kv")
            + "<h3>Settings</h3>"
            + table(["setting", "value"], settings, css="kv")
            + "<h3>Environment</h3>"
            + table(["key", "value"], env, css="kv")
            + "</details>"
        )
    if not runs:
        parts.append("<p>No run records.</p>")
    parts.append("</section>")
    return "\n".join(parts)


def reduced_precision_section(results: Sequence[ResultRecord]) -> str:
    """bf16 / int8 cells beside the same runtime's fp32 cells (:mod:`fwbench.report.dtypes`); empty without any."""
    rows = [dtypes.dtype_cells(item, markup=False) for item in dtypes.dtype_comparisons(results)]
    return extra_section("reduced-precision", dtypes.TITLE, dtypes.HEADERS, dtypes.RIGHT, rows, dtypes.LEGEND)


def scaling_section(results: Sequence[ResultRecord]) -> str:
    """Data-parallel cells against their 1-process cells (:mod:`fwbench.report.scaling`); empty without any."""
    rows = [scaling.scaling_cells(item, markup=False) for item in scaling.scaling_rows(results)]
    return extra_section("scaling", scaling.TITLE, scaling.HEADERS, scaling.RIGHT, rows, scaling.LEGEND)


def kernels_section(results: Sequence[ResultRecord]) -> str:
    """The kernel libraries the cells recorded (:mod:`fwbench.report.kernels`); empty without any."""
    rows = kernels.kernel_rows(results)
    return extra_section("kernels", kernels.TITLE, kernels.HEADERS, kernels.RIGHT, rows, kernels.LEGEND)
