"""The scheduler: a plan's cells in *comparison groups* (cells that differ only by runtime), each group run in
``rounds`` fresh sets of workers, interleaved by default.

Interleaved (``Settings.interleave``, phases that allow it): in the first round the group's workers start
(import, build, compile, first call, warm up) one at a time — a cell's first call and its stage seconds (its
time to first result) are stored results, measured with the machine to itself. In later rounds, where the phase
allows it (``Phase.starts_together``) and round 1's peaks say they fit in memory together, they start side by
side instead: each imports on all of the manager's CPUs and moves to its cell's CPUs before its framework is
configured; of what it does before it is ready only its stage seconds and its peak are stored (its first call is
not: ``started_together``), and it must end with every thread on its cell's CPUs. Then the workers calibrate their
blocks one after another, each alone on the machine, and stay alive together, pinned to the same CPUs. Then, cycle
after cycle, every worker times one block, in an order drawn afresh each cycle from a generator seeded by the run's
seed, the group and the round.
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

Sequential (``interleave`` off): each cell of the group runs start to end in its own worker, in a seeded random
order per round, timed in one go as before.

Either way a cell whose worker fails (error, timeout, oom, a parity mismatch) keeps that status and is not run
again in later rounds; the others finish. The manager stores a group's cells together after each of its rounds
(``fwbench.runner.manager``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fwbench.details import ExtraRoundFailure, Interleaving, RoundDetail, RoundsStop, StageSeconds
from fwbench.measure import noise
from fwbench.measure.environment import cpu_list_set, memory_available_bytes
from fwbench.measure.noise import NoiseTotals
from fwbench.measure.rounds import Block, blocks_by_round, time_estimate
from fwbench.measure.settle import settle
from fwbench.measure.timer import HF2019_REPEAT
from fwbench.messages import Job
from fwbench.runner.outcome import CellOutcome, check_memory, failed, outcome_from_result, run_worker, spread_fields
from fwbench.runner.phases import get_phase
from fwbench.runner.process import WorkerFailure, WorkerProcess
from fwbench.runner.rankset import RankSet, start_worker
from fwbench.runner.tempfolders import EXPORTS_PREFIX, run_folder
from fwbench.spec import Case, Settings, group_key, node_procs

# Checks of a cell's first round kept when a later round fails: the manager settled its pair's parity on them, so the
# other cells of the pair (``parity_checked_by`` this cell) find the check in the store.
CHECKS_KEPT_ON_FAILURE = ("parity", "precision")
MIN_CYCLES = 5  # blocks per worker per round, whatever the budget: a round's median needs a few
MAX_CYCLES = 400
OVERRUN = 2.0  # a round of adaptive blocks ends (after MIN_CYCLES) once its blocks took this × their planned time
MEMORY_HEADROOM = 1.5  # start another worker only while free memory exceeds this × the largest peak so far
# Set, these make an OpenMP runtime bind its threads to places it computes when it loads: a worker started beside
# others loads it on the start CPUs, so later rounds then start their workers one at a time.
PLACEMENT_VARIABLES = ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "KMP_AFFINITY")


def comparison_groups(cases: Sequence[Case]) -> list[list[Case]]:
    """``cases`` split into comparison groups, groups in order of first appearance, cases in plan order."""
    groups: dict[str, list[Case]] = {}
    for case in cases:
        groups.setdefault(group_key(case), []).append(case)
    return list(groups.values())


def order_generator(settings: Settings, key: str, round_index: int) -> np.random.Generator:
    """The seeded generator of one group's round: the same run gives the same orders."""
    digest = hashlib.sha256(f"{settings.seed}|{key}|{round_index}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def is_interleaved(case: Case, settings: Settings) -> bool:
    """Whether ``case``'s group runs interleaved: the setting, and a phase whose calls can be served in blocks."""
    return settings.interleave and get_phase(case.phase).interleaves(settings)


@dataclass
class CellRounds:
    """One cell's rounds so far: each round's outcome (ok), all its blocks, or the failure that ended it; or, when
    only an extra round failed (:mod:`fwbench.runner.extra_rounds`), that failure beside the rounds it keeps."""

    case: Case
    rounds: list[CellOutcome] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=list)
    failure: CellOutcome | None = None
    extra_failure: tuple[int, CellOutcome] | None = None  # (round, outcome): an extra round that failed
    noise: NoiseTotals = field(default_factory=NoiseTotals)  # interleaved: the rounds' spans, read by the manager
    started_together: set[int] = field(default_factory=set)  # rounds whose workers started side by side
    calibration: tuple[int, float] | None = None  # round 1's (calls per block, block seconds)

    @property
    def ended(self) -> bool:
        """Whether the cell runs no more (a failure, or a failed extra round)."""
        return self.failure is not None or self.extra_failure is not None

    def fail(self, outcome: CellOutcome, round_index: int, settings: Settings) -> None:
        """A failure in round ``round_index``: the cell's status, or, in an extra round, a note beside the rounds
        it already has (that round's blocks dropped): the cell stays what its minimum rounds made it."""
        if round_index >= settings.rounds:
            self.blocks = [block for block in self.blocks if block.round != round_index]
            self.extra_failure = (round_index, outcome)
            return
        if settings.rounds > 1 and outcome.reason:
            outcome.reason = f"{outcome.reason} (round {round_index + 1} of {settings.rounds})"
        self.failure = outcome


