"""The manager: runs a plan's cells in worker processes, comparison group by comparison group
(:mod:`fwbench.runner.scheduler`), and stores every outcome.

It never imports a framework. A worker that crashes, is killed, exceeds ``--timeout`` or ``--memory-limit``
costs one cell, whose status and last error line are stored; the sweep goes on. Workers get their own process
group (killed whole) and die with the manager (PR_SET_PDEATHSIG). A group's cells are committed together, in
one transaction, as soon as its last round ends: a killed run loses at most the group in flight, and
``--resume`` runs the groups (cells) that have no status yet.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fwbench.frameworks import get_runtime, missing_implementation, missing_requirement
from fwbench.measure.environment import machine_record
from fwbench.measure.rounds import Block
from fwbench.models import get_model
from fwbench.runner.outcome import CellOutcome, run_worker
from fwbench.runner.phases import get_phase
from fwbench.runner.process import worker_cpus
from fwbench.runner.scheduler import comparison_groups, run_group
from fwbench.spec import Case, Plan, Settings
from fwbench.store import Store

__all__ = ["Block", "CellOutcome", "Listener", "execute", "run_worker", "store_outcome", "worker_cpus"]

Listener = Callable[[CellOutcome], None]


def _skipped(case: Case, reason: str) -> CellOutcome:
    return CellOutcome(case, "skipped", reason)


def store_outcome(
    store: Store,
    run_id: int,
    outcome: CellOutcome,
    settings: Settings,
    wall_s: float,
    machine: dict[str, Any] | None = None,
) -> bool:
    """Store one cell's outcome (with its blocks and the machine it ran on); False if the run already had it."""
    case = outcome.case
    fields = dict(outcome.fields)
    fields.update(
        machine=machine,
        status=outcome.status,
        reason=outcome.reason,
        protocol=settings.protocol,
        threads=settings.threads,
        interop_threads=settings.interop_threads,
        wall_s=wall_s,
        flops=cell_flops(case, settings),
    )
    return store.add_result(run_id, case, fields, outcome.samples, outcome.details, outcome.blocks)


def cell_flops(case: Case, settings: Settings) -> int | None:
    """FLOPs of one timed call of ``case``; None for a phase without a model (data)."""
    phase = get_phase(case.phase)
    return phase.flops_per_call(get_model(case.model), case, settings) if phase.uses_model else None


def parity_pair(case: Case) -> tuple[str, str, str, str]:
    """Cells that share one parity check: same model, runtime, dtype and device."""
    return case.model, case.runtime, case.dtype, case.device


def _stored_parity(store: Store, run_id: int) -> dict[tuple[str, str, str, str], str]:
    """Parity already settled in this run, by pair: the key of the cell that checked it, or 'mismatch'."""
    settled: dict[tuple[str, str, str, str], str] = {}
    for row in store.results([run_id]):
        pair = (row.model, row.runtime, row.dtype, row.device)
        if row.status == "mismatch":
            settled[pair] = "mismatch"
        elif row.status == "ok" and row.parity is not None and row.parity.passed:
            settled.setdefault(pair, row.case_key)
    return settled


def execute(store: Store, run_id: int, plan: Plan, listener: Listener | None = None) -> list[CellOutcome]:
    """Run every cell of ``plan`` that run ``run_id`` has no status for yet, group by group, storing each group's
    cells together as soon as it ends (``listener`` hears of each then); returns the outcomes in plan order.

    Parity is checked once per (model, runtime, dtype, device) in a run, by the first cell of the pair that
    runs; once a pair has failed it, its other cells are stored as ``mismatch`` without running.
    """
    done = store.done_keys(run_id)
    parity = _stored_parity(store, run_id)
    machine = machine_record()
    outcomes: list[CellOutcome] = []

    def record(batch: list[tuple[CellOutcome, float]]) -> None:
        with store.transaction():
            for outcome, wall_s in batch:
                store_outcome(store, run_id, outcome, plan.settings, wall_s, machine)
        for outcome, _ in batch:
            outcomes.append(outcome)
            if listener is not None:
                listener(outcome)

    record([(_skipped(s.case, s.reason), 0.0) for s in plan.skipped if s.case.key not in done])
    for group in comparison_groups([case for case in plan.cases if case.key not in done]):
        started = time.monotonic()
        settled: list[tuple[CellOutcome, float]] = []
        runnable: list[Case] = []
        for case in group:
            info = get_runtime(case.runtime)
            missing = missing_requirement(info)
            if missing is None and get_phase(case.phase).uses_model:
                missing = missing_implementation(info, get_model(case.model).arch)
            if missing:
                settled.append((_skipped(case, missing), 0.0))
            elif parity.get(parity_pair(case)) == "mismatch":
                reason = "not run: this runtime failed the parity check earlier in the run"
                settled.append((CellOutcome(case, "mismatch", reason), 0.0))
            else:
                runnable.append(case)
        if runnable:
            checks = {case.key: parity_pair(case) not in parity for case in runnable}
            group_outcomes = run_group(runnable, plan.settings, checks, plan.settings.weights_path)
            wall_s = (time.monotonic() - started) / len(runnable)  # the cells shared the group's time
            for outcome in group_outcomes:
                pair = parity_pair(outcome.case)
                if pair in parity:
                    outcome.details["parity_checked_by"] = parity[pair]
                elif outcome.status == "mismatch":
                    parity[pair] = "mismatch"
                elif outcome.status == "ok":
                    parity[pair] = outcome.case.key
                settled.append((outcome, wall_s))
        record(settled)
    order = {key: i for i, key in enumerate([s.case.key for s in plan.skipped] + [c.key for c in plan.cases])}
    return sorted(
        outcomes, key=lambda outcome: order[outcome.case.key]
    )  # stored group by group; returned in plan order
