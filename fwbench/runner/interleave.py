"""One interleaved round of a comparison group (``fwbench.runner.scheduler`` runs a group's rounds; phases that
allow it, ``Settings.interleave``): its sub-groups of workers that fit in memory, each started
(:mod:`fwbench.runner.interleave_start`), calibrated, timed cycle after cycle and finished.

In the first round the group's workers start (import, build, compile, first call, warm up) one at a time — a cell's
first call and its stage seconds (its time to first result) are stored results, measured with the machine to itself.
In later rounds, where the phase allows it (``Phase.starts_together``) and round 1's peaks say they fit in memory
together, they start side by side instead: each imports on all of the manager's CPUs and moves to its cell's CPUs
before its framework is configured; of what it does before it is ready only its stage seconds and its peak are
stored (its first call is not: ``started_together``), and it must end with every thread on its cell's CPUs. Then the
workers calibrate their blocks one after another, each alone on the machine, and stay alive together, pinned to the
same CPUs. Then, cycle after cycle, every worker times one block, in an order drawn afresh each cycle from a
generator seeded by the run's seed, the group and the round.
Exactly one worker measures at a time: the manager sends one ``block`` command and waits for its answer before
the next, and the idle workers block on their stdin.
Before a worker's block the manager waits, when another worker timed the last one, until that worker's threads
have gone quiet (thread pools spin after work: OpenMP, ONNX Runtime), at most ``settle_s``
(:mod:`fwbench.measure.settle`). Blocks of one cycle are adjacent in time: the report pairs
them (:mod:`fwbench.measure.rounds`). Workers that would not fit in memory together are run in successive
sub-groups (each still interleaved; their cycles are numbered apart, so only workers alive together pair).

Phase fit interleaves by epoch: a worker's first epoch (compilation included, a stored result like any first
call) is its warm-up, each later epoch one block on command (``Phase.blocks_per_round``: ``epochs`` − 1 cycles a
round).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence

import numpy as np

from fwbench.measure import noise
from fwbench.measure.noise import NoiseTotals
from fwbench.measure.rounds import Block
from fwbench.measure.settle import settle
from fwbench.measure.timer import HF2019_REPEAT
from fwbench.runner.cell_rounds import CellRounds, check_placement
from fwbench.runner.interleave_start import (
    LiveWorker,
    start_order,
    start_together,
    start_together_fits,
    start_while_fits,
)
from fwbench.runner.outcome import check_memory, failed, outcome_from_result
from fwbench.runner.phases import get_phase
from fwbench.runner.process import WorkerFailure
from fwbench.spec import Case, Settings

MIN_CYCLES = 5  # blocks per worker per round, whatever the budget: a round's median needs a few
MAX_CYCLES = 400
OVERRUN = 2.0  # a round of adaptive blocks ends (after MIN_CYCLES) once its blocks took this × their planned time


def _cycles(live: Sequence[LiveWorker], settings: Settings) -> int:
    """Cycles this round: what the phase fixes (fit: one per epoch after the first); else hf2019 spreads its 30
    blocks of 3 calls over the rounds, and adaptive fills the round's share of ``max_time_s`` with the slowest
    worker's blocks (at least MIN_CYCLES)."""
    fixed = get_phase(live[0].case.phase).blocks_per_round(settings)  # a group shares its phase
    if fixed is not None:
        return fixed
    if settings.protocol == "hf2019":
        return math.ceil(HF2019_REPEAT / settings.rounds)
    slowest = max(item.block_s for item in live)
    budget = settings.max_time_s / settings.rounds
    return max(MIN_CYCLES, min(MAX_CYCLES, int(budget / max(slowest, 1e-9))))


