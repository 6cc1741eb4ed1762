"""The scheduler: a plan's cells in *comparison groups* (cells that differ only by runtime), each group run in
``rounds`` fresh sets of workers, interleaved by default; a group's rounds (:class:`GroupRun`) and its sequential
rounds run here, an interleaved round in :mod:`fwbench.runner.interleave`, and a cell's rounds are merged into its
outcome by :mod:`fwbench.runner.cell_rounds`.

Interleaved (``Settings.interleave``, phases that allow it): the group's workers are alive together through a
round, each timing one block per cycle on the manager's command, one worker at a time, in an order drawn afresh
each cycle from a generator seeded by the run's seed, the group and the round (:func:`order_generator`); workers
that would not fit in memory together run in successive sub-groups.

Sequential (``interleave`` off): each cell of the group runs start to end in its own worker, in a seeded random
order per round, timed in one go as before.

Either way a cell whose worker fails (error, timeout, oom, a parity mismatch) keeps that status and is not run
again in later rounds; the others finish. The manager stores a group's cells together after each of its rounds
(``fwbench.runner.manager``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fwbench.details import Interleaving, RoundsStop
from fwbench.runner.cell_rounds import CellRounds, merge_rounds
from fwbench.runner.interleave import interleaved_round
from fwbench.runner.outcome import CellOutcome, run_worker
from fwbench.runner.phases import get_phase
from fwbench.runner.tempfolders import EXPORTS_PREFIX, run_folder
from fwbench.spec import Case, Settings, group_key


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
                self.cycle, count = interleaved_round(
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
            interleaved_round([case], cells, settings, checks, weights_path, round_index, rng, 0)
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
