"""Profiles side by side: per model × shape, one table with the runtimes as columns and the op categories as rows
(ms per profiled call and % of its wall time), the busy / overlap / overhead lines and the profiler's own
overhead; then each runtime's top ops and the op names no category table knows."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from rich.markup import escape
from rich.table import Table

from fwbench.profile.categories import CATEGORIES
from fwbench.profile.cells import ProfiledCell
from fwbench.profile.summary import NEGLIGIBLE_S
from fwbench.report.peak import Peak
from fwbench.report.profile_rates import (
    ModelFlops,
    category_rate,
    comparable_peak,
    matmul_flops,
    rate_legend,
    unrated_reason,
)
from fwbench.store import ProfileRecord
from fwbench.units import format_seconds

TOP_OPS = 10


@dataclass(frozen=True)
class ProfileGroup:
    """The cells profiled at one model, phase, shape and dtype: runtime → its profile, or why it has none; the model's
    matmul and convolution FLOPs per call (None: not an inference profile) and the machine's gemm peak measured for
    this dtype and device (None: none stored)."""

    title: str
    cells: Mapping[str, ProfiledCell | str]
    flops: ModelFlops | None = None
    peak: Peak | None = None


def group_title(record: ProfileRecord) -> str:
    """``bert-base inference fp32 cpu, batch 1, seq 128``: what the cells of one profile table share."""
    shape = f"batch {record.batch_size}" + (f", seq {record.seq_len}" if record.seq_len is not None else "")
    return f"{record.model} {record.phase} {record.dtype} {record.device}, {shape}"


def profile_groups(
    records: Sequence[ProfileRecord], peak: Peak | None = None, threads: int | None = None
) -> list[ProfileGroup]:
    """Stored profiled cells grouped by model, phase, dtype, device and shape, runtimes in stored order; a cell
    that did not end ``ok`` shows its status and reason. ``peak``: the machine's measured gemm peak, kept for the
    groups of its dtype and device (and ``threads``, where known)."""
    groups: dict[str, dict[str, ProfiledCell | str]] = {}
    firsts: dict[str, ProfileRecord] = {}
    for record in records:
        cells = groups.setdefault(group_title(record), {})
        firsts.setdefault(group_title(record), record)
        cells[record.runtime] = record.cell if record.cell is not None else f"{record.status}: {record.reason}"
    out = []
    for title, cells in groups.items():
        first = firsts[title]
        flops = matmul_flops(first.model, first.phase, first.batch_size, first.seq_len)
        out.append(ProfileGroup(title, cells, flops, comparable_peak(peak, first.dtype, first.device, threads)))
    return out


def _share(seconds: float, wall_s: float) -> str:
    """``530 µs (26%)``: seconds and their share of the wall time; ``—`` for none."""
    if seconds < NEGLIGIBLE_S:
        return "—"
    return f"{format_seconds(seconds)} ({100 * seconds / wall_s:.0f}%)" if wall_s > 0 else format_seconds(seconds)


RATE_LABEL = "matmul/conv rate"


def _rate(cell: ProfiledCell, group: ProfileGroup) -> str:
    """The cell's matmul/conv GFLOP/s and share of the peak; ``—`` where it has none."""
    rate = category_rate(cell, group.flops, group.peak)
    return rate.text() if rate is not None else f"— ({unrated_reason(cell) or 'no matmul time'})"


CATEGORY_SECTION_ENDS = (len(CATEGORIES), len(CATEGORIES) + 4)  # rows after which a table section ends
TOP_OP_HEADERS = ("op", "category", "calls", "self")


