"""Where the time between two runtimes of one cell goes (``fwbench explain``): both cells' profiles split into the
same parts — each op category's self time, the time outside every op (the framework, Python, dispatch), minus the
time ops overlapped (counted twice by their categories) — whose differences add up to the difference of the two
profiled calls' wall times (a residual part where the profiler's events ran outside the worker's clock window);
largest first, each with its share of the difference, the matmul/conv category's
achieved rate on both sides (:mod:`fwbench.report.profile_rates`), and the kernel libraries each cell recorded
(:mod:`fwbench.report.kernels`). Reads stored profiles only; descriptive, as a profile is (a few calls of one
worker): a verdict on the speed-up comes from ``fwbench run``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.markup import escape
from rich.table import Table

from fwbench.profile.categories import CATEGORIES
from fwbench.profile.cells import ProfiledCell
from fwbench.profile.summary import NEGLIGIBLE_S
from fwbench.report.kernels import entry_summary, kernel_entries
from fwbench.report.peak import Peak
from fwbench.report.profile_rates import RATED_CATEGORY, CategoryRate, ModelFlops, category_rate
from fwbench.store import ProfileRecord
from fwbench.units import format_seconds

OUTSIDE_OPS = "outside every op (framework, Python, dispatch)"
OVERLAP = "ops overlapping in time (counted twice above)"
UNACCOUNTED = "unaccounted (ops recorded outside the worker's clock window)"
DISTORTED = 0.2  # a profiler overhead beyond ±20% is flagged: the profiled calls are unlike the timed ones


@dataclass(frozen=True)
class Part:
    """One part of a profiled call in runtime A and in runtime B, seconds per profiled call."""

    label: str
    a_s: float
    b_s: float

    @property
    def difference_s(self) -> float:
        """B − A: positive where B spends more."""
        return self.b_s - self.a_s


def parts(a: ProfiledCell, b: ProfiledCell) -> list[Part]:
    """The op categories' self time, the time outside every op and minus the overlap, in A and B, largest
    difference first (the overlap last); their differences sum to the difference of the wall times, as wall = busy +
    outside and busy = the categories' sum − overlap, unless the profiler recorded ops beyond the worker's clock
    window (busy > wall: outside is then 0, not negative): that remainder is the UNACCOUNTED part, last. Parts
    neither side has are left out."""
    found = [
        Part(category, a.summary.categories_s[category], b.summary.categories_s[category]) for category in CATEGORIES
    ]
    found.append(Part(OUTSIDE_OPS, a.summary.overhead_s, b.summary.overhead_s))
    found.append(Part(OVERLAP, -a.summary.overlap_s, -b.summary.overlap_s))
    found.append(Part(UNACCOUNTED, _unaccounted_s(a), _unaccounted_s(b)))
    # below a millionth of the longer call: nothing, or a residue of summing many op times in floating point
    negligible = max(NEGLIGIBLE_S, 1e-6 * max(a.summary.wall_s, b.summary.wall_s))
    found = [part for part in found if max(abs(part.a_s), abs(part.b_s)) >= negligible]
    last = {OVERLAP: 1, UNACCOUNTED: 2}
    found.sort(key=lambda part: (last.get(part.label, 0), -abs(part.difference_s)))
    return found


def _unaccounted_s(cell: ProfiledCell) -> float:
    """The wall time the parts do not hold: 0 unless the ops ran past the worker's window (then negative)."""
    summary = cell.summary
    held = sum(summary.categories_s.values()) - summary.overlap_s + summary.overhead_s
    return summary.wall_s - held


@dataclass(frozen=True)
class Explanation:
    """Two profiled runtimes of one cell (A first, as asked), the model's matmul and convolution FLOPs per call and
    the machine's comparable gemm peak (None: not known)."""

    title: str
    a: ProfileRecord
    b: ProfileRecord
    flops: ModelFlops | None
    peak: Peak | None

    @property
    def cells(self) -> tuple[ProfiledCell, ProfiledCell]:
        """A's and B's profiles (both profiled: explain refuses otherwise)."""
        assert self.a.cell is not None and self.b.cell is not None
        return self.a.cell, self.b.cell

    def rates(self) -> tuple[CategoryRate | None, CategoryRate | None]:
        """A's and B's matmul/conv rates (None where a side has none)."""
        a, b = self.cells
        return category_rate(a, self.flops, self.peak), category_rate(b, self.flops, self.peak)