class GroupRun:
    """One comparison group's rounds, run one at a time (:meth:`run_round`): its first ``settings.rounds`` back to
    back (:func:`run_group`, a Ray node) or in turn with the other groups of a window (``fwbench.runner.manager.
    Window``), then, when the run has a budget, any extra ones the manager gives it
    (:mod:`fwbench.runner.extra_rounds`). ``check_parity[case.key]``: whether that cell checks its parity (in its
    first round only). Each round's wall seconds are kept (``round_wall_s``): what the next one will cost."""

    def __init__(
        self,
        cases: Sequence[Case],
        settings: Settings,
        check_parity: Mapping[str, bool],
        weights_path: str | None = None,
    ) -> None:
        self.cases, self.settings, self.check_parity, self.weights_path = (
            list(cases),
            settings,
            check_parity,
            weights_path,
        )
        self.cells = {case.key: CellRounds(case) for case in cases}
        self.interleaved = is_interleaved(cases[0], settings)
        self.key = group_key(cases[0])
        self.cycle = 0
        self.subgroups: list[int] = []  # interleaved: sub-groups per round
        self.round_wall_s: list[float] = []
        self.setup_s = 0.0  # wall seconds the group spent outside its rounds (the manager's checks, its exports)
        self.notes: dict[str, dict[str, Any]] = {}  # details the manager adds to a cell's outcome, by case key
        self._exports: tempfile.TemporaryDirectory[str] | None = None

    def keep_exports(self) -> None:
        """Give the group an export cache of its own that outlives a round (:attr:`exports`), so an extra round's
        engines load what its first rounds exported; :meth:`close` removes it."""
        if self._exports is None:
            self._exports = run_folder(EXPORTS_PREFIX)

    @property
    def exports(self) -> str | None:
        """The group's own export cache (None: each round's is the manager's temporary one)."""
        return None if self._exports is None else self._exports.name

    def close(self) -> None:
        """Remove the group's export cache, if it kept one."""
        if self._exports is not None:
            self._exports.cleanup()
            self._exports = None

    @property
    def rounds_run(self) -> int:
        return len(self.round_wall_s)

    @property
    def cell_wall_s(self) -> float:
        """The wall seconds each cell is charged: the group's, rounds and set-up, shared evenly by its cells."""
        return (self.setup_s + sum(self.round_wall_s)) / len(self.cases)

    @property
    def extra_failed(self) -> bool:
        """Whether a cell's worker failed in an extra round (the group then gets no more)."""
        return any(cell.extra_failure is not None for cell in self.cells.values())

    @property
    def active(self) -> list[Case]:
        """The cells that have not failed: those a next round runs."""
        return [case for case in self.cases if not self.cells[case.key].ended]

    def run_round(self) -> None:
        """The group's next round over its active cells (none left: nothing runs)."""
        round_index = self.rounds_run
        active = self.active
        started = time.monotonic()
        if active:
            rng = order_generator(self.settings, self.key, round_index)
            checks = {case.key: self.check_parity.get(case.key, True) and round_index == 0 for case in active}
            if self.interleaved:
                self.cycle, count = _interleaved_round(
                    active, self.cells, self.settings, checks, self.weights_path, round_index, rng, self.cycle
                )
                self.subgroups.append(count)
            else:
                _sequential_round(active, self.cells, self.settings, checks, self.weights_path, round_index, rng)
        self.round_wall_s.append(time.monotonic() - started)

    def outcomes(self, stop: RoundsStop | None = None) -> list[CellOutcome]:
        """One outcome per case, in order: its rounds merged (:func:`merge_rounds`), with why its group stopped
        adding rounds when that is known."""
        schedule = "interleaved" if self.interleaved else "sequential"
        outcomes = [merge_rounds(self.cells[case.key], self.key, schedule) for case in self.cases]
        split = tuple(self.subgroups) if any(count > 1 for count in self.subgroups) else ()
        # the report says that not every pair of runtimes was measured together, and why the group stopped
        extra = Interleaving(subgroups=split, stop=stop).to_dict()
        for outcome in outcomes:
            outcome.details.update(extra)
            outcome.details.update(self.notes.get(outcome.case.key, {}))
        return outcomes


