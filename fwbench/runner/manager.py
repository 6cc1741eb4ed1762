"""The manager: runs a plan's cells in worker processes, comparison group by comparison group
(:mod:`fwbench.runner.scheduler`), and stores every outcome; on this machine (:func:`execute`) or, group by group,
on the nodes of a Ray cluster (:mod:`fwbench.runner.ray_executor`, which runs :func:`run_comparison_group` there).

It never imports a framework. A worker that crashes, is killed, exceeds ``--timeout`` or ``--memory-limit``
costs one cell, whose status and last error line are stored; the sweep goes on. Workers get their own process
group (killed whole) and die with the manager (PR_SET_PDEATHSIG). A group's cells are committed together, in
one transaction, after each of its rounds (the minimum rounds of a window of groups run in turn: :class:`Window`),
and again, in place, after each extra round it gets (:mod:`fwbench.runner.extra_rounds`): a killed run loses at most
the round in flight, and ``--resume`` runs the groups whose cells have no status yet or fewer than the minimum rounds
(a window stopped midway) from their first round.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from safetensors import SafetensorError

from fwbench.details import RoundsStop
from fwbench.diskfull import DiskFull, stops_the_sweep
from fwbench.frameworks import get_runtime, missing_implementation, missing_requirement
from fwbench.frameworks.base import EXPORT_CACHE_ENV, MODEL_EXPORT_CACHE_ENV
from fwbench.measure.environment import machine_record
from fwbench.measure.rounds import Block
from fwbench.models import get_model
from fwbench.models.weights_io import save_weights
from fwbench.runner.extra_rounds import RoundListener, minimum_only, spend_budget
from fwbench.runner.outcome import CellOutcome, run_worker
from fwbench.runner.phases import Phase, estimate_s, get_phase
from fwbench.runner.process import worker_cpus
from fwbench.runner.scheduler import GroupRun, comparison_groups, run_rounds
from fwbench.runner.tempfolders import EXPORTS_PREFIX, WEIGHTS_PREFIX, remove_stale, run_folder
from fwbench.spec import Case, Plan, Settings, SkippedCase, cell_threads, group_key
from fwbench.store import ResultRecord, Store
from fwbench.store.records import unfinished

__all__ = ["Block", "CellOutcome", "Listener", "execute", "run_worker", "store_outcome", "worker_cpus"]

Listener = Callable[[CellOutcome], None]
ParityPair = tuple[str, str, str, str, int | None]
Parity = dict[ParityPair, str]  # a run's settled parity pairs: the checking cell's key or 'mismatch'
Settled = list[tuple[CellOutcome, float]]  # outcomes with the wall seconds each cell took of its group's time


def _skipped(case: Case, reason: str) -> CellOutcome:
    return CellOutcome(case, "skipped", reason)


def skipped_outcomes(skipped: Sequence[SkippedCase]) -> Settled:
    """The plan's skipped cells of a group as stored outcomes (no time spent)."""
    return [(_skipped(item.case, item.reason), 0.0) for item in skipped]


def store_outcome(
    store: Store,
    run_id: int,
    outcome: CellOutcome,
    settings: Settings,
    wall_s: float,
    machine: dict[str, Any] | None = None,
    *,
    replace: bool = False,
) -> bool:
    """Store one cell's outcome (with its blocks and the machine it ran on); False if the run already had it
    (``replace``: store it again in place of the run's row; False if the run did not have it)."""
    case = outcome.case
    fields = dict(outcome.fields)
    fields.update(
        machine=machine,
        status=outcome.status,
        reason=outcome.reason,
        protocol=settings.protocol,
        threads=cell_threads(case, settings),
        interop_threads=settings.interop_threads,
        wall_s=wall_s,
        flops=cell_flops(case, settings),
    )
    return store.add_result(run_id, case, fields, outcome.samples, outcome.details, outcome.blocks, replace=replace)


def cell_flops(case: Case, settings: Settings) -> int | None:
    """FLOPs of one timed call of ``case``; None for a phase without a model (data)."""
    phase = get_phase(case.phase)
    return phase.flops_per_call(get_model(case.model), case, settings) if phase.uses_model else None


def parity_pair(case: Case) -> ParityPair:
    """Cells that share one parity check: same model, runtime, dtype, device and process count (each count of a
    distributed runtime checks that its processes together compute the global batch's loss)."""
    return case.model, case.runtime, case.dtype, case.device, case.procs


