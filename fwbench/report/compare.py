"""Comparing two stored runs (``fwbench compare RUN_A RUN_B``), e.g. to gate a CI job on regressions.

Cells match by (model, runtime, phase, batch size, sequence length, dtype, device, loader workers, processes and
scaling). Per matched cell:
the time ratio B/A of the two cells' round-level estimates (> 1: B is slower), its 95% CI and two-sided p-value
from the rounds of both runs (Student-t, Welch; :mod:`fwbench.measure.rounds`), Holm-adjusted over every cell
both runs completed with a p-value. The CI counts the variation between worker processes, so two runs of the
same code do not differ "significantly" from process-to-process noise; a cell with fewer than 3 rounds on a
side has no CI and is never significant (:mod:`fwbench.speedups` has the statistics). A cell is a *regression* when the
difference is significant and B/A > 1 + threshold, an *improvement* when it is significant and
B/A < 1 / (1 + threshold); a cell that was ``ok`` in A and is not in B is *broken* (also a regression
for the exit status). Summaries are geometric means of B/A over the cells both runs completed. Two warnings come
with the verdicts: cells that ran on different machines (:func:`machine_warning`), and every runtime moving the same
way (:func:`shift_warning`: the machine's speed, not a framework's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from rich.markup import escape

from fwbench.report.serving import ServingChange, serving_changes
from fwbench.report.table import TableData, plain, ratio_text
from fwbench.spec import CASE_FIELDS
from fwbench.speedups import ALPHA, cell_key, estimates, geometric_mean_ci, machine_labels, runtimes_in, sample_median
from fwbench.store import ResultRecord, RunRecord
from fwbench.units import format_percent, format_seconds, format_seconds_noise, second_axis_text, short_id

COMPARE_KEY = CASE_FIELDS  # a cell of run A is the cell of run B with the same case (another run, maybe machine)
DEFAULT_THRESHOLD = 0.05
Verdict = Literal["regression", "improvement", "within threshold", "not significant", "broken", "fixed", "not ok"]
SETTINGS_KEYS = (
    "threads",
    "interop_threads",
    "protocol",
    "max_time_s",
    "warmup_calls",
    "memory_limit_bytes",
    "compile_mode",
    "optimizer",
    "seed",
)
# What a run's data and fit-from-images cells read and how (recorded only for runs that have such cells, so an
# inference run compares as before): the settings, and the dataset's digest its cells stored.
DATA_SETTINGS_KEYS = (
    "crop", "transform", "data_batches", "data_source", "skip_corrupt", "fit_source", "fit_workers", "epochs",
)  # fmt: skip


@dataclass(frozen=True)
class CellChange:
    """One cell both runs have. ``ratio`` = median_b / median_a (> 1: B slower) with its 95% CI, ``p_value``
    (Student-t over rounds) and ``p_adjusted`` (Holm, over the comparison's cells both ran ok): None unless both
    cells are ``ok`` with samples. Medians in seconds per call."""

    model: str
    runtime: str
    phase: str
    batch_size: int
    seq_len: int | None
    dtype: str
    device: str
    status_a: str
    status_b: str
    reason_a: str | None
    reason_b: str | None
    median_a_s: float | None
    median_b_s: float | None
    ratio: float | None
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    p_adjusted: float | None
    significant: bool
    verdict: Verdict
    workers: int | None = None  # phase data: the loaders' worker count
    procs: int | None = None  # a distributed cell's processes
    scaling: str | None = None  # and its batch semantics


@dataclass(frozen=True)
class RatioSummary:
    """Geometric mean of B/A over ``n_common`` cells both runs completed ``ok``, with its bootstrap CI over
    cells, and the verdict counts of ``runtime``'s cells (``'all'`` for every runtime together)."""

    runtime: str
    n_common: int
    geomean_ratio: float | None
    ci_low: float | None
    ci_high: float | None
    counts: dict[str, int]


@dataclass(frozen=True)
class EnvironmentDifference:
    """One environment, settings or framework-version entry that differs between the runs (None: absent)."""

    key: str
    a: str | None
    b: str | None


@dataclass
class RunComparison:
    """Everything ``fwbench compare`` prints; :attr:`failed` decides its exit status."""

    run_a: int
    run_b: int
    threshold: float
    cells: list[CellChange]
    only_a: list[ResultRecord]
    only_b: list[ResultRecord]
    summaries: list[RatioSummary]
    environment: list[EnvironmentDifference] = field(default_factory=list)
    serving: list[ServingChange] = field(default_factory=list)  # serving cells of both runs: their load figures
    machine_warning: str | None = None  # the runs' cells ran on different hardware
    shift_warning: str | None = None  # every runtime moved the same way: the machine's speed, not the software

    @property
    def regressions(self) -> list[CellChange]:
        """Cells significantly slower beyond the threshold, or broken (ok in A, not ok in B)."""
        return [c for c in self.cells if c.verdict in ("regression", "broken")]

    @property
    def failed(self) -> bool:
        return bool(self.regressions)

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_a": self.run_a,
            "run_b": self.run_b,
            "threshold": self.threshold,
            "alpha": ALPHA,
            "failed": self.failed,
            "machine_warning": self.machine_warning,
            "shift_warning": self.shift_warning,
            "cells": [asdict(c) for c in self.cells],
            "only_a": [_key_dict(r) for r in self.only_a],
            "only_b": [_key_dict(r) for r in self.only_b],
            "summaries": [asdict(s) for s in self.summaries],
            "environment": [asdict(d) for d in self.environment],
            "serving": [asdict(s) for s in self.serving],
        }


