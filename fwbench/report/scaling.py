"""Scaling of data-parallel training: each distributed cell of N > 1 processes against the 1-process cell of the
same run, machine, model, runtime, shape and scaling (measured interleaved with it: one comparison group).

Scaling efficiency = throughput(N) / (N × throughput(1)): 1 is perfect, 1/N means N processes are no faster than
one. Throughput counts the global batch, so weak scaling (each process keeps its batch) gives t₁ / t_N and strong
scaling (the global batch split) t₁ / (N · t_N); phase fit's call is an epoch of the whole dataset whatever the
batch, so its efficiency is t₁ / (N · t_N) and its samples/s the dataset's samples over the epoch; the 95% CI is the paired speed-up's t₁ / t_N
(:func:`fwbench.speedups.row_ratio`, over rounds), scaled the same way. Communication's share is the median of
a bare all-reduce of the trained parameters' size (float32, through the runtime's own collectives; stored by each
cell after its steps) over the median step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.markup import escape

from fwbench.report.dtypes import median_text
from fwbench.report.throughput import format_rate, rates
from fwbench.speedups import KEY_FIELDS, RatioEstimate, cell_key, row_ratio, sample_median
from fwbench.store import ResultRecord
from fwbench.units import format_seconds

MATCH_FIELDS = ("runtime", *(name for name in KEY_FIELDS if name != "procs"))  # the same cell in 1 process
HEADERS = [
    "model", "runtime", "batch", "seq", "scaling", "procs", "global batch", "1-process step", "step", "samples/s",
    "efficiency (95% CI)", "all-reduce", "all-reduce share",
]  # fmt: skip
TITLE = "Data-parallel scaling (against the 1-process cell measured interleaved with it)"
RIGHT = frozenset({"batch", "seq", "procs", "global batch", "1-process step", "step", "samples/s", "all-reduce"})
LEGEND = (
    "Scaling: efficiency = samples/s of N processes ÷ (N × samples/s of 1 process) of the same runtime, model, shape "
    "and scaling (weak: the batch is each process's, the global batch N × it; strong: the batch is the global one, "
    "split; phase fit: a call is an epoch of the whole dataset, so efficiency is t₁ ÷ (N × t_N) either way), 95% CI "
    "over rounds of the paired step-time ratio; all-reduce: the median of a bare all-reduce of the trained parameters "
    "(float32) across the N processes, its share the fraction of the median step it would take."
)


@dataclass(frozen=True)
class ScalingRow:
    """A distributed cell of N > 1 processes, its 1-process counterpart and the scaling figures."""

    row: ResultRecord
    single: ResultRecord
    speedup: RatioEstimate | None  # t₁ / t_N, paired where both were interleaved
    efficiency: tuple[float, float | None, float | None] | None  # value, CI low, CI high
    allreduce_s: float | None


def scaling_rows(results: Sequence[ResultRecord]) -> list[ScalingRow]:
    """Every distributed cell of more than one process that has a 1-process counterpart, in stored order."""
    singles = {cell_key(row, MATCH_FIELDS): row for row in results if row.procs == 1}
    out = []
    for row in results:
        single = singles.get(cell_key(row, MATCH_FIELDS))
        if row.procs is None or row.procs < 2 or single is None or row.status == "skipped":
            continue
        speedup = row_ratio(single, row)
        factor = 1.0 if row.scaling == "weak" and row.phase != "fit" else 1.0 / row.procs
        efficiency = None
        if speedup is not None:
            low, high = speedup.ci_low, speedup.ci_high
            efficiency = (
                speedup.ratio * factor,
                None if low is None else low * factor,
                None if high is None else high * factor,
            )
        allreduce = None if row.distributed is None else row.distributed.allreduce_median_s
        out.append(ScalingRow(row, single, speedup, efficiency, allreduce))
    return out


def _samples_per_s(row: ResultRecord, median: float | None) -> float | None:
    """Samples per second at ``median`` seconds per call: the global batch per step, or (phase fit) the dataset's
    samples per epoch."""
    if row.phase == "fit":
        samples = None if row.fit is None else row.fit.samples
        return None if samples is None or not median else samples / median
    return rates(row, median)[0]


def _efficiency(value: tuple[float, float | None, float | None] | None) -> str:
    if value is None:
        return "N/A"
    ratio, low, high = value
    if low is None or high is None:
        return f"≈{ratio:.2f}"
    return f"{ratio:.2f} ({low:.2f}–{high:.2f})"


def scaling_cells(item: ScalingRow, markup: bool = True) -> list[str]:
    """The table row of one distributed cell, in HEADERS order: rich markup (store strings escaped), or plain."""
    row = item.row
    text = escape if markup else str
    median = sample_median(row)
    share = None if item.allreduce_s is None or not median else item.allreduce_s / median
    return [
        text(row.model),
        text(row.runtime),
        str(row.batch_size),
        "—" if row.seq_len is None else str(row.seq_len),
        text(row.scaling or ""),
        str(row.procs) + (f"/{row.nodes} nodes" if row.nodes > 1 else ""),
        str(row.global_batch),
        median_text(item.single, markup),
        median_text(row, markup),
        format_rate(_samples_per_s(row, median)),
        _efficiency(item.efficiency),
        format_seconds(item.allreduce_s) if item.allreduce_s is not None else "—",
        "—" if share is None else f"{100 * share:.0f}%",
    ]