def run_group(
    cases: Sequence[Case], settings: Settings, check_parity: Mapping[str, bool], weights_path: str | None = None
) -> list[CellOutcome]:
    """Every cell of one comparison group over ``settings.rounds`` rounds; one outcome per case, in order.
    ``check_parity[case.key]``: whether that cell checks its parity (in its first round only)."""
    group = GroupRun(cases, settings, check_parity, weights_path)
    run_rounds(group, settings.rounds)
    return group.outcomes()


def run_rounds(group: GroupRun, rounds: int) -> None:
    """Run ``group``'s rounds until it has ``rounds`` of them, or no active cell is left."""
    while group.rounds_run < rounds and group.active:
        group.run_round()


def _sequential_round(
    active: Sequence[Case],
    cells: dict[str, CellRounds],
    settings: Settings,
    checks: Mapping[str, bool],
    weights_path: str | None,
    round_index: int,
    rng: np.random.Generator,
) -> None:
    """One round of ``active``, each cell start to end in its own worker, in a seeded order; the rounds share
    ``max_time_s`` (adaptive) as interleaved rounds do."""
    per_round = dataclasses.replace(settings, max_time_s=settings.max_time_s / settings.rounds)
    for position in rng.permutation(len(active)):
        case = active[int(position)]
        if case.procs is not None:  # its ranks step together: the manager times its blocks (fwbench.runner.rankset)
            _interleaved_round([case], cells, settings, checks, weights_path, round_index, rng, 0)
            continue
        outcome = run_worker(
            case, per_round, check_parity=checks[case.key], weights_path=weights_path, round_index=round_index
        )
        cell = cells[case.key]
        if outcome.status != "ok":
            cell.fail(outcome, round_index, settings)
        else:
            cell.rounds.append(outcome)
            cell.blocks.extend(outcome.blocks)


@dataclass
class _Live:
    """A ready interleaved worker: its case, process, calls per block and block seconds at calibration."""

    case: Case
    worker: WorkerProcess | RankSet
    calls: int
    block_s: float
    peak_bytes: int
    blocks: int = 0


def _cycles(live: Sequence[_Live], settings: Settings) -> int:
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