def _key_dict(row: ResultRecord) -> dict[str, Any]:
    return {**{name: getattr(row, name) for name in COMPARE_KEY}, "status": row.status, "reason": row.reason}


def _verdict(status_a: str, status_b: str, ratio: float | None, significant: bool, threshold: float) -> Verdict:
    if status_a == "ok" and status_b != "ok":
        return "broken"
    if status_a != "ok" and status_b == "ok":
        return "fixed"
    if ratio is None:
        return "not ok"
    if not significant:
        return "not significant"
    if ratio > 1 + threshold:
        return "regression"
    if ratio < 1 / (1 + threshold):
        return "improvement"
    return "within threshold"


def _summary(runtime: str, cells: Sequence[CellChange]) -> RatioSummary:
    ratios = [c.ratio for c in cells if c.ratio is not None]
    centre, low, high = geometric_mean_ci(ratios)
    counts: dict[str, int] = {}
    for cell in cells:
        counts[cell.verdict] = counts.get(cell.verdict, 0) + 1
    return RatioSummary(runtime, len(ratios), centre, low, high, counts)


def compare_results(
    results_a: Sequence[ResultRecord],
    results_b: Sequence[ResultRecord],
    run_a: int,
    run_b: int,
    threshold: float = DEFAULT_THRESHOLD,
) -> RunComparison:
    """Match the cells of two runs' store rows and compare them (see the module docstring); cells in A's model
    and runtime order, then by phase, dtype, device, batch size and sequence length."""
    by_key_b = {cell_key(row, COMPARE_KEY): row for row in results_b}
    keys_a = {cell_key(row, COMPARE_KEY) for row in results_a}
    models = {m: i for i, m in enumerate(dict.fromkeys(row.model for row in results_a))}
    runtimes = {r: i for i, r in enumerate(runtimes_in(results_a))}
    ordered = sorted(
        results_a,
        key=lambda r: (
            models[r.model],
            runtimes[r.runtime],
            r.phase,
            r.dtype,
            r.device,
            r.batch_size,
            -1 if r.seq_len is None else r.seq_len,
            -1 if r.workers is None else r.workers,
            r.scaling or "",
            -1 if r.procs is None else r.procs,
        ),
    )
    pairs = [(by_key_b[cell_key(row, COMPARE_KEY)], row) for row in ordered if cell_key(row, COMPARE_KEY) in by_key_b]
    cells = []
    for (b, a), (estimate, p_adjusted) in zip(pairs, estimates(pairs)):
        significant = p_adjusted is not None and p_adjusted < ALPHA
        ratio = None if estimate is None else estimate.ratio
        cells.append(
            CellChange(
                model=a.model,
                runtime=a.runtime,
                phase=a.phase,
                batch_size=a.batch_size,
                seq_len=a.seq_len,
                dtype=a.dtype,
                device=a.device,
                workers=a.workers,
                procs=a.procs,
                scaling=a.scaling,
                status_a=a.status,
                status_b=b.status,
                reason_a=a.reason,
                reason_b=b.reason,
                median_a_s=sample_median(a),
                median_b_s=sample_median(b),
                ratio=ratio,
                ci_low=None if estimate is None else estimate.ci_low,
                ci_high=None if estimate is None else estimate.ci_high,
                p_value=None if estimate is None else estimate.p_value,
                p_adjusted=p_adjusted,
                significant=significant,
                verdict=_verdict(a.status, b.status, ratio, significant, threshold),
            )
        )
    summaries = [
        _summary(runtime, [c for c in cells if c.runtime == runtime])
        for runtime in dict.fromkeys(c.runtime for c in cells)
    ]
    if len(summaries) > 1:
        summaries.append(_summary("all", cells))
    return RunComparison(
        run_a=run_a,
        run_b=run_b,
        threshold=threshold,
        cells=cells,
        only_a=[row for row in results_a if cell_key(row, COMPARE_KEY) not in by_key_b],
        only_b=[row for row in results_b if cell_key(row, COMPARE_KEY) not in keys_a],
        summaries=summaries,
    )


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def framework_versions(results: Sequence[ResultRecord]) -> dict[str, str]:
    """``details.versions`` of a run's cells, flattened (``versions.torch`` → ``'2.13.0'``; several values
    seen in one run are joined with ``' | '``)."""
    seen: dict[str, set[str]] = {}
    for row in results:
        if row.versions is not None:
            for name, value in row.versions.items():
                seen.setdefault(f"versions.{name}", set()).add(str(value))
    return {key: " | ".join(sorted(values)) for key, values in sorted(seen.items())}