def stored_parity(store: Store, run_id: int, min_rounds: int = 1) -> Parity:
    """Parity already settled in this run, by pair: the key of the cell that checked it, or 'mismatch'. A cell with
    fewer than ``min_rounds`` rounds (a window the run was stopped in) settles nothing: ``--resume`` runs it again,
    and it checks again."""
    settled: Parity = {}
    for row in store.results([run_id]):
        if unfinished(row.status, row.rounds, min_rounds):
            continue
        pair = (row.model, row.runtime, row.dtype, row.device, row.procs)
        if row.status == "mismatch":
            settled[pair] = "mismatch"
        elif row.status == "ok" and row.parity is not None and row.parity.passed:
            settled.setdefault(pair, row.case_key)
    return settled


@contextlib.contextmanager
def exports_folder(variable: str, folder: str | None = None) -> Iterator[None]:
    """``folder`` (its owner removes it), or a temporary one removed with everything in it when the block ends, given
    to the workers through their environment as ``variable``."""
    previous = os.environ.get(variable)
    with contextlib.ExitStack() as stack:
        if folder is None:
            folder = stack.enter_context(run_folder(EXPORTS_PREFIX))
        os.environ[variable] = folder
        try:
            yield
        finally:
            if previous is None:
                os.environ.pop(variable, None)
            else:
                os.environ[variable] = previous


def export_cache(folder: str | None = None) -> contextlib.AbstractContextManager[None]:
    """A folder for the group's exported artefacts (deployment engines; EXPORT_CACHE_ENV): ``folder``, or a temporary
    one. A group is one model at one shape, so its rounds' fresh workers, and engines that run one exporter's file,
    export it once."""
    return exports_folder(EXPORT_CACHE_ENV, folder)


def model_exports() -> contextlib.AbstractContextManager[None]:
    """The run's cache of artefacts exported with every axis free (MODEL_EXPORT_CACHE_ENV; phase generate's decoder
    step): one export per model serves all of the model's groups, whatever their batch and prompt."""
    return exports_folder(MODEL_EXPORT_CACHE_ENV)


class SeededWeights:
    """The run's seeded weights, written once per model to a safetensors file in ``folder`` that every worker of the
    run loads (:meth:`fwbench.runner.cell.Cell.weights`) instead of drawing the same values again: drawing
    bert-base's 110 M takes a worker ~2.5 s, loading them ~0.3 s. The values are the phase's seeded ones
    (Phase.seeded_weights: the canonical ones but for phase generate's), bit for bit."""

    def __init__(self, folder: str, seed: int) -> None:
        self.folder, self.seed = Path(folder), seed
        self._paths: dict[str, str | None] = {}

    def path(self, model: str, phase: str) -> str | None:
        """The file holding ``model``'s seeded weights as ``phase`` builds with them (Phase.seeded_weights), written
        on the first call; None where it cannot be written (no room: each worker draws them itself, as it would
        without this file)."""
        own = type(get_phase(phase)).seeded_weights is not Phase.seeded_weights  # phase generate's
        key = f"{model}-{phase}" if own else model
        if key not in self._paths:
            description = get_model(model)
            path = self.folder / f"{key}-seed{self.seed}.safetensors"
            try:
                save_weights(description, get_phase(phase).seeded_weights(description, self.seed), path, self.seed)
                self._paths[key] = str(path)
            except (OSError, SafetensorError, MemoryError):  # no room on disk or in memory (safetensors reports
                path.unlink(missing_ok=True)  # a failed write as its own error): the workers draw them as before
                self._paths[key] = None
        return self._paths[key]


@contextlib.contextmanager
def seeded_weights(settings: Settings) -> Iterator[SeededWeights | None]:
    """The run's :class:`SeededWeights` in a temporary folder removed when the block ends; None when the run has a
    weights file of its own (``--weights``), or spans machines (``--nnodes``: another node's ranks could not read
    this machine's file)."""
    if settings.weights_path is not None or settings.nodes > 1:
        yield None
        return
    with run_folder(WEIGHTS_PREFIX) as folder:
        yield SeededWeights(folder, settings.seed)


def run_comparison_group(group: Sequence[Case], settings: Settings, parity: Mapping[ParityPair, str]) -> Settled:
    """Run one comparison group's minimum rounds on this machine, back to back, and return its outcomes (the cells
    it could not run among them). The Ray executor calls this on the node that runs the group."""
    settled, rounds = open_comparison_group(group, settings, parity)
    if rounds is None:
        return settled
    try:
        with export_cache(rounds.exports):
            run_rounds(rounds, settings.rounds)
    finally:
        rounds.close()
    return settled + minimum_outcomes(rounds, settings, local=False)