def _signed(seconds: float) -> str:
    return ("+" if seconds > 0 else "−" if seconds < 0 else "") + format_seconds(abs(seconds))


def _share(part_s: float, total_s: float) -> str:
    """``59%``, ``−21%`` (a part that went the other way), ``0.4%``; ``—`` without a difference to share."""
    if abs(total_s) < NEGLIGIBLE_S:
        return "—"
    share = part_s / total_s
    return (f"{share:.0%}" if abs(share) >= 0.01 else f"{share:.1%}").replace("-", "−")


def headline(explanation: Explanation) -> str:
    """Which runtime is faster without the profiler, by how much, and the part that holds most of the difference."""
    a, b = explanation.cells
    ra, rb = explanation.a.runtime, explanation.b.runtime
    slow, fast, slow_s, fast_s = (ra, rb, a.unprofiled_median_s, b.unprofiled_median_s)
    if fast_s > slow_s:
        slow, fast, slow_s, fast_s = rb, ra, fast_s, slow_s
    text = (
        f"{fast} is {slow_s / fast_s:.2f}× as fast as {slow} here: {format_seconds(fast_s)} against "
        f"{format_seconds(slow_s)} a call (medians without the profiler, {a.summary.calls} calls each)"
    )
    found = parts(a, b)
    total = b.summary.wall_s - a.summary.wall_s
    if found and abs(total) >= NEGLIGIBLE_S:
        top = found[0]
        text += f". Under the profiler the calls differ by {format_seconds(abs(total))}"
        if abs(top.difference_s) <= abs(total):
            text += f"; the largest part, {top.label}, {_signed(top.difference_s)} ({_share(top.difference_s, total)} of it)"
        else:  # parts that go both ways: the largest alone is more than the whole difference
            text += "; its parts go both ways: " + ", ".join(
                f"{part.label} {_signed(part.difference_s)}" for part in found[:2]
            )
    return text + "."


def explain_rows(explanation: Explanation) -> tuple[list[str], list[list[str]]]:
    """Plain-text headers and rows: per part, A's and B's seconds per profiled call, B − A, its share of the wall
    difference and, on the matmul/conv row, both rates; then the wall times and the medians without the profiler."""
    a, b = explanation.cells
    ra, rb = explanation.a.runtime, explanation.b.runtime
    total = b.summary.wall_s - a.summary.wall_s
    rate_a, rate_b = explanation.rates()
    headers = ["per profiled call", ra, rb, f"{rb} − {ra}", "share of the difference", f"rate {ra}", f"rate {rb}"]
    rows = []
    for part in parts(a, b):
        share = _share(part.difference_s, total)
        rated = part.label == RATED_CATEGORY
        rows.append(
            [
                part.label,
                format_seconds(part.a_s) if part.a_s >= 0 else _signed(part.a_s),
                format_seconds(part.b_s) if part.b_s >= 0 else _signed(part.b_s),
                _signed(part.difference_s),
                share,
                rate_a.text() if rated and rate_a else "",
                rate_b.text() if rated and rate_b else "",
            ]
        )
    rows.append(["wall (profiled)", format_seconds(a.summary.wall_s), format_seconds(b.summary.wall_s),
                 _signed(total), "100%" if abs(total) >= NEGLIGIBLE_S else "—", "", ""])  # fmt: skip
    unprofiled = b.unprofiled_median_s - a.unprofiled_median_s
    rows.append(["median without profiler", format_seconds(a.unprofiled_median_s),
                 format_seconds(b.unprofiled_median_s), _signed(unprofiled), "", "", ""])  # fmt: skip
    rows.append(["profiler overhead", f"{a.profiler_overhead:+.0%}".replace("-", "−"),
                 f"{b.profiler_overhead:+.0%}".replace("-", "−"), "", "", "", ""])  # fmt: skip
    return headers, rows