def interleaved_round(
    active: Sequence[Case],
    cells: dict[str, CellRounds],
    settings: Settings,
    checks: Mapping[str, bool],
    weights_path: str | None,
    round_index: int,
    rng: np.random.Generator,
    cycle: int,
) -> tuple[int, int]:
    """One round of ``active`` in as many sub-groups as memory requires; returns the next free cycle number and
    the number of sub-groups. Workers start (import, build, compile, first call, warm up) one at a time (in a later
    round, side by side when :func:`start_together_fits`: one sub-group), then calibrate their blocks one after
    another, each alone on the machine (round 1; a later round's keep round 1's calls, :func:`equal_blocks`)."""
    pending = start_order(active, rng)
    subgroup = 0
    live: list[LiveWorker] = []
    if round_index > 0 and start_together_fits(pending, cells, settings):
        try:
            start_together(pending, cells, settings, checks, weights_path, round_index, live)
            cycle = _measure(live, cells, settings, round_index, rng, cycle)
        finally:
            for item in live:
                item.worker.close()
        return cycle, 1
    while pending:
        live = []
        try:
            pending = start_while_fits(pending, cells, settings, checks, weights_path, round_index, live)
            cycle = _measure(live, cells, settings, round_index, rng, cycle)
        finally:
            for item in live:
                item.worker.close()
        subgroup += 1
    return cycle, subgroup


def _measure(
    live: list[LiveWorker],
    cells: dict[str, CellRounds],
    settings: Settings,
    round_index: int,
    rng: np.random.Generator,
    cycle: int,
) -> int:
    """The ready workers of one sub-group: calibrated one after another (in a later round, those that
    :func:`_adaptive_blocks` allows take round 1's calls per block), their cycles timed, then finished; the next free
    cycle number."""
    for item in live:
        cell = cells[item.case.key]
        if round_index > 0 and cell.calibration is not None and _adaptive_blocks(item.case, settings):
            item.calls, item.block_s = cell.calibration
        else:
            _calibrate(item, cell, settings, round_index)
    measured = [item for item in live if not cells[item.case.key].ended]
    if round_index == 0:
        equal_blocks(measured, cells, settings)
    if measured:
        cycle = _timed_cycles(measured, cells, settings, round_index, rng, cycle)
        _finish(measured, cells, settings, round_index)
    return cycle


def _calibrate(item: LiveWorker, cell: CellRounds, settings: Settings, round_index: int) -> None:
    """Have ``item``'s worker choose its calls per block (the others are idle); the cell fails if it dies."""
    item.worker.command("calibrate")
    try:
        message = item.worker.await_message({"calibrated"}, settings.timeout_s)
    except WorkerFailure as failure:
        item.worker.close()
        cell.fail(failed(item.case, failure), round_index, settings)
        return
    item.calls, item.block_s = int(message["calls_per_block"]), float(message["block_s"])


def equal_blocks(live: Sequence[LiveWorker], cells: dict[str, CellRounds], settings: Settings) -> None:
    """Round 1: give every worker of ``live`` that :func:`_adaptive_blocks` allows as many calls per block as
    make its block last as long as the sub-group's longest calibrated block (at most the round's share of
    ``max_time_s`` over MIN_CYCLES, the fewest cycles a round has), and keep those calls for the cell's later
    rounds. A cycle's blocks then span about the same time (a paired speed-up compares like with like), and every
    cell, not only the slowest, fills its share of ``max_time_s`` (:func:`_cycles` counts cycles by the longest
    block): a fast runtime's block averages more calls, so its round-to-round spread narrows."""
    adaptive = [item for item in live if _adaptive_blocks(item.case, settings) and item.block_s > 0]
    if not adaptive:
        return
    target = min(max(item.block_s for item in adaptive), settings.max_time_s / settings.rounds / MIN_CYCLES)
    for item in adaptive:
        calls = max(item.calls, round(item.calls * target / item.block_s))
        item.calls, item.block_s = calls, item.block_s * calls / item.calls
        cells[item.case.key].calibration = (item.calls, item.block_s)


