"""Reduced precision against fp32 in the same runtime: for each bf16 or int8 cell with an fp32 cell of the same run,
machine, model, runtime, phase, shape and device, what the lower precision buys (fp32 time ÷ its time) and what it
costs (its error against the float64 reference beside fp32's). The two dtypes ran in different comparison groups,
so the ratio is unpaired: the ratio of the two cells' round-level estimates, with a Welch CI over rounds
(:func:`fwbench.speedups.row_ratio`; none below 3 rounds)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.markup import escape

from fwbench.report.flags import parity_by_pair, parity_key
from fwbench.speedups import KEY_FIELDS, RatioEstimate, cell_key, row_ratio, sample_median
from fwbench.store import ResultRecord
from fwbench.units import format_seconds

NOT_CHECKED = float("nan")  # an error column without a parity check (None is a failed one, as in parity_by_pair)
MATCH_FIELDS = ("runtime", *(name for name in KEY_FIELDS if name != "dtype"))  # the same cell in another dtype
HEADERS = [
    "model", "runtime", "phase", "batch", "seq", "dtype", "fp32 median", "median", "speed-up vs fp32 (95% CI)",
    "error", "fp32 error", "limit",
]  # fmt: skip
TITLE = "Reduced precision against fp32 (same runtime, same shape)"
RIGHT = frozenset({"batch", "seq", "fp32 median", "median", "error", "fp32 error", "limit"})
LEGEND = (
    "Reduced precision: speed-up = the runtime's fp32 time ÷ its time in the lower precision (> 1: faster), unpaired "
    "(the dtypes ran in different comparison groups), 95% CI over rounds (3 or more); error: the worst output's "
    "relative L2 error against the float64 reference at the model's parity shape, beside the same runtime's fp32 "
    "error; limit: the dtype's documented parity limit (int8: docs/runtimes.md)."
)


@dataclass(frozen=True)
class DtypeComparison:
    """A reduced-precision cell, its fp32 counterpart, the speed-up (fp32 / reduced) and both parity errors."""

    row: ResultRecord
    fp32: ResultRecord
    speedup: RatioEstimate | None
    error: float | None  # None: the check failed; NOT_CHECKED: no check
    fp32_error: float | None
    limit: float | None


def dtype_comparisons(results: Sequence[ResultRecord]) -> list[DtypeComparison]:
    """Every non-fp32 cell of ``results`` that has an fp32 counterpart, in stored order."""
    fp32 = {cell_key(row, MATCH_FIELDS): row for row in results if row.dtype == "fp32"}
    errors = parity_by_pair(results)
    limits = {parity_key(row): row.parity.tolerance_rel_l2 for row in results if row.parity is not None}
    out = []
    for row in results:
        base = fp32.get(cell_key(row, MATCH_FIELDS))
        if row.dtype == "fp32" or base is None or row.status == "skipped":  # a runtime without that dtype
            continue
        out.append(
            DtypeComparison(
                row,
                base,
                row_ratio(base, row),
                errors.get(parity_key(row), NOT_CHECKED),
                errors.get(parity_key(base), NOT_CHECKED),
                limits.get(parity_key(row)),
            )
        )
    return out


def median_text(row: ResultRecord, markup: bool) -> str:
    """A cell's median, or ``N/A <status>`` (red with rich ``markup``) when it has none."""
    median = sample_median(row)
    if median is not None:
        return format_seconds(median)
    return f"[red]N/A {escape(row.status)}[/]" if markup else f"N/A {row.status}"


def _speedup(estimate: RatioEstimate | None) -> str:
    if estimate is None:
        return "N/A"
    if estimate.ci_low is None or estimate.ci_high is None:
        return f"≈{estimate.ratio:.2f}×"
    return f"{estimate.ratio:.2f}× ({estimate.ci_low:.2f}–{estimate.ci_high:.2f})"


def _error(value: float | None) -> str:
    """A pair's worst error; ✗ for a failed check, — where none was made."""
    if value is NOT_CHECKED:
        return "—"
    return "✗" if value is None else f"{value:.1e}"


def dtype_cells(item: DtypeComparison, markup: bool = True) -> list[str]:
    """The table row of one comparison, in HEADERS order: rich markup (store strings escaped), or plain text."""
    row = item.row
    text = escape if markup else str
    return [
        text(row.model),
        text(row.runtime),
        text(row.phase),
        str(row.batch_size),
        "—" if row.seq_len is None else str(row.seq_len),
        text(row.dtype),
        median_text(item.fp32, markup),
        median_text(row, markup),
        _speedup(item.speedup),
        _error(item.error),
        _error(item.fp32_error),
        "—" if item.limit is None else f"{item.limit:.1e}",
    ]
