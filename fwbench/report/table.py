"""Report tables: one per model (rows grouped by shape, the baseline runtime first) with each cell's
median ± CI, speed-up over the baseline, GFLOP/s, memory, parity and flags; then the pair summary.

Tables are built once as :class:`TableData` (rich markup cells) and rendered for the terminal
(:func:`to_rich`) or as Markdown (:func:`to_markdown`). Columns whose value is the same in every row
(run, phase, dtype, device) move into the title.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from fwbench.report import dtypes, generation, kernels, scaling, serving
from fwbench.report.fit import HEADERS as FIT_HEADERS
from fwbench.report.fit import LEGEND as FIT_LEGEND
from fwbench.report.fit import RIGHT as FIT_RIGHT
from fwbench.report.fit import fit_table_cells, overhead_tables
from fwbench.report.fit import section_ends as fit_section_ends
from fwbench.report.flags import (
    NOISY_REL_CI,
    PARITY_FAILED,
    ParityKey,
    PrecisionKey,
    cell_flags,
    is_noisy,
    parity_by_pair,
    parity_mark,
    precision_flags,
    precision_key,
    samples_text,
)
from fwbench.report.peak import Peak, achieved_gflops, peak_fraction
from fwbench.report.phases import compared_by_speedup, compared_rows, section_rows, sections_of
from fwbench.report.throughput import THROUGHPUT_PHASES, format_rate, throughput
from fwbench.report.walltime import rounds_stop_line, wall_time, wall_time_line
from fwbench.speedups import (
    ALPHA,
    CellComparison,
    GroupedPair,
    PairSummary,
    cell_key,
    grouped_pairs,
    machine_labels,
    rel_half_width,
    resolve_baseline,
    runtimes_in,
)
from fwbench.store import ResultRecord
from fwbench.units import (
    decimals_for,
    format_bytes,
    format_fraction,
    format_gflops,
    format_seconds,
    format_seconds_noise,
    procs_text,
    short_id,
    significant_digits,
)

PIPE_WIDTH = 160  # rich would wrap at 80 columns when stdout is not a terminal
# Shown as a column where they vary, else in the table's title (the machine: a column only where it varies).
OPTIONAL_COLUMNS = (
    ("run_id", "run"), ("hardware_id", "machine"), ("phase", "phase"), ("dtype", "dtype"), ("device", "device"),
)  # fmt: skip


def make_console() -> Console:
    """A console for stdout, wide enough for the tables when output goes to a pipe or file."""
    return Console() if sys.stdout.isatty() else Console(width=PIPE_WIDTH)


def median_cell(row: ResultRecord) -> str:
    """``'21.34 µs ±0.3%'`` with the digits the CI supports (yellow when noisy); ``N/A oom`` for a non-ok cell."""
    if row.status != "ok":
        return f"[red]N/A {escape(row.status)}[/]"
    if row.median_s is None:
        return "—"
    text = format_seconds_noise(row.median_s, row.ci_low_s, row.ci_high_s)
    half = rel_half_width(row)
    if half is not None:
        text += f" ±{half:.1%}"
    return f"[yellow]{text}[/]" if is_noisy(row) else text


def _loader_cells(row: ResultRecord) -> list[str]:
    """A phase data row's loader figures: the peak PSS of its process and workers (the workers' share in
    parentheses) and the cores they kept busy while timed; dashes for other rows."""
    data = row.data
    if data is None:
        return ["—", "—"]
    pss = data.pss_peak_bytes
    total, workers = (None, None) if pss is None else (pss.total, pss.workers)
    memory = "—" if total is None else format_bytes(total) + (f" ({format_bytes(workers)})" if workers else "")
    busy = data.cpu_cores_busy
    return [memory, "—" if busy is None else f"{busy:.2f}"]


def _note(row: ResultRecord, precision: dict[PrecisionKey, str]) -> str:
    if row.status != "ok":
        return escape(row.reason or "")
    flags = cell_flags(row) + ([precision[precision_key(row)]] if precision_key(row) in precision else [])
    return ", ".join(f"[yellow]{escape(flag)}[/]" for flag in flags)


@dataclass
class TableData:
    """A table whose cells are rich markup (store strings already escaped), for any renderer."""

    title: str | None
    headers: list[str]
    right: frozenset[str] = frozenset()  # headers of right-justified columns
    rows: list[list[str]] = field(default_factory=list)
    section_ends: set[int] = field(default_factory=set)  # a rule is drawn after these row indices
    caption: str | None = None


RIGHT_COLUMNS = frozenset(
    {"workers", "PSS (workers)", "cores busy"}
    | {
        "run",
        "batch",
        "seq",
        "median ±95% CI",
        "GFLOP/s",
        "% peak",
        "samples/s",
        "tokens/s",
        "first call",
        "to first result",
        "peak RSS",
        "samples",
        "parity",
        "cells both ok",
        "faster",
        "slower",
        "no sig. diff.",
    }
)


def to_rich(data: TableData) -> Table:
    """The rich table of ``data``."""
    table = Table(title=data.title, caption=data.caption)
    for header in data.headers:
        table.add_column(escape(header), justify="right" if header in data.right else "left", overflow="fold")
    for index, row in enumerate(data.rows):
        table.add_row(*row, end_section=index in data.section_ends)
    return table


def plain(markup: str) -> str:
    """The text of rich markup, styles dropped and escapes undone."""
    return Text.from_markup(markup).plain


MARKDOWN_ESCAPES = str.maketrans(
    {
        "\\": "\\\\",
        "|": "\\|",
        "*": "\\*",
        "_": "\\_",
        "`": "\\`",
        "[": "\\[",
        "]": "\\]",
        "<": "&lt;",
        ">": "&gt;",
        "&": "&amp;",
        "\n": " ",
        "\r": " ",
    }
)


def markdown_text(text: str) -> str:
    """``text`` made literal in Markdown (a table cell included): emphasis, links, HTML and pipes escaped."""
    return text.translate(MARKDOWN_ESCAPES)


def to_markdown(data: TableData) -> str:
    """``data`` as a GitHub-flavoured Markdown table, the title as a heading and the caption below."""
    lines = []
    if data.title:
        lines += [f"### {markdown_text(plain(data.title))}", ""]
    lines.append("| " + " | ".join(markdown_text(h) for h in data.headers) + " |")
    lines.append("|" + "|".join("---:" if h in data.right else "---" for h in data.headers) + "|")
    lines += ["| " + " | ".join(markdown_text(plain(cell)) for cell in row) + " |" for row in data.rows]
    if data.caption:
        lines += ["", markdown_text(plain(data.caption))]
    return "\n".join(lines) + "\n"


def ratio_text(ratio: float, low: float | None, high: float | None) -> str:
    """``'1.99× 1.96–2.02'``: a speed-up and its CI with the digits the CI supports."""
    half = None if low is None or high is None else (high - low) / 2
    decimals = decimals_for(ratio, significant_digits(ratio, half))
    text = f"{ratio:.{decimals}f}×"
    return text if low is None or high is None else f"{text} {low:.{decimals}f}–{high:.{decimals}f}"


def speedup_cell(cell: CellComparison | None, is_baseline: bool) -> str:
    """The speed-up column: ``baseline``; green when significantly faster, red slower, ``≈`` (dim) when not
    significant; ``N/A`` when either side did not run ok; ``—`` when the shape has no baseline cell."""
    if is_baseline:
        return "[dim]baseline[/]"
    if cell is None:
        return "—"
    if cell.ratio is None:
        return "[dim]N/A[/]"
    text = ratio_text(cell.ratio, cell.ci_low, cell.ci_high)
    if not cell.significant:
        return f"[dim]≈{text}[/]"
    return f"[green]{text}[/]" if cell.ratio > 1 else f"[red]{text}[/]"


def _parity_cell(row: ResultRecord, parity: dict[ParityKey, float | None]) -> str:
    mark = parity_mark(row, parity)
    return f"[red]{mark}[/]" if mark == PARITY_FAILED else mark


def _shape_key(row: ResultRecord) -> tuple[Any, ...]:
    return (
        row.run_id,
        row.phase,
        row.dtype,
        row.device,
        row.batch_size,
        row.seq_len,
        row.workers,
        row.procs,
        row.scaling,
    )


def result_tables(
    results: Sequence[ResultRecord],
    title: str | None,
    peak: Peak | None,
    baseline: str | None,
    pairs: Sequence[GroupedPair],
) -> list[TableData]:
    """One table per model (first-appearance order), rows grouped by shape with a rule between shapes,
    ``baseline`` first within a shape, then the other runtimes in first-appearance order."""
    varying = [(key, label) for key, label in OPTIONAL_COLUMNS if len({getattr(r, key) for r in results}) > 1]
    constant = ", ".join(
        f"{label} {getattr(results[0], key)}"
        for key, label in OPTIONAL_COLUMNS
        if (key, label) not in varying and key != "hardware_id"  # one machine: the legend names it
    )
    cells = {(*cell_key(c), c.runtime): c for pair in pairs for c in pair.cells}
    # each group's baseline (a group without the report's takes its own: grouped_pairs' fallback)
    group_baselines = {(p.run_id, p.hardware_id, p.phase, p.dtype, p.device): p.baseline for p in pairs}
    groups = {key: i for i, key in enumerate(dict.fromkeys(_shape_key(r)[:4] for r in results))}
    parity = parity_by_pair(results)
    precision = precision_flags(results)
    rate_headers = throughput_headers(results)
    first_result = any(r.exported for r in results)  # deployment runtimes: export and load before the first call
    workers = any(r.workers is not None for r in results)  # phase data: the loaders' worker count
    procs = any(r.procs is not None for r in results)  # distributed cells: processes and scaling
    headers = [label for _, label in varying] + [
        "batch",
        "seq",
        *(["workers"] if workers else []),
        *(["procs"] if procs else []),
        "runtime",
        "median ±95% CI",
        *([f"vs {baseline}"] if baseline else []),
        "GFLOP/s",
        *(["% peak"] if peak else []),
        *rate_headers,
        "first call",
        *(["to first result"] if first_result else []),
        "peak RSS",
        *(["PSS (workers)", "cores busy"] if workers else []),
        "samples",
        "parity",
        "note",
    ]
    tables = []
    for model in dict.fromkeys(r.model for r in results):
        model_rows = [r for r in results if r.model == model]
        first = model_rows[0]
        table_baseline = group_baselines.get(
            (first.run_id, first.hardware_id, first.phase, first.dtype, first.device), baseline
        )
        order = {name: i for i, name in enumerate(sorted(runtimes_in(model_rows), key=lambda r: r != table_baseline))}
        table_headers = [f"vs {table_baseline}" if h == f"vs {baseline}" else h for h in headers]
        rows = sorted(
            model_rows,
            key=lambda r: (
                groups[_shape_key(r)[:4]],
                r.batch_size,
                -1 if r.seq_len is None else r.seq_len,
                -1 if r.workers is None else r.workers,
                r.scaling or "",
                -1 if r.procs is None else r.procs,
                order[r.runtime],
            ),
        )
        heading = f"{title}: {model}" if title else model
        data = TableData(
            f"{escape(heading)} ({escape(constant)})" if constant else escape(heading), table_headers, RIGHT_COLUMNS
        )
        for index, row in enumerate(rows):
            key = (*cell_key(row), row.runtime)
            data.rows.append(
                [
                    *(
                        escape(short_id(row.hardware_id) if k == "hardware_id" else str(getattr(row, k)))
                        for k, _ in varying
                    ),
                    str(row.batch_size),
                    "—" if row.seq_len is None else str(row.seq_len),
                    *(["—" if row.workers is None else str(row.workers)] if workers else []),
                    *([procs_text(row.procs, row.scaling, row.nodes)] if procs else []),
                    escape(row.runtime),
                    median_cell(row),
                    *(
                        [speedup_cell(cells.get(key), row.runtime == table_baseline and compared_by_speedup(row.phase))]
                        if baseline
                        else []
                    ),
                    format_gflops(achieved_gflops(row)),
                    *([format_fraction(peak_fraction(row, peak))] if peak else []),
                    *map(format_rate, throughput(row)[: len(rate_headers)]),
                    format_seconds(row.first_call_s),
                    *([format_seconds(row.time_to_first_result_s)] if first_result else []),
                    format_bytes(row.peak_memory_bytes),
                    *(_loader_cells(row) if workers else []),
                    samples_text(row),
                    _parity_cell(row, parity),
                    _note(row, precision),
                ]
            )
            if index + 1 < len(rows) and _shape_key(rows[index + 1]) != _shape_key(row):
                data.section_ends.add(index)
        tables.append(data)
    return tables


def throughput_headers(results: Sequence[ResultRecord]) -> list[str]:
    """``samples/s`` when a row is a training cell, ``tokens/s`` too when one of those has a sequence axis;
    none for inference-only results (their layout is unchanged)."""
    rows = [r for r in results if r.phase in THROUGHPUT_PHASES]
    if not rows:
        return []
    return ["samples/s", *(["tokens/s"] if any(r.seq_len is not None for r in rows) else [])]


def _counts_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{status} {n}" for status, n in counts.items()) or "—"


def summary_cell(summary: PairSummary) -> str:
    """``'1.41× (1.05–1.89)'``, the geometric-mean speed-up and its CI over cells; ``N/A`` without a common cell."""
    if summary.geomean_ratio is None:
        return "[dim]N/A[/]"
    text = ratio_text(summary.geomean_ratio, summary.ci_low, summary.ci_high)
    ratio, _, interval = text.partition(" ")
    return f"{ratio} ({interval})" if interval else ratio


def summary_table(pairs: Sequence[GroupedPair], baseline: str) -> TableData:
    """One row per runtime (and group, where run, phase, dtype or device vary) against ``baseline``."""
    fields = (("run_id", "run"), ("phase", "phase"), ("dtype", "dtype"), ("device", "device"))
    varying = [(key, label) for key, label in fields if len({getattr(p, key) for p in pairs}) > 1]
    headers = [label for _, label in varying] + [
        "runtime",
        "cells both ok",
        "geomean speed-up (95% CI)",
        "faster",
        "slower",
        "no sig. diff.",
        f"{baseline} not ok",
        "runtime not ok",
    ]
    data = TableData(
        escape(f"speed-up over {baseline}: geometric mean of per-cell ratios over the cells both ran ok"),
        headers,
        RIGHT_COLUMNS,
    )
    for pair in pairs:
        s = pair.summary
        data.rows.append(
            [
                *(escape(str(getattr(pair, key))) for key, _ in varying),
                escape(s.runtime),
                str(s.n_common),
                summary_cell(s),
                str(s.n_faster),
                str(s.n_slower),
                str(s.n_common - s.n_faster - s.n_slower),
                escape(_counts_text(s.failed_baseline)),
                escape(_counts_text(s.failed_runtime)),
            ]
        )
    return data


def legend(baseline: str | None, peak: Peak | None, show_rates: bool = False, data: bool = False) -> list[str]:
    """What the columns mean (plain text lines), printed once under the tables (``data``: phase data rows are
    among them)."""
    lines = []
    if baseline:
        lines.append(
            f"vs {baseline}: its time ÷ the runtime's (>1: the runtime is faster); interleaved cells: from paired "
            "blocks that ran back to back. 95% CI over rounds (fresh workers), so it includes process-to-process "
            "variation, its variance moderated over the run's cells (empirical Bayes with a trend in the call's "
            f"time, as limma-trend; docs/reports.md); ≈: no significant difference (Holm-adjusted over the pair's cells, p ≥ {ALPHA:g}) or fewer "
            "than 3 rounds (no CI); N/A: a side did not run ok."
        )
    lines.append(
        "median: geometric mean of the rounds' medians, digits as many as its CI supports; noisy: CI half-width > "
        f"{NOISY_REL_CI:.0%} of the median; contended: other processes used > 10% of a core, or steal > 2%, while it "
        "was timed. N/A <status>: the cell did not run ok (note: why)."
    )
    lines.append(
        "parity: worst relative L2 error against the float64 reference, checked once per model × runtime "
        "in a run (✗: failed)."
    )
    if show_rates:
        lines.append(
            "samples/s, tokens/s (training cells): batch size (× sequence length) over the median step time (procs: a "
            "cell of N processes counts its global batch, N × the batch in weak scaling); GFLOP/s counts forward + "
            "backward (3 × the forward FLOPs); first call: the first optimizer step, compilation included."
        )
    if data:
        lines.append(
            "phase data (input pipelines; model: the dataset): the median is seconds per batch out of the loader, "
            "samples/s images per second; workers: the loader's worker processes (tensorflow:data: parallel map "
            "calls, threads; 0: AUTOTUNE); first call: the time to the first "
            "batch, worker start-up included; peak RSS: the loader's own process; PSS (workers): the peak "
            "proportional set size of the process and its worker processes (the workers' share), shared pages "
            "counted once; cores busy: their CPU seconds per second while timed."
        )
    return lines


def evidence_line(pairs: Sequence[GroupedPair]) -> str | None:
    """How many rounds and block pairs stand behind the speed-ups (their ranges over the cells with a ratio)."""
    cells = [cell for pair in pairs for cell in pair.cells if cell.ratio is not None]
    if not cells:
        return None

    def span(values: list[int]) -> str:
        return str(values[0]) if min(values) == max(values) else f"{min(values)}–{max(values)}"

    rounds = sorted(cell.rounds or 1 for cell in cells)
    paired = sorted(cell.pairs for cell in cells if cell.pairs is not None)
    text = f"speed-ups rest on {span(rounds)} round{'' if rounds == [1] * len(rounds) else 's'} per cell"
    if paired:
        text += f"; {len(paired)} of {len(cells)} from paired blocks, {span(paired)} pairs per cell"
    if len(paired) < len(cells):
        text += f"; {len(cells) - len(paired)} unpaired (not measured together)"
    moderated = sorted(round(cell.dof) for cell in cells if cell.dof is not None and cell.moderated)
    if moderated:
        text += (
            f"; {len(moderated)} of {len(cells)} CIs with variances moderated over the run, on {span(moderated)} "
            "degrees of freedom"
        )
    return text + "."


def serving_tables(rows: Sequence[ResultRecord], peak: Peak | None = None) -> tuple[list[TableData], str]:
    """Phase serving's table (load points, capacity, the floor) and its legend."""
    served = serving.serving_rows(rows)
    cells = [serving.serving_cells(item) for item in served]
    return ([TableData(serving.TITLE, list(serving.HEADERS), serving.RIGHT, cells)] if served else []), serving.LEGEND