def _fits_another(live: Sequence[_Live], settings: Settings, procs: int = 1) -> bool:
    """Whether one more worker of ``procs`` processes on this machine fits in memory next to ``live``: free memory
    above MEMORY_HEADROOM × the largest peak of one process so far × ``procs`` (a rank set's peak is its processes'
    sum), or the memory limit, when one is set and larger."""
    if not live:
        return True
    available = memory_available_bytes()
    if available is None:
        return True
    largest = max(item.peak_bytes / (item.case.procs or 1) for item in live) * procs
    if settings.memory_limit_bytes is not None:
        largest = max(largest, settings.memory_limit_bytes)
    return available > MEMORY_HEADROOM * largest


def _processes_needed(pending: Sequence[Case], live: Sequence[_Live], settings: Settings) -> int:
    """Processes on this machine the next start must find memory for: the next cell's, or, when it is the first of
    its runtime's cells in this sub-group, those of all its runtime's pending cells (its process counts, adjacent
    in :func:`start_order`), so a split for memory does not part them when it can start them together later."""
    runtime = pending[0].runtime
    if any(item.case.runtime == runtime for item in live):
        return node_procs(pending[0], settings)
    return sum(node_procs(case, settings) for case in pending if case.runtime == runtime)


def start_order(active: Sequence[Case], rng: np.random.Generator) -> list[Case]:
    """The order a round starts ``active``'s workers in (a split for memory cuts this list): seeded random; in a
    group of distributed cells, a runtime's process counts one after another (runtimes in the seeded order of their
    first cell, each runtime's cells in theirs), so a split rarely parts the cells scaling efficiency pairs."""
    order = [active[int(i)] for i in rng.permutation(len(active))]
    if any(case.procs is not None for case in active):
        first: dict[str, int] = {}
        for position, case in enumerate(order):
            first.setdefault(case.runtime, position)
        order.sort(key=lambda case: first[case.runtime])
    return order