def open_comparison_group(
    group: Sequence[Case], settings: Settings, parity: Mapping[ParityPair, str], *, weights: SeededWeights | None = None
) -> tuple[Settled, GroupRun | None]:
    """Ready one comparison group for its rounds on this machine, running none yet: cells whose runtime or model is
    not available here are ``skipped`` with the reason, cells of a pair that failed parity earlier are ``mismatch``
    without running; the others get a :class:`fwbench.runner.scheduler.GroupRun`, checking parity where ``parity``
    has not settled it, with an export cache of its own that outlives a round when a runtime of it exports an
    artefact (the caller closes it: :meth:`GroupRun.close`). Returns the outcomes of the cells that do not run and
    the group's rounds (None: nothing to run)."""
    started = time.monotonic()
    settled: Settled = []
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
    if not runnable:
        return settled, None
    checks = {case.key: parity_pair(case) not in parity for case in runnable}
    weights_path = settings.weights_path
    if weights is not None and get_phase(runnable[0].phase).uses_model:  # a group shares its model and phase
        weights_path = weights.path(runnable[0].model, runnable[0].phase)
    rounds = GroupRun(runnable, settings, checks, weights_path)
    if any(get_runtime(case.runtime).artefact for case in runnable):
        rounds.keep_exports()  # one export serves every round of the group, whenever each runs
    for case in runnable:
        if parity_pair(case) in parity:
            rounds.notes[case.key] = {"parity_checked_by": parity[parity_pair(case)]}
    rounds.setup_s = time.monotonic() - started  # the cells share the group's time (each round adds its own)
    return settled, rounds


def run_group_round(rounds: GroupRun) -> None:
    """The group's next round, its engines' artefacts in the group's export cache."""
    with export_cache(rounds.exports):
        rounds.run_round()


def minimum_outcomes(rounds: GroupRun, settings: Settings, *, local: bool) -> Settled:
    """A group's outcomes once its minimum rounds ran, each with the wall seconds its cell took of the group's time,
    with why it gets no more rounds where that is known already (:func:`fwbench.runner.extra_rounds.minimum_only`)."""
    only = minimum_only(settings, local=local)
    stop = None if only is None else RoundsStop(only, rounds.rounds_run)
    return [(outcome, rounds.cell_wall_s) for outcome in rounds.outcomes(stop)]


def settle_parity(parity: Parity, settled: Settled) -> None:
    """Record in ``parity`` the pairs that ``settled`` (a group's outcomes) checked: 'mismatch', or the key of the
    cell that passed. A mismatch found by a cell that checked parity itself wins over a pass recorded meanwhile
    (groups that ran at the same time on a cluster each checked the pair)."""
    for outcome, _ in settled:
        pair = parity_pair(outcome.case)
        if parity.get(pair) == "mismatch" or "parity_checked_by" in outcome.details:
            continue
        if outcome.status == "mismatch":
            parity[pair] = "mismatch"
        elif outcome.status == "ok":
            parity.setdefault(pair, outcome.case.key)


def check_disk_full(outcomes: Sequence[CellOutcome]) -> None:
    """DiskFull when a worker's write found no room (its export cache, a trace, ...): the group is not stored."""
    for outcome in outcomes:
        report = outcome.details.get("disk_full")
        if report and stops_the_sweep(report):
            raise DiskFull.from_report(report, f"the files of {outcome.case.label()}")