def _dataset_digest(row: ResultRecord) -> str | None:
    """The digest of the dataset a data cell (``details.data``) or a fit from images (``details.fit.input``) read."""
    if row.data is not None:
        return row.data.digest
    return None if row.fit is None or row.fit.input is None else row.fit.input.digest


def environment_record(run: RunRecord, results: Sequence[ResultRecord]) -> dict[str, str | None]:
    """What :func:`environment_differences` compares: the run's environment record (CPU model and flags,
    cores, package versions, ...), its measurement settings, the thread counts its cells ran with, and the
    framework versions its workers reported."""
    record: dict[str, str | None] = {f"environment.{k}": _text(v) for k, v in sorted(run.environment.items())}
    record.update({f"settings.{k}": _text(run.settings.get(k)) for k in SETTINGS_KEYS if k in run.settings})
    if int(run.settings.get("nodes") or 1) > 1:  # cells of several processes across machines (--nnodes)
        record["settings.nodes"] = _text(run.settings["nodes"])
    if any(row.phase in ("data", "fit") for row in results):
        record.update({f"settings.{k}": _text(run.settings.get(k)) for k in DATA_SETTINGS_KEYS if k in run.settings})
        digests = sorted({digest for digest in map(_dataset_digest, results) if digest})
        if digests:
            record["data.digest"] = " | ".join(digests)
    threads = sorted({row.threads for row in results if row.threads is not None})
    if threads:
        record["cells.threads"] = ", ".join(map(str, threads))
    record.update(framework_versions(results))
    return record