def generation_tables(rows: Sequence[ResultRecord], peak: Peak | None = None) -> tuple[list[TableData], str]:
    """Phase generate's table (prefill, decode, tokens per second, their shares of ``peak``'s FLOPs and bandwidth,
    compiles, the token check) and its legend."""
    items = generation.generation_rows(rows, peak)
    cells = [generation.generation_cells(item) for item in items]
    return ([TableData(generation.TITLE, list(generation.HEADERS), generation.RIGHT, cells)] if items else []), (
        generation.LEGEND
    )


def fit_tables(rows: Sequence[ResultRecord], peak: Peak | None = None) -> tuple[list[TableData], str]:
    """Phase fit's tables (high-level APIs against the manual loops, one per run and model) and their legend."""
    return [
        TableData(escape(table["title"]), list(FIT_HEADERS), FIT_RIGHT, fit_table_cells(table), fit_section_ends(table))
        for table in overhead_tables(rows)
    ], FIT_LEGEND


# A phase's own tables, by the section name the phase gives them (fwbench.report.phases): its rows and the machine's
# measured peak → (tables, legend).
PHASE_TABLES: dict[str, Callable[[Sequence[ResultRecord], Peak | None], tuple[list[TableData], str]]] = {
    "serving": serving_tables,
    "fit": fit_tables,
    "generate": generation_tables,
}


