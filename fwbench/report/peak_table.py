"""The table ``fwbench env --peak`` prints: GFLOP/s of the gemm cell in each native runtime."""

from __future__ import annotations

from collections.abc import Sequence

from rich.markup import escape
from rich.table import Table

from fwbench.models.gemm import GEMM
from fwbench.report.peak import achieved_gflops
from fwbench.store.records import ResultRecord
from fwbench.units import format_gflops, format_seconds

PEAK_COLUMNS = ("runtime", "status", "median", "GFLOP/s", "GFLOP/s 95% CI", "samples", "note")


def peak_table(results: Sequence[ResultRecord], threads: int) -> Table:
    """One row per runtime of a peak run: median seconds per call, GFLOP/s with its 95% CI (from the time's)."""
    flops = GEMM.forward_flops(GEMM.n, None)
    table = Table(
        title=f"fp32 matmul peak: gemm x ({GEMM.n}×{GEMM.n}) @ W ({GEMM.n}×{GEMM.n}), "
        f"{flops / 1e9:.1f} GFLOP per call, threads {threads}"
    )
    for column in PEAK_COLUMNS:
        table.add_column(column, justify="left" if column in ("runtime", "status", "note") else "right")
    for row in results:
        low, high = achieved_gflops(row, "ci_high_s"), achieved_gflops(row, "ci_low_s")
        table.add_row(
            row.runtime,
            row.status,
            format_seconds(row.median_s),
            format_gflops(achieved_gflops(row)),
            "—" if low is None or high is None else f"{format_gflops(low)}–{format_gflops(high)}",
            f"{row.n_samples}×{row.calls_per_sample}" if row.n_samples else "—",
            escape(row.reason or ""),
        )
    return table