def environment_differences(
    run_a: RunRecord, results_a: Sequence[ResultRecord], run_b: RunRecord, results_b: Sequence[ResultRecord]
) -> list[EnvironmentDifference]:
    """Every entry of :func:`environment_record` whose value differs between the runs, in key order."""
    a, b = environment_record(run_a, results_a), environment_record(run_b, results_b)
    return [EnvironmentDifference(key, a.get(key), b.get(key)) for key in sorted({*a, *b}) if a.get(key) != b.get(key)]


def compare_runs(
    run_a: RunRecord,
    results_a: Sequence[ResultRecord],
    run_b: RunRecord,
    results_b: Sequence[ResultRecord],
    threshold: float = DEFAULT_THRESHOLD,
) -> RunComparison:
    """:func:`compare_results` plus the :func:`environment_differences` of the two runs."""
    comparison = compare_results(results_a, results_b, run_a.id, run_b.id, threshold)
    comparison.environment = environment_differences(run_a, results_a, run_b, results_b)
    comparison.serving = serving_changes(results_a, results_b)
    comparison.machine_warning = machine_warning(results_a, results_b)
    comparison.shift_warning = shift_warning(comparison)
    return comparison


def shift_warning(comparison: RunComparison) -> str | None:
    """A one-line warning when every runtime's cells moved the same way beyond the threshold (each runtime's
    geometric-mean B/A above 1 + threshold, or each below 1 / (1 + threshold); at least two runtimes): what a
    machine whose speed changed between the runs looks like (a shared VM ran whole runs 1.7× apart within a day,
    docs/measurements.md), where a regression of one framework moves its runtimes against the others. None
    otherwise."""
    ratios = [s.geomean_ratio for s in comparison.summaries if s.runtime != "all" and s.geomean_ratio is not None]
    if len(ratios) < 2:
        return None
    limit = 1 + comparison.threshold
    if not (all(r > limit for r in ratios) or all(r < 1 / limit for r in ratios)):
        return None
    overall = next((s for s in comparison.summaries if s.runtime == "all"), None)
    total = (
        ""
        if overall is None or overall.geomean_ratio is None
        else f"{overall.geomean_ratio:.2f}× over {overall.n_common} cells, "
    )
    return (
        f"warning: every runtime moved the same way between the runs (B/A {total}runtimes {min(ratios):.2f}–"
        f"{max(ratios):.2f}×): a machine whose speed changed between them looks like this; a regression of one "
        "framework moves its runtimes against the others, so compare the runtimes' B/A with each other, or each "
        "run's speed-ups (`fwbench report`)"
    )


def machine_warning(results_a: Sequence[ResultRecord], results_b: Sequence[ResultRecord]) -> str | None:
    """A one-line warning when cells matched across the runs ran on different hardware, or the runs' machines
    differ (None when every matched cell ran on one machine type in both): then a ratio mixes a hardware change
    with the software change that ``compare`` is for."""
    a, b = machine_labels(results_a), machine_labels(results_b)
    by_key_b = {cell_key(row, COMPARE_KEY): row.hardware_id for row in results_b}
    crossed = sum(
        1 for row in results_a if by_key_b.get(cell_key(row, COMPARE_KEY), row.hardware_id) != row.hardware_id
    )
    if set(a) == set(b) and not crossed:
        return None

    def names(machines: dict[str | None, str]) -> str:
        return "; ".join(f"{short_id(key)} ({label})" for key, label in machines.items())

    return (
        f"warning: {crossed} matched cells ran on different machines (A: {names(a)}; B: {names(b)}): their B/A mixes "
        "the hardware difference with the software one; `fwbench report --by machine` shows cells side by side per "
        "machine"
    )


VERDICT_STYLES = {
    "regression": "red",
    "broken": "red",
    "improvement": "green",
    "fixed": "green",
    "within threshold": "default",
    "not significant": "dim",
    "not ok": "dim",
}
SHAPE_LABELS = (("phase", "phase"), ("dtype", "dtype"), ("device", "device"))