def _extra_tables(results: Sequence[ResultRecord], peak: Peak | None) -> list[tuple[list[TableData], str]]:
    """The tables after the per-model ones, each with its legend line: bf16 / int8 cells beside the same runtime's
    fp32 ones, data-parallel cells beside their 1-process cells, then each phase's own tables (serving, fit), given
    that phase's rows, then the kernel libraries the cells recorded."""
    reduced = [dtypes.dtype_cells(c) for c in dtypes.dtype_comparisons(results)]
    scaled = [scaling.scaling_cells(c) for c in scaling.scaling_rows(results)]
    libraries = [[escape(value) for value in row] for row in kernels.kernel_rows(results)]
    return [
        ([TableData(dtypes.TITLE, list(dtypes.HEADERS), dtypes.RIGHT, reduced)] if reduced else [], dtypes.LEGEND),
        ([TableData(scaling.TITLE, list(scaling.HEADERS), scaling.RIGHT, scaled)] if scaled else [], scaling.LEGEND),
        *(
            PHASE_TABLES[name](section_rows(results, name), peak)
            for name in sections_of(results)
            if name in PHASE_TABLES
        ),
        (
            [TableData(kernels.TITLE, list(kernels.HEADERS), kernels.RIGHT, libraries)] if libraries else [],
            kernels.LEGEND,
        ),
    ]