class Recorder:
    """Stores the outcomes of a run as they arrive, one transaction per group, telling ``listener`` of each."""

    def __init__(self, store: Store, run_id: int, plan: Plan, listener: Listener | None) -> None:
        self.store, self.run_id, self.plan, self.listener = store, run_id, plan, listener
        self.outcomes: list[CellOutcome] = []

    def record(self, settled: Settled, machine: dict[str, Any] | None, *, final: bool = True) -> None:
        """Store outcomes in one transaction, each in place of the run's row for its cell where it has one (a group
        spread over a window stores its cells after every round); ``final``: their cells are done, and the listener
        hears of each. DiskFull (nothing of them stored, ``--resume`` runs the group again) when a worker's write
        found no room (its export cache, a trace, ...) or the database's did."""
        check_disk_full([outcome for outcome, _ in settled])
        settings = self.plan.settings
        with self.store.transaction():
            for outcome, wall_s in settled:
                if not store_outcome(self.store, self.run_id, outcome, settings, wall_s, machine):
                    store_outcome(self.store, self.run_id, outcome, settings, wall_s, machine, replace=True)
        self._keep([outcome for outcome, _ in settled])
        if final and self.listener is not None:
            for outcome, _ in settled:
                self.listener(outcome)

    def replace(self, outcomes: Sequence[CellOutcome], wall_s: float, machine: dict[str, Any] | None) -> None:
        """Store a group's cells again, in place, each charged ``wall_s`` (their group ran another round, or now
        knows why it stopped), in one transaction; DiskFull, before anything is written, when a worker's write found
        no room. The listener is not told again."""
        check_disk_full(outcomes)
        with self.store.transaction():
            for outcome in outcomes:
                store_outcome(self.store, self.run_id, outcome, self.plan.settings, wall_s, machine, replace=True)
        self._keep(outcomes)

    def _keep(self, outcomes: Sequence[CellOutcome]) -> None:
        """Hold ``outcomes`` as their cells' latest, in place of any held before."""
        latest = {outcome.case.key: outcome for outcome in outcomes}
        self.outcomes = [latest.pop(o.case.key, o) for o in self.outcomes] + list(latest.values())

    def in_plan_order(self) -> list[CellOutcome]:
        """The outcomes stored so far, in plan order."""
        keys = [s.case.key for s in self.plan.skipped] + [c.key for c in self.plan.cases]
        order = {key: i for i, key in enumerate(keys)}
        return sorted(self.outcomes, key=lambda outcome: order[outcome.case.key])


def pending_groups(store: Store, run_id: int, plan: Plan) -> list[tuple[list[Case], list[SkippedCase]]]:
    """The plan's comparison groups that run ``run_id`` has not finished: each group's cells to run (no status yet, or
    fewer than the minimum rounds: a window the run was stopped in) and the plan's skipped cells of the same group
    (stored with the group, on the machine that ran it)."""
    done = store.done_keys(run_id, plan.settings.rounds)
    skipped: dict[str, list[SkippedCase]] = {}
    for item in plan.skipped:
        if item.case.key not in done:
            skipped.setdefault(group_key(item.case), []).append(item)
    groups = [
        (group, skipped.pop(group_key(group[0]), []))
        for group in comparison_groups([c for c in plan.cases if c.key not in done])
    ]
    groups.extend(([], items) for items in skipped.values())  # groups with nothing to run
    return groups


Pending = list[tuple[list[Case], list[SkippedCase]]]


def spread_windows(groups: Pending, settings: Settings) -> list[Pending]:
    """``groups`` cut, in order, into windows whose cells' estimated seconds (:func:`fwbench.runner.phases.estimate_s`)
    add up to at most ``settings.spread_s`` (each window at least one group): the groups of a window run their
    minimum rounds in turn (:class:`Window`)."""
    windows: list[Pending] = []
    total = 0.0
    for group in groups:
        seconds = estimate_s(group[0], settings)
        if windows and total + seconds <= settings.spread_s:
            windows[-1].append(group)
            total += seconds
        else:
            windows.append([group])
            total = seconds
    return windows


def execute(
    store: Store, run_id: int, plan: Plan, listener: Listener | None = None, hear: RoundListener | None = None
) -> list[CellOutcome]:
    """Run every cell of ``plan`` that run ``run_id`` has not finished, on this machine, window by window of
    comparison groups (:func:`spread_windows`, :class:`Window`): each group's cells are stored after each of its
    rounds, and ``listener`` hears of each cell once its minimum rounds ran. Then, with a budget, extra rounds where
    the run's verdicts are still open (:mod:`fwbench.runner.extra_rounds`; each group's cells stored again after its
    round and once more with why it stopped; ``hear`` told of each round, and of each round of a window's groups).
    Returns the outcomes in plan order.

    Parity is checked once per (model, runtime, dtype, device) in a run, by the first cell of the pair that
    runs; once a pair has failed it, its other cells are stored as ``mismatch`` without running.
    """
    started = time.monotonic()
    remove_stale()  # the folders of runs killed before they could remove them
    parity = stored_parity(store, run_id, plan.settings.rounds)
    machine = machine_record()
    recorder = Recorder(store, run_id, plan, listener)
    more: list[GroupRun] = []  # the groups that may get extra rounds, each closed (its export cache) when the run ends
    with seeded_weights(plan.settings) as weights, model_exports():
        try:
            for window in spread_windows(pending_groups(store, run_id, plan), plan.settings):
                window_run = Window(window, plan.settings, parity, recorder, machine, weights, hear)
                more += window_run.run()
            if more:
                _spend_budget(more, recorder, plan.settings, started, machine, hear)
        finally:
            for rounds in more:
                rounds.close()
    return recorder.in_plan_order()