def percent(fraction: float) -> str:
    """``0.05`` → ``'5%'``, ``0.025`` → ``'2.5%'``."""
    return format_percent(fraction, 4)


def _p_text(p_adjusted: float | None) -> str:
    return "—" if p_adjusted is None else f"{p_adjusted:.2g}"


def comparison_tables(comparison: RunComparison, label_a: str, label_b: str) -> list[TableData]:
    """The per-cell table, the geometric-mean summary, the cells only one run has and the environment
    differences, as :class:`~fwbench.report.table.TableData` (rich markup, store strings escaped)."""
    cells = comparison.cells
    varying = [(key, label) for key, label in SHAPE_LABELS if len({getattr(c, key) for c in cells}) > 1]
    right = frozenset({"batch", "seq", "A median", "B median", "B/A (95% CI)", "p (Holm)", "cells both ok"})
    per_cell = TableData(
        escape(f"fwbench compare: A = {label_a}, B = {label_b} (threshold {percent(comparison.threshold)})"),
        [
            "model",
            "runtime",
            *(label for _, label in varying),
            "batch",
            "seq",
            "A median",
            "B median",
            "B/A (95% CI)",
            "p (Holm)",
            "verdict",
        ],
        right,
    )
    for c in cells:
        style = VERDICT_STYLES[c.verdict]
        why = (
            ""
            if c.verdict not in ("broken", "fixed", "not ok")
            else f" ({escape(c.status_a)})"
            if c.status_a == c.status_b
            else f": {escape(c.status_a)} → {escape(c.status_b)}"
        )
        per_cell.rows.append(
            [
                escape(c.model),
                escape(c.runtime),
                *(escape(str(getattr(c, key))) for key, _ in varying),
                str(c.batch_size),
                second_axis_text(c.seq_len, c.workers, c.procs, c.scaling),
                format_seconds_noise(c.median_a_s, None, None)
                if c.median_a_s is not None
                else f"N/A {escape(c.status_a)}",
                format_seconds_noise(c.median_b_s, None, None)
                if c.median_b_s is not None
                else f"N/A {escape(c.status_b)}",
                "—" if c.ratio is None else ratio_text(c.ratio, c.ci_low, c.ci_high),
                _p_text(c.p_adjusted),
                f"[{style}]{c.verdict}{why}[/]",
            ]
        )
    summary = TableData(
        "geometric mean of B/A over the cells both runs completed ok",
        ["runtime", "cells both ok", "geomean B/A (95% CI)", "verdicts"],
        right,
    )
    for s in comparison.summaries:
        summary.rows.append(
            [
                escape(s.runtime),
                str(s.n_common),
                "N/A" if s.geomean_ratio is None else ratio_text(s.geomean_ratio, s.ci_low, s.ci_high),
                ", ".join(f"{escape(v)} {n}" for v, n in sorted(s.counts.items())),
            ]
        )
    if len(comparison.summaries) > 1:
        summary.section_ends.add(len(comparison.summaries) - 2)
    tables = [per_cell, summary]
    for name, rows in (("A", comparison.only_a), ("B", comparison.only_b)):
        if rows:
            only = TableData(
                f"{len(rows)} cells only run {name} has",
                ["model", "runtime", "phase", "batch", "seq", "dtype", "device", "status"],
                right,
            )
            for row in rows:
                only.rows.append(
                    [escape(str(getattr(row, k))) if getattr(row, k) is not None else "—" for k in COMPARE_KEY[:3]]
                    + [
                        str(row.batch_size),
                        second_axis_text(row.seq_len, row.workers, row.procs, row.scaling),
                        escape(row.dtype),
                        escape(row.device),
                        escape(row.status),
                    ]
                )
            tables.append(only)
    if comparison.serving:
        tables.append(serving_change_table(comparison.serving))
    if comparison.environment:
        env = TableData("environment differences", ["key", "A", "B"])
        for d in comparison.environment:
            env.rows.append([escape(d.key), "—" if d.a is None else escape(d.a), "—" if d.b is None else escape(d.b)])
        tables.append(env)
    return tables