def _interleaved_round(
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
    round, side by side when :func:`_start_together_fits`: one sub-group), then calibrate their blocks one after
    another, each alone on the machine (round 1; a later round's keep round 1's calls, :func:`equal_blocks`)."""
    pending = start_order(active, rng)
    subgroup = 0
    live: list[_Live] = []
    if round_index > 0 and _start_together_fits(pending, cells, settings):
        try:
            _start_together(pending, cells, settings, checks, weights_path, round_index, live)
            cycle = _measure(live, cells, settings, round_index, rng, cycle)
        finally:
            for item in live:
                item.worker.close()
        return cycle, 1
    while pending:
        live = []
        try:
            while pending and _fits_another(live, settings, _processes_needed(pending, live, settings)):
                case, pending = pending[0], pending[1:]
                worker = _start(case, cells[case.key], settings, checks[case.key], weights_path, round_index)
                if worker is not None:
                    try:
                        ready = _await_ready(case, worker, cells[case.key], settings, round_index)
                    except BaseException:  # interrupted, a node lost: not yet live, closed here
                        worker.close()
                        raise
                    if ready is not None:
                        live.append(ready)
            cycle = _measure(live, cells, settings, round_index, rng, cycle)
        finally:
            for item in live:
                item.worker.close()
        subgroup += 1
    return cycle, subgroup


def _measure(
    live: list[_Live],
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


def _start_together_fits(pending: Sequence[Case], cells: Mapping[str, CellRounds], settings: Settings) -> bool:
    """Whether a later round may start all of ``pending``'s workers at once: CPU cells of a phase that allows it
    (one process per cell), no compile mode that autotunes, no OpenMP placement variable, and, from round 1's
    peaks, room in memory for all of them together (MEMORY_HEADROOM × their sum, each at least the memory limit
    when one is set)."""
    if any(os.environ.get(name) for name in PLACEMENT_VARIABLES):
        return False  # an OpenMP runtime would fix its thread places on the CPUs it starts on
    if settings.compile_mode != "default":
        return False  # max-autotune and friends time kernels while compiling: never beside other workers
    if not all(
        get_phase(case.phase).starts_together and case.procs is None and case.device == "cpu" for case in pending
    ):
        return False
    peaks = []
    for case in pending:
        first = cells[case.key].rounds[:1]
        peak = first[0].fields.get("peak_memory_bytes") if first else None
        if not peak:
            return False
        peaks.append(max(int(peak), settings.memory_limit_bytes or 0))
    available = memory_available_bytes()
    return available is None or available > MEMORY_HEADROOM * sum(peaks)


def _start_together(
    pending: Sequence[Case],
    cells: dict[str, CellRounds],
    settings: Settings,
    checks: Mapping[str, bool],
    weights_path: str | None,
    round_index: int,
    live: list[_Live],
) -> None:
    """Start every worker of ``pending`` at once, each importing on all of the manager's CPUs and moving to its
    cell's CPUs before its framework makes a thread pool (fwbench.runner.worker), and wait until each is ready
    (appended to ``live``, which the caller closes).
    Of what these workers do before they are ready only the stage seconds and peaks are stored (the round is
    marked ``started_together``, its first calls left out): round 1 measured them with the machine to itself."""
    start_cpus = sorted(os.sched_getaffinity(0))
    started: list[tuple[Case, WorkerProcess | RankSet]] = []
    try:
        for case in pending:
            cells[case.key].started_together.add(round_index)
            worker = _start(case, cells[case.key], settings, checks[case.key], weights_path, round_index, start_cpus)
            if worker is not None:
                started.append((case, worker))
        for case, worker in started:  # they share the cells' CPUs: each may take as long as all of them alone
            ready = _await_ready(case, worker, cells[case.key], settings, round_index, len(started))
            if ready is not None:
                live.append(ready)
    except BaseException:  # interrupted: the workers not yet live are closed here, the live ones by the caller
        for _, worker in started:
            if not any(item.worker is worker for item in live):
                worker.close()
        raise


def _start(
    case: Case,
    cell: CellRounds,
    settings: Settings,
    check: bool,
    weights_path: str | None,
    round_index: int,
    start_cpus: Sequence[int] | None = None,
) -> WorkerProcess | RankSet | None:
    """Start ``case``'s interleaved worker (``start_cpus``: beside others, :func:`_start_together`); None (and the
    cell failed) if it cannot be started."""
    job = Job(
        case=case,
        settings=settings,
        check_parity=check,
        weights_path=weights_path,
        interleaved=True,
        budget_s=settings.max_time_s / settings.rounds,
    )
    try:
        return start_worker(job, start_cpus)
    except WorkerFailure as failure:
        cell.fail(failed(case, failure), round_index, settings)
        return None


def _await_ready(
    case: Case,
    worker: WorkerProcess | RankSet,
    cell: CellRounds,
    settings: Settings,
    round_index: int,
    sharing: int = 1,
) -> _Live | None:
    """Wait until ``worker`` has warmed up (at most ``sharing`` × the timeout: workers started side by side share
    the CPUs); None (the worker closed, the cell failed) if it ended first: a crash, a timeout, an error or
    mismatch it reported."""
    try:
        message = worker.await_message({"ready", "result"}, settings.timeout_s * sharing)
    except WorkerFailure as failure:
        worker.close()
        cell.fail(failed(case, failure), round_index, settings)
        return None
    if "status" in message:  # a result before ready: the cell ended early (error, mismatch...)
        worker.wait_exit()
        worker.close()
        cell.fail(outcome_from_result(case, message, round_index), round_index, settings)
        return None
    return _Live(case, worker, 0, 0.0, int(message["peak_memory_bytes"] or 0))


def _calibrate(item: _Live, cell: CellRounds, settings: Settings, round_index: int) -> None:
    """Have ``item``'s worker choose its calls per block (the others are idle); the cell fails if it dies."""
    item.worker.command("calibrate")
    try:
        message = item.worker.await_message({"calibrated"}, settings.timeout_s)
    except WorkerFailure as failure:
        item.worker.close()
        cell.fail(failed(item.case, failure), round_index, settings)
        return
    item.calls, item.block_s = int(message["calls_per_block"]), float(message["block_s"])


def equal_blocks(live: Sequence[_Live], cells: dict[str, CellRounds], settings: Settings) -> None:
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
    live: list[_Live],
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
    last: _Live | None = None
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


