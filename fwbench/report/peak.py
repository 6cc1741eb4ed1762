"""Achieved GFLOP/s of stored cells, and their fraction of the machine's measured fp32 matmul peak.

The peak is what ``fwbench env --peak`` stores: a run of suite ``peak`` whose cells are the
``gemm`` model at ``batch = n`` in each framework's native runtime; the peak is its fastest ``ok``
cell. The same run's environment record keeps the memory bandwidth of the same cores (``memory_bandwidth``).
Everything here reads stored rows only (``flops`` per call and ``median_s`` per call).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from fwbench.details import as_dict
from fwbench.store import ResultRecord, Store

PEAK_SUITE = "peak"  # suite name of the runs `fwbench env --peak` stores
BANDWIDTH_KEY = "memory_bandwidth"  # where that run's environment record keeps the bandwidth it measured
GIGA = 1e9


@dataclass(frozen=True)
class Peak:
    """The machine's measured matmul peak: ``gflops`` (1e9 FLOP per second) by ``runtime`` in run ``run_id``."""

    gflops: float
    runtime: str
    run_id: int
    threads: int | None
    dtype: str
    device: str
    # the copy bandwidth of the same cores, measured by the same run (fwbench.measure.bandwidth); None: not measured
    bandwidth_bytes_per_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "gflops": self.gflops,
            "runtime": self.runtime,
            "run_id": self.run_id,
            "threads": self.threads,
            "dtype": self.dtype,
            "device": self.device,
        }


SecondsField = Literal["median_s", "ci_low_s", "ci_high_s", "mean_s", "min_s"]


def achieved_gflops(row: ResultRecord, seconds_key: SecondsField = "median_s") -> float | None:
    """``flops / <seconds_key> / 1e9`` (GFLOP/s) of an ``ok`` cell; None without FLOPs or a time."""
    flops, seconds = row.flops, getattr(row, seconds_key)
    if row.status != "ok" or not flops or seconds is None or seconds <= 0:
        return None
    return float(flops) / float(seconds) / GIGA


def peak_fraction(row: ResultRecord, peak: Peak | None) -> float | None:
    """The cell's achieved GFLOP/s over the peak's; None without a peak, a rate, or for another dtype,
    device or thread count than the peak was measured with (an fp32 CPU peak on 2 threads says nothing
    of a bf16, GPU or 1-thread cell)."""
    if peak is None or (row.dtype, row.device, row.threads) != (peak.dtype, peak.device, peak.threads):
        return None
    gflops = achieved_gflops(row)
    return None if gflops is None else gflops / peak.gflops


def best_cell(results: Sequence[ResultRecord]) -> ResultRecord | None:
    """The ``ok`` row with the highest achieved GFLOP/s, or None."""
    rated = [(gflops, row) for row in results if (gflops := achieved_gflops(row)) is not None]
    return max(rated, key=lambda pair: pair[0])[1] if rated else None


def latest_peak(store: Store) -> Peak | None:
    """The peak of the latest ``peak`` run that has an ``ok`` cell (a failed measurement does not hide an
    earlier one); None when the database holds none."""
    for run in reversed(store.runs()):
        if run.suite != PEAK_SUITE:
            continue
        best = best_cell(store.results([run.id]))
        if best is not None:
            gflops = achieved_gflops(best)
            assert gflops is not None
            bandwidth = as_dict(run.environment.get(BANDWIDTH_KEY)).get("bytes_per_s")
            return Peak(
                gflops, best.runtime, run.id, best.threads, best.dtype, best.device,
                float(bandwidth) if isinstance(bandwidth, int | float) and bandwidth > 0 else None,
            )  # fmt: skip
    return None
