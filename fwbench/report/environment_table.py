"""The tables ``fwbench env`` prints: the environment record stored with every run, key by key; with ``--noise``
the probe's run-to-run variation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.table import Table

from fwbench.measure.noise import NoiseTotals, contention, other_cpu_cores, steal_fraction
from fwbench.measure.probe import ProbeSpread
from fwbench.units import format_seconds


def environment_table(record: Mapping[str, Any]) -> Table:
    """One row per key of ``record``; None shows as —."""
    table = Table(title="environment (stored with every run)")
    table.add_column("key")
    table.add_column("value")
    for key, value in record.items():
        table.add_row(key, "—" if value is None else str(value))
    return table


def noise_table(spreads: Sequence[ProbeSpread], totals: NoiseTotals, rounds: int) -> Table:
    """``fwbench env --noise``: each probe's spread within and between processes and the rounds it calls for."""
    other, steal = other_cpu_cores(totals), steal_fraction(totals)
    caption = (
        f"{rounds} fresh processes. Machine while probing: other processes {'—' if other is None else f'{other:.1%}'} "
        f"of a core, steal {'—' if steal is None else f'{steal:.1%}'}"
        f"{' (contended: ' + '; '.join(contention(totals)) + ')' if contention(totals) else ''}. "
        "Between processes is what a CI over one process misses; fwbench run --rounds R covers it."
    )
    table = Table(title="fwbench env --noise: run-to-run variation", caption=caption)
    for header in (
        "probe",
        "median",
        "within a process (CV)",
        "between processes (CV)",
        "±95% CI now",
        "rounds for ±2%",
    ):
        table.add_column(header, justify="left" if header == "probe" else "right")
    for spread in spreads:
        table.add_row(
            spread.name,
            format_seconds(spread.median_s),
            f"{spread.within_cv:.1%}",
            f"{spread.between_cv:.1%}",
            "—" if spread.rel_half_width is None else f"±{spread.rel_half_width:.1%}",
            str(spread.recommended_rounds),
        )
    return table