def warning_lines(explanation: Explanation) -> list[str]:
    """What makes the split less telling, a line each: a runtime whose profiled calls ran more than DISTORTED slower
    (or faster) than its calls without the profiler; a profile not split by op; a profiled difference of the other
    sign than the difference without the profiler; time unaccounted for."""
    lines = []
    for record in (explanation.a, explanation.b):
        cell = record.cell
        if cell is None:
            continue
        if abs(cell.profiler_overhead) > DISTORTED:
            lines.append(
                f"warning: {record.runtime}'s profiled calls took {cell.profiler_overhead:+.0%} of its calls without "
                "the profiler (the profiler's own cost, or a noisy machine): the split describes other calls than "
                "the timed ones; run again, with more --calls, to see whether it holds"
            )
        if cell.attribution != "by op":
            lines.append(f"warning: {record.runtime}'s profile is not split by op ({cell.attribution})")
    a, b = explanation.cells
    profiled, unprofiled = b.summary.wall_s - a.summary.wall_s, b.unprofiled_median_s - a.unprofiled_median_s
    if profiled * unprofiled < 0:
        lines.append(
            "warning: under the profiler the other runtime was the faster one: the split explains a difference of "
            "the other sign than the timed calls'"
        )
    if any(part.label == UNACCOUNTED for part in parts(a, b)):
        lines.append(f"warning: the profiler recorded ops outside the worker's clock window ({UNACCOUNTED} row)")
    return lines


def explain_table(explanation: Explanation) -> Table:
    """:func:`explain_rows` as a rich table."""
    headers, rows = explain_rows(explanation)
    table = Table(title=escape(explanation.title), title_justify="left")
    table.add_column(headers[0])
    for header in headers[1:]:
        table.add_column(escape(header), justify="right")
    for index, row in enumerate(rows):
        if index == len(rows) - 3:
            table.add_section()
        table.add_row(*(escape(value) for value in row))
    return table


def kernels_text(entries: Sequence[dict[str, Any]]) -> str:
    """A cell's kernel entries on one line, or that it recorded none."""
    return " · ".join(entry_summary(entry) for entry in entries) if entries else "none recorded"


def kernel_lines(records: Sequence[ProfileRecord]) -> list[str]:
    """Per runtime, the kernel libraries its cell recorded, one entry after another (or that it recorded none)."""
    return [f"{record.runtime} kernels: {kernels_text(kernel_entries(record.details))}" for record in records]


@dataclass(frozen=True)
class Lever:
    """Another runtime of a compared one's framework, measured as an extra cell: its median call without the
    profiler (None: it failed), its profiled matmul/conv self time and rate (None: not profiled, e.g. an engine
    without a profiler in fwbench, timed as a plain cell instead), its kernel entries, and a note (how it failed,
    or why it was not profiled)."""

    runtime: str
    median_s: float | None
    matmul_s: float | None = None
    rate: CategoryRate | None = None
    kernels: tuple[dict[str, Any], ...] = ()
    note: str | None = None
    plain: bool = False  # timed as a plain cell (adaptive blocks), not by the profile's calls: another protocol


def lever_rows(base_median_s: float, levers: Sequence[Lever]) -> list[list[str]]:
    """Per lever: its median without the profiler, its speed-up over the base runtime's (``base_median_s``), its
    matmul/conv time and rate where profiled, its kernel libraries, and a note."""
    rows = []
    for lever in levers:
        listed = kernels_text(lever.kernels)
        rows.append(
            [
                lever.runtime,
                format_seconds(lever.median_s),
                (f"{base_median_s / lever.median_s:.2f}×" + (" (plain cell)" if lever.plain else ""))
                if lever.median_s
                else "—",
                format_seconds(lever.matmul_s),
                lever.rate.text() if lever.rate else "—",
                listed if lever.median_s is not None else "",
                lever.note or "",
            ]
        )
    return rows


LEVER_HEADERS = [
    "lever", "median without profiler", "speed-up", f"{RATED_CATEGORY} (profiled)", "rate", "kernels", "note",
]  # fmt: skip


def levers_table(base: str, base_median_s: float, levers: Sequence[Lever]) -> Table:
    """The levers of ``base``, measured: :func:`lever_rows` as a rich table."""
    table = Table(title=escape(f"levers for {base} (measured as extra cells)"), title_justify="left")
    left = {"lever", "kernels", "note"}
    for header in LEVER_HEADERS:
        table.add_column(escape(header), justify="left" if header in left else "right")
    for row in lever_rows(base_median_s, levers):
        table.add_row(*(escape(value) for value in row))
    return table
