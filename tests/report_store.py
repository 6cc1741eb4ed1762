"""Hand-built stores for the report tests: cells with seeded synthetic samples, no worker runs.

A cell's samples are stored as the scheduler stores an interleaved cell: ``rounds`` rounds (3 by default, the
fewest that give a CI) of blocks, block k of every round in cycle k of that round, so the cells of one shape in
one run pair block by block; ``rounds=0`` stores them as a row from before rounds (no blocks, no group)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fwbench.measure.rounds import Block, time_estimate
from fwbench.runner.scheduler import group_key
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
    rounds: int = 3  # at most one per sample


CYCLES_PER_ROUND = 1000  # cycle numbers of round r start at r × this (the scheduler numbers them on through a run)


def blocks_of(samples: Sequence[float] | np.ndarray, rounds: int, calls: int) -> list[Block]:
    """``samples`` (seconds per call) split into ``rounds`` consecutive rounds of interleaved blocks."""
    split = np.array_split(np.asarray(samples, dtype=float), rounds)
    return [
        Block(r, k, r * CYCLES_PER_ROUND + k, None, calls, float(value) * calls)
        for r, part in enumerate(split)
        for k, value in enumerate(part)
    ]


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
        blocks = (
            blocks_of(cell.samples, cell.rounds, fields["calls_per_sample"]) if cell.samples and cell.rounds else []
        )
        if cell.rounds:
            fields.update(group_key=group_key(cell.case), schedule="interleaved", rounds=cell.rounds)
        if cell.samples:
            by_round = [
                list(map(float, part)) for part in np.array_split(np.asarray(cell.samples), max(1, cell.rounds))
            ]
            estimate = time_estimate(by_round)
            assert estimate is not None
            fields.update(
                median_s=estimate.value,
                ci_low_s=estimate.ci_low,
                ci_high_s=estimate.ci_high,
                mean_s=float(np.mean(cell.samples)),
                stdev_s=float(np.std(cell.samples, ddof=1)) if len(cell.samples) > 1 else None,
                min_s=float(np.min(cell.samples)),
            )
        store.add_result(run_id, cell.case, fields, list(cell.samples), cell.details, blocks)
    store.finish_run(run_id)
    return run_id