def _finish(live: Sequence[_Live], cells: dict[str, CellRounds], settings: Settings, round_index: int) -> None:
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
            outcome = _check_placement(outcome, result)
        if outcome.status != "ok":
            cell.blocks = [block for block in cell.blocks if block.round != round_index]
            cell.fail(outcome, round_index, settings)
        else:
            cell.rounds.append(outcome)


def _check_placement(outcome: CellOutcome, result: Mapping[str, Any]) -> CellOutcome:
    """A worker started side by side must have ended with every thread on its cell's CPUs; else the round (and so
    the cell) is an error saying where a thread ran."""
    cpus = set(result.get("cpus") or ())
    outside = [text for text in result.get("thread_cpu_lists") or () if not cpu_list_set(str(text)) <= cpus]
    if not outside:
        return outcome
    reason = f"a thread ran on CPUs {', '.join(outside)}, outside the cell's {sorted(cpus)}, after a side-by-side start"
    return CellOutcome(outcome.case, "error", reason)


def merge_rounds(cell: CellRounds, key: str, schedule: str) -> CellOutcome:
    """The cell's stored outcome: its failure, or its rounds merged — samples and blocks of every round, the
    hierarchical time estimate (:func:`fwbench.measure.rounds.time_estimate`; a CI only with ≥ 3 rounds), the first
    round's details, each round's first-call time and peaks, the noise totals of all rounds."""
    shared: dict[str, Any] = {"group_key": key, "schedule": schedule, "rounds": len(cell.rounds)}
    if cell.failure is not None:
        outcome = cell.failure
        outcome.fields.update(shared)
        outcome.blocks = []
        if cell.rounds:  # it failed after its first round, whose checks other cells of its pair rely on
            for key in CHECKS_KEPT_ON_FAILURE:
                if key in cell.rounds[0].details:
                    outcome.details.setdefault(key, cell.rounds[0].details[key])
        return outcome
    first = cell.rounds[0]
    blocks = sorted(cell.blocks, key=lambda b: (b.round, b.index))
    samples = [block.per_call_s for block in blocks]
    by_round = blocks_by_round(blocks)
    noise = NoiseTotals()  # a copy: a group's cells are merged again after each extra round
    noise.merge(cell.noise)
    for outcome in cell.rounds:
        if outcome.fields.get("noise"):
            noise.merge(NoiseTotals.from_dict(outcome.fields["noise"]))
    fields = dict(first.fields)
    peaks = [o.fields.get("peak_memory_bytes") for o in cell.rounds]
    fields.update(
        shared, noise=noise.to_dict(), peak_memory_bytes=max((p for p in peaks if p is not None), default=None)
    )
    estimate = time_estimate(by_round)
    if estimate is not None and samples:
        fields.update(
            median_s=estimate.value, ci_low_s=estimate.ci_low, ci_high_s=estimate.ci_high, **spread_fields(samples)
        )
    details = dict(first.details)
    rounds = tuple(
        RoundDetail(
            first_call_s=None if index in cell.started_together else o.fields.get("first_call_s"),
            calls_per_sample=o.fields.get("calls_per_sample"),
            peak_memory_bytes=o.fields.get("peak_memory_bytes"),
            stage_seconds=StageSeconds.parse(o.details.get("stage_seconds")),
            started_together=index in cell.started_together,
        )
        for index, o in enumerate(cell.rounds)
    )
    extra = None
    if cell.extra_failure is not None:
        round_index, failure = cell.extra_failure
        extra = ExtraRoundFailure(round_index + 1, failure.status, failure.reason)
        if failure.details.get("disk_full"):  # the manager stops the sweep before storing (Recorder.replace)
            details["disk_full"] = failure.details["disk_full"]
    details.update(Interleaving(rounds=rounds, extra_failure=extra).to_dict())
    details.update(get_phase(cell.case.phase).merged_details([o.details for o in cell.rounds]))
    return CellOutcome(cell.case, "ok", first.reason, samples, fields, details, blocks)
