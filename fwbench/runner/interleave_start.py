"""Starting an interleaved round's workers (``fwbench.runner.interleave`` then measures them): the order they
start in (:func:`start_order`), one at a time while the next fits in memory beside those already ready
(:func:`start_while_fits`, a sub-group), or, in a later round whose cells allow it and fit, all of them side by side
(:func:`start_together_fits`, :func:`start_together`); each waited for until it is ready (:class:`LiveWorker`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fwbench.measure.environment import memory_available_bytes
from fwbench.messages import Job
from fwbench.runner.cell_rounds import CellRounds
from fwbench.runner.outcome import failed, outcome_from_result
from fwbench.runner.phases import get_phase
from fwbench.runner.process import WorkerFailure, WorkerProcess
from fwbench.runner.rankset import RankSet, start_worker
from fwbench.spec import Case, Settings, node_procs

MEMORY_HEADROOM = 1.5  # start another worker only while free memory exceeds this × the largest peak so far
# Set, these make an OpenMP runtime bind its threads to places it computes when it loads: a worker started beside
# others loads it on the start CPUs, so later rounds then start their workers one at a time.
PLACEMENT_VARIABLES = ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "KMP_AFFINITY")


@dataclass
class LiveWorker:
    """A ready interleaved worker: its case, process, calls per block and block seconds at calibration."""

    case: Case
    worker: WorkerProcess | RankSet
    calls: int
    block_s: float
    peak_bytes: int
    blocks: int = 0


def _fits_another(live: Sequence[LiveWorker], settings: Settings, procs: int = 1) -> bool:
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


def _processes_needed(pending: Sequence[Case], live: Sequence[LiveWorker], settings: Settings) -> int:
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


def start_while_fits(
    pending: list[Case],
    cells: dict[str, CellRounds],
    settings: Settings,
    checks: Mapping[str, bool],
    weights_path: str | None,
    round_index: int,
    live: list[LiveWorker],
) -> list[Case]:
    """Start ``pending``'s workers one at a time, each waited for until it is ready (appended to ``live``, which the
    caller closes), while the next one fits in memory beside them (:func:`_fits_another`); the cells left to start
    (a later sub-group's)."""
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
    return pending


def start_together_fits(pending: Sequence[Case], cells: Mapping[str, CellRounds], settings: Settings) -> bool:
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


def start_together(
    pending: Sequence[Case],
    cells: dict[str, CellRounds],
    settings: Settings,
    checks: Mapping[str, bool],
    weights_path: str | None,
    round_index: int,
    live: list[LiveWorker],
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
    """Start ``case``'s interleaved worker (``start_cpus``: beside others, :func:`start_together`); None (and the
    cell failed) if it cannot be started."""
    job = Job(
        case=case,
        settings=settings,
        check_parity=check,
        weights_path=weights_path,
        interleaved=True,
        budget_s=settings.max_time_s / settings.rounds,
        record_kernels=round_index == 0,
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
) -> LiveWorker | None:
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
    return LiveWorker(case, worker, 0, 0.0, int(message["peak_memory_bytes"] or 0))