def category_rows(group: ProfileGroup) -> tuple[list[str], list[list[str]]]:
    """Plain-text headers and rows of the category table: per category, the self time per profiled call and its
    share of the call's wall time; then busy time, overlap, overhead, wall time; then the median without the
    profiler, the profiler overhead and how the time could be split; for an inference profile, the matmul/conv
    category's achieved rate (:mod:`fwbench.report.profile_rates`). A runtime without a profile shows its
    status and reason in the first row."""
    headers = ["per profiled call", *group.cells]
    lines: list[tuple[str, Callable[[ProfiledCell], str]]] = [
        *(
            (category, lambda c, k=category: _share(c.summary.categories_s[k], c.summary.wall_s))
            for category in CATEGORIES
        ),
        ("busy (union of ops)", lambda c: _share(c.summary.busy_s, c.summary.wall_s)),
        ("ops overlapping in time", lambda c: _share(c.summary.overlap_s, 0.0)),
        ("overhead (wall − busy)", lambda c: _share(c.summary.overhead_s, c.summary.wall_s)),
        ("wall", lambda c: format_seconds(c.summary.wall_s)),
        ("median without profiler", lambda c: format_seconds(c.unprofiled_median_s)),
        ("profiler overhead", lambda c: f"{100 * c.profiler_overhead:+.0f}%"),
        ("split by", lambda c: c.attribution),
    ]
    if group.flops:
        lines.append((RATE_LABEL, lambda c: _rate(c, group)))
    rows = [
        [
            label,
            *(
                value(cell) if isinstance(cell, ProfiledCell) else cell if index == 0 else ""
                for cell in group.cells.values()
            ),
        ]
        for index, (label, value) in enumerate(lines)
    ]
    return headers, rows


def top_op_rows(cell: ProfiledCell, n: int = TOP_OPS) -> list[list[str]]:
    """The ``n`` ops with the most self time: name, category, calls and self time per profiled call."""
    return [
        [op.name, op.category, f"{op.calls_per_call:g}", _share(op.self_s_per_call, cell.summary.wall_s)]
        for op in cell.summary.top(n)
    ]


def category_table(group: ProfileGroup) -> Table:
    """:func:`category_rows` as a rich table (a runtime's failure in red)."""
    headers, rows = category_rows(group)
    table = Table(title=escape(group.title), title_justify="left")
    table.add_column(headers[0])
    for header in headers[1:]:
        table.add_column(escape(header), justify="right")
    failed = [not isinstance(cell, ProfiledCell) for cell in group.cells.values()]
    for index, row in enumerate(rows):
        if index in CATEGORY_SECTION_ENDS:
            table.add_section()
        table.add_row(
            row[0], *(f"[red]{escape(v)}[/]" if bad else escape(v) for v, bad in zip(row[1:], failed, strict=True))
        )
    return table


def top_ops_table(runtime: str, cell: ProfiledCell, n: int = TOP_OPS) -> Table:
    """:func:`top_op_rows` as a rich table."""
    table = Table(title=f"{escape(runtime)}: top {n} ops by self time", title_justify="left")
    for header in TOP_OP_HEADERS:
        table.add_column(header, justify="left" if header in ("op", "category") else "right")
    for row in top_op_rows(cell, n):
        table.add_row(*(escape(value) for value in row))
    return table


def uncategorized_lines(group: ProfileGroup) -> list[str]:
    """One line per runtime whose ops fell into ``other``: the names, so the category tables can be improved."""
    return [
        f"{runtime}: in 'other': {', '.join(cell.summary.uncategorized)}"
        for runtime, cell in group.cells.items()
        if isinstance(cell, ProfiledCell) and cell.summary.uncategorized
    ]


def profile_tables(groups: Sequence[ProfileGroup]) -> list[Table | str]:
    """Everything ``fwbench profile`` prints, in order: per group its category table, each runtime's top ops, the
    unknown op names, and where the raw traces are."""
    out: list[Table | str] = []
    for group in groups:
        out.append(category_table(group))
        for runtime, cell in group.cells.items():
            if isinstance(cell, ProfiledCell) and cell.summary.ops:
                out.append(top_ops_table(runtime, cell))
        out.extend(escape(line) for line in uncategorized_lines(group))
        if group.flops:
            out.append(escape(rate_legend(group.flops, group.peak)))
        out.extend(
            f"{escape(runtime)}: trace {escape(cell.trace)} ({escape(cell.profiler)})"
            for runtime, cell in group.cells.items()
            if isinstance(cell, ProfiledCell)
        )
    return out