def _adaptive_blocks(case: Case, settings: Settings) -> bool:
    """Whether the manager may size ``case``'s blocks (:func:`equal_blocks`) and have its later rounds time round
    1's calls without calibrating again (a calibration per worker per round saved): the adaptive protocol's cells
    of one process whose phase does not fix its blocks. hf2019's blocks are its protocol's 3 calls, a fit's block
    is an epoch, a rank set calibrates across its ranks."""
    phase = get_phase(case.phase)
    return settings.protocol != "hf2019" and case.procs is None and phase.blocks_per_round(settings) is None


def _timed_cycles(
    live: list[LiveWorker],
    cells: dict[str, CellRounds],
    settings: Settings,
    round_index: int,
    rng: np.random.Generator,
    cycle: int,
) -> int:
    """The round's cycles over ``live``: one block per live worker per cycle, seeded order, one at a time; adaptive
    blocks stop early (after MIN_CYCLES) once they took OVERRUN × the time their calibration planned, so a machine
    that slowed since round 1 (whose calls per block later rounds keep) does not stretch the round. The machine's
    counters are read around all of them, the manager and every worker counting as fwbench's own."""
    pids: list[int | str] = ["self", *(pid for item in live for pid in item.worker.pids)]
    before = noise.read(time.perf_counter(), pids)
    last: LiveWorker | None = None
    cycles = _cycles(live, settings)
    planned_s = cycles * sum(item.block_s for item in live)  # what the blocks take at the calibrated speed
    adaptive = all(_adaptive_blocks(item.case, settings) for item in live)
    spent_s = 0.0
    for done in range(1, cycles + 1):
        for position in rng.permutation(len(live)):
            item = live[int(position)]
            cell = cells[item.case.key]
            if cell.ended:
                continue
            if last is not None and last is not item and settings.settle_s > 0:
                if last.case.procs is None:  # the last worker's pools go quiet before this one measures
                    settle(last.worker.pids, settings.settle_s)
                else:  # a rank set's ranks may be on other nodes, whose threads this machine cannot see
                    time.sleep(settings.settle_s)
            item.worker.command("block", calls=item.calls)
            try:
                message = item.worker.await_message({"block"}, settings.timeout_s)
            except WorkerFailure as failure:
                item.worker.close()
                cell.fail(failed(item.case, failure), round_index, settings)
                continue
            cell.blocks.append(
                Block(
                    round_index,
                    item.blocks,
                    cycle,
                    message["start_unix_s"],
                    int(message["calls"]),
                    float(message["seconds"]),
                )
            )
            item.blocks += 1
            spent_s += float(message["seconds"])
            last = item
        cycle += 1
        if adaptive and done >= MIN_CYCLES and spent_s > OVERRUN * planned_s:
            break  # the machine slowed since the calibration (a later round keeps round 1's): the round ends here
    if any(cells[item.case.key].ended for item in live):
        return cycle  # a dead worker's CPU time can no longer be read: this round's counters would misattribute it
    totals = NoiseTotals()
    totals.add(before, noise.read(time.perf_counter(), pids))
    for item in live:
        cells[item.case.key].noise.merge(totals)
    return cycle


def _finish(live: Sequence[LiveWorker], cells: dict[str, CellRounds], settings: Settings, round_index: int) -> None:
    """Ask every live worker to finish (its parity check, its result) and keep each round's outcome."""
    for item in live:
        cell = cells[item.case.key]
        if cell.ended:
            continue
        item.worker.command("finish")
        try:
            result = item.worker.await_message({"result"}, settings.timeout_s)
            item.worker.wait_exit()
        except WorkerFailure as failure:
            cell.fail(failed(item.case, failure), round_index, settings)
            continue
        outcome = check_memory(outcome_from_result(item.case, result, round_index), settings)
        if round_index in cell.started_together and outcome.status == "ok":
            outcome = check_placement(outcome, result)
        if outcome.status != "ok":
            cell.blocks = [block for block in cell.blocks if block.round != round_index]
            cell.fail(outcome, round_index, settings)
        else:
            cell.rounds.append(outcome)
