"""Hand-built stores for the report tests: cells with seeded synthetic samples, no worker runs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fwbench.measure.stats import summarize
from fwbench.spec import Case, Plan, Settings
from fwbench.store import Store


def timed(median_s: float, n: int = 30, noise: float = 0.01, seed: int = 0) -> list[float]:
    """``n`` seeded log-normal samples (seconds per call) around ``median_s``, relative spread ``noise``."""
    return list(median_s * np.random.default_rng(seed).lognormal(0.0, noise, n))


@dataclass
class Cell:
    """One stored cell: its case, status and samples (``reason`` and ``details`` as the worker stores them)."""

    case: Case
    samples: Sequence[float] = ()
    status: str = "ok"
    reason: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    fields: dict[str, Any] = field(default_factory=dict)


def add_run(
    store: Store, cells: Sequence[Cell], environment: dict[str, Any] | None = None, settings: Settings | None = None
) -> int:
    """Store a finished run of ``cells``; medians and CIs come from the samples as the manager computes them."""
    plan = Plan(tuple(c.case for c in cells), settings or Settings(threads=2))
    run_id = store.create_run(plan, "fwbench run (test)", environment or {}, "0")
    for cell in cells:
        fields: dict[str, Any] = {
            "status": cell.status,
            "reason": cell.reason,
            "threads": 2,
            "calls_per_sample": 4,
            "peak_memory_bytes": 300 * 2**20,
            **cell.fields,
        }
        if cell.samples:
            s = summarize(cell.samples)
            fields.update(
                median_s=s.median_s,
                ci_low_s=s.ci_low_s,
                ci_high_s=s.ci_high_s,
                mean_s=s.mean_s,
                stdev_s=s.stdev_s,
                min_s=s.min_s,
            )
        store.add_result(run_id, cell.case, fields, list(cell.samples), cell.details)
    store.finish_run(run_id)
    return run_id