SERVING_HEADERS = [
    "model", "runtime", "max batch", "seq", "capacity A", "capacity B", "B/A", "p99 @ 50% A", "p99 @ 50% B", "B/A",
    "peak A", "peak B", "B/A",
]  # fmt: skip
SERVING_LEGEND = (
    "serving: each serving cell of both runs, its capacity (queries/s), p99 at half of it and peak load under the "
    "p99 bound in A and B (geometric means over rounds; fwbench report shows their intervals); descriptive: the "
    "verdicts and the exit status follow the cells' stored times (SingleStream requests), above."
)


def _ratio(a: float | None, b: float | None) -> str:
    return "—" if a is None or b is None or a <= 0 else f"{b / a:.2f}×"


def serving_change_table(changes: Sequence[ServingChange]) -> TableData:
    """The serving cells of both runs with their load figures in A and B (:func:`serving_changes`)."""
    table = TableData("serving under load, A → B", list(SERVING_HEADERS), frozenset(SERVING_HEADERS[2:]))
    for c in changes:
        table.rows.append(
            [
                escape(c.model),
                escape(c.runtime),
                str(c.batch_size),
                "—" if c.seq_len is None else str(c.seq_len),
                _rate(c.capacity_a),
                _rate(c.capacity_b),
                _ratio(c.capacity_a, c.capacity_b),
                format_seconds(c.p99_half_a),
                format_seconds(c.p99_half_b),
                _ratio(c.p99_half_a, c.p99_half_b),
                _rate(c.peak_a),
                _rate(c.peak_b),
                _ratio(c.peak_a, c.peak_b),
            ]  # fmt: skip
        )
    return table


def _rate(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f}"


def comparison_legend(comparison: RunComparison) -> list[str]:
    """What the columns and verdicts mean (plain text lines)."""
    limit = percent(comparison.threshold)
    return [
        "B/A: time of B ÷ time of A (>1: B is slower), 95% CI over both runs' rounds (needs 3 rounds a side); "
        f"p (Holm): Student-t over rounds, Holm-adjusted over the {sum(1 for c in comparison.cells if c.p_value is not None)} "
        "cells with one.",
        f"regression: p < {ALPHA:g} and B/A > 1 + {limit}; improvement: p < {ALPHA:g} and B/A < 1/(1 + {limit}); "
        "within threshold: significant but smaller; broken: ok in A, not ok in B (counts as a regression); "
        "fixed: the reverse.",
        *([SERVING_LEGEND] if comparison.serving else []),
    ]


def verdict_line(comparison: RunComparison) -> str:
    """The closing line: how many cells regressed or broke, and the exit status that follows."""
    regressions = [c for c in comparison.cells if c.verdict == "regression"]
    broken = [c for c in comparison.cells if c.verdict == "broken"]
    improved = sum(1 for c in comparison.cells if c.verdict == "improvement")
    common = sum(1 for c in comparison.cells if c.ratio is not None)
    untestable = sum(1 for c in comparison.cells if c.ratio is not None and c.p_value is None)
    text = (
        f"{len(regressions)} significant regressions beyond {percent(comparison.threshold)}, {len(broken)} cells broken, "
        f"{improved} improvements, over {common} cells both runs completed ok "
        f"({len(comparison.only_a)} only in A, {len(comparison.only_b)} only in B)"
    )
    if untestable:  # a gate on such runs could never fail on speed: say so
        text += f"; {untestable} of them without a verdict (fewer than 3 rounds on a side: run with --rounds 3 or more)"
    return plain(text) + ("; exit 1" if comparison.failed else "; exit 0")