def report_tables(
    results: Sequence[ResultRecord], title: str | None = None, peak: Peak | None = None, baseline: str | None = None
) -> tuple[list[TableData], list[str]]:
    """Every table of a report (one per model, then the pair summary when the baseline and another runtime
    share a group) and the legend lines. ``baseline`` as :func:`resolve_baseline` (ValueError when absent)."""
    if not results:
        return [], []
    compared = compared_rows(results)  # the phases whose runtimes are compared by their time per call
    chosen = resolve_baseline(compared, baseline) if compared else None
    # not asked for: a group without the chosen baseline (phase data's loaders beside fit rows) takes its own
    pairs = grouped_pairs(compared, chosen, fallback=baseline is None) if chosen else []
    shown = chosen if pairs else None  # no other runtime to compare: no speed-up column
    tables = result_tables(results, title, peak, shown, pairs)
    if peak:
        tables[-1].caption = (
            f"% peak: of {format_gflops(peak.gflops)} GFLOP/s, the {peak.dtype} {peak.device} "
            f"matmul peak ({peak.runtime}, threads {peak.threads}, run {peak.run_id}: "
            "fwbench env --peak)"
        )
    if pairs and shown:
        for group_baseline in dict.fromkeys(pair.baseline for pair in pairs):
            tables.append(summary_table([p for p in pairs if p.baseline == group_baseline], group_baseline))
    phases = {r.phase for r in results}
    lines = legend(shown, peak, "training" in phases, "data" in phases)
    machines = machine_labels(results)
    if len(machines) > 1:  # results of several machines: each is compared with itself only
        lines.extend(
            f"machine {short_id(key)}: {label}; speed-ups pair cells of this machine only"
            for key, label in machines.items()
        )
    lines[1:1] = [evidence] if (evidence := evidence_line(pairs)) else []
    for extra, legend_line in _extra_tables(results, peak):
        tables += extra
        if extra:
            lines.append(legend_line)
    lines += [line for line in (wall_time_line(wall_time(results)), rounds_stop_line(results)) if line]
    return tables, lines


def print_results(
    results: Sequence[ResultRecord],
    console: Console,
    title: str | None = None,
    peak: Peak | None = None,
    baseline: str | None = None,
) -> None:
    """Print :func:`report_tables` on ``console``."""
    if not results:
        console.print("no results")
        return
    tables, lines = report_tables(results, title, peak, baseline)
    for data in tables:
        console.print(to_rich(data))
    for line in lines:
        console.print(Text(line, style="dim"))


def markdown_report(
    results: Sequence[ResultRecord], title: str | None = None, peak: Peak | None = None, baseline: str | None = None
) -> str:
    """:func:`report_tables` as Markdown: a heading and a table per model, the summary, the legend."""
    if not results:
        return "no results\n"
    tables, lines = report_tables(results, title, peak, baseline)
    return "\n".join([*(to_markdown(data) for data in tables), *(f"- {markdown_text(line)}" for line in lines)]) + "\n"