class Window:
    """One window of comparison groups (:func:`spread_windows`) running their minimum rounds in turn: round 1 of each
    group in order, round 2 in the reverse order, and so on, so that a machine drifting over the window's minutes
    shifts each group's rounds alike (a linear drift moves every group's mean by nearly the same). A group's cells are
    stored after each of its rounds (parity settled by its first), the listener told once its last minimum round
    ran."""

    def __init__(
        self,
        groups: Pending,
        settings: Settings,
        parity: Parity,
        recorder: Recorder,
        machine: dict[str, Any] | None,
        weights: SeededWeights | None,
        hear: RoundListener | None,
    ) -> None:
        self.pending, self.settings, self.parity, self.recorder = groups, settings, parity, recorder
        self.machine, self.weights, self.hear = machine, weights, hear
        self.groups: list[GroupRun] = []  # the window's groups still open: closed after their last round, unless
        # they may get extra rounds

    def run(self) -> list[GroupRun]:
        """Every round of the window. Returns the groups that may get extra rounds (the caller closes them); the
        others are closed after their last round, or, should a round be interrupted, all of them then (their export
        caches gone)."""
        try:
            return self._rounds()
        except BaseException:
            for group_run in self.groups:
                group_run.close()
            raise

    def _rounds(self) -> list[GroupRun]:
        """The window's rounds, group after group in turn; the groups still open after them."""
        rounds = self.settings.rounds
        running = sum(1 for cases, _ in self.pending if cases)
        slots: list[GroupRun | None] = []
        for round_index in range(rounds):
            if running > 1 and rounds > 1 and self.hear is not None:
                self.hear(f"round {round_index + 1} of {rounds}, {running} comparison groups in turn")
            order = range(len(self.pending)) if round_index % 2 == 0 else reversed(range(len(self.pending)))
            for position in order:
                if round_index == 0:
                    slots.append(self._open(*self.pending[position]))
                group_run = slots[position]
                if group_run is not None:
                    self._round(group_run, round_index)
        return list(self.groups)  # the groups still open

    def _open(self, group: list[Case], skipped: list[SkippedCase]) -> GroupRun | None:
        """Ready a group (its cells that do not run stored at once, as done); None when none of it runs."""
        settled = skipped_outcomes(skipped)
        rounds = None
        if group:
            outcomes, rounds = open_comparison_group(group, self.settings, self.parity, weights=self.weights)
            settled += outcomes
            if rounds is not None:
                self.groups.append(rounds)
        if settled:
            settle_parity(self.parity, settled)
            self.recorder.record(settled, self.machine)
        return rounds

    def _round(self, group_run: GroupRun, round_index: int) -> None:
        """The group's round ``round_index`` (none when every cell of it failed), its cells stored after it; after
        its last, the group is closed unless it may get extra rounds."""
        if round_index == 0 or group_run.active:  # a group whose every cell failed runs no more
            run_group_round(group_run)
        if round_index == 0:
            settle_parity(self.parity, [(outcome, 0.0) for outcome in group_run.outcomes()])
        if round_index + 1 < self.settings.rounds:
            settled = [(outcome, group_run.cell_wall_s) for outcome in group_run.outcomes()]
            self.recorder.record(settled, self.machine, final=False)
            return
        self.recorder.record(minimum_outcomes(group_run, self.settings, local=True), self.machine)
        if minimum_only(self.settings, local=True) is not None or not group_run.active:
            group_run.close()
            self.groups.remove(group_run)


def _spend_budget(
    groups: Sequence[GroupRun],
    recorder: Recorder,
    settings: Settings,
    started: float,
    machine: dict[str, Any] | None,
    hear: RoundListener | None,
) -> None:
    """Extra rounds for ``groups`` (:func:`fwbench.runner.extra_rounds.spend_budget`), each group's cells stored
    again after its round, and once more with why it stopped."""

    def extra_round(rounds: GroupRun) -> None:
        with export_cache(rounds.exports):  # what the group's first rounds exported
            rounds.run_round()
        recorder.replace(rounds.outcomes(), rounds.cell_wall_s, machine)

    def read_run() -> list[ResultRecord]:
        return recorder.store.results([recorder.run_id])

    stops = spend_budget(groups, read_run, extra_round, settings, started, hear)  # closes each group's cache
    for rounds in groups:
        if rounds.key in stops:
            recorder.replace(rounds.outcomes(stops[rounds.key]), rounds.cell_wall_s, machine)
