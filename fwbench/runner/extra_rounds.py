"""Extra rounds where the verdict is still open (``--budget``, ``--target-ci``, ``--max-rounds``).

Once every comparison group of a run has its minimum rounds (``--rounds``), the manager reads the run back (each
interval moderated over the run's cells, :mod:`fwbench.store.moderation`) and asks, group by group, how wide its
widest 95% CI still is: of a speed-up over the group's baseline (the report's default: ``torch:eager`` when the
group has it, else its first runtime), or, where it shows no speed-up, of its cells' times. While the run's wall
time allows, an open group gets one more round (fresh workers, the same interleaving), its cells are stored again,
in place, with every round, and the run is read again: one round moves the group's own CI and, through the prior,
every other one. A group stops at the first of: its widest CI within the target (``target``), ``--max-rounds``
rounds (``max-rounds``), a next round that would end after the budget (``budget``: its cost is its last round's
wall time), or a cell's worker failing in an extra round
(``failure``: the cell keeps its earlier rounds). Among open groups the next round goes to the one whose widest CI
is widest against the target per second its round costs. Without a budget (or with fewer than 3 rounds, the hf2019
protocol, or on a Ray node) each group runs its minimum rounds (:func:`minimum_only`). Why each group stopped is
stored with its cells (:class:`fwbench.details.RoundsStop`); a group whose cells all failed, or that was stored before
the run was interrupted, has none.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from fwbench.details import RoundsStop
from fwbench.measure.rounds import MIN_ROUNDS_FOR_CI
from fwbench.runner.scheduler import GroupRun
from fwbench.spec import Settings
from fwbench.speedups import DEFAULT_BASELINE, compare_cells, rel_half_width, relative_half_width, runtimes_in
from fwbench.store import ResultRecord
from fwbench.units import format_percent

RoundListener = Callable[[str], None]  # hears one line per extra round (and per round of a --spread window)


def group_widest(rows: Sequence[ResultRecord]) -> float | None:
    """The widest relative CI half-width that one comparison group's rows (read with the run's priors) show: of each
    speed-up over the group's baseline, cell by cell as the report pairs them (:func:`compare_cells`: a distributed
    group's process counts apart); where there is none (one runtime, or a baseline that did not end ``ok``), of its
    ``ok`` cells' times. None when nothing has a CI (fewer than 3 rounds)."""
    runtimes = runtimes_in(rows)
    if not runtimes:
        return None
    baseline = DEFAULT_BASELINE if DEFAULT_BASELINE in runtimes else runtimes[0]
    widths = [
        width
        for runtime in runtimes
        if runtime != baseline
        for cell in compare_cells(rows, baseline, runtime)
        if (width := relative_half_width(cell.ratio, cell.ci_low, cell.ci_high)) is not None
    ]
    if not widths:
        widths = [width for row in rows if row.status == "ok" and (width := rel_half_width(row))]
    return max(widths) if widths else None


def widest_by_group(rows: Sequence[ResultRecord]) -> dict[str, float | None]:
    """:func:`group_widest` of every comparison group among ``rows`` (a whole run), by group key."""
    groups: dict[str, list[ResultRecord]] = {}
    for row in rows:
        if row.group_key is not None:
            groups.setdefault(row.group_key, []).append(row)
    return {key: group_widest(cells) for key, cells in groups.items()}


@dataclass(frozen=True)
class Choice:
    """What to do next: the group to give a round (None: none), and the groups that stop now, with why."""

    group: GroupRun | None
    stops: dict[str, RoundsStop]


def minimum_only(settings: Settings, *, local: bool) -> str | None:
    """Why a group runs its minimum rounds only (a :class:`RoundsStop` reason), or None when it may get more:
    ``no-budget``, ``cluster`` (a Ray node runs it), ``no-ci`` (fewer than 3 rounds: no CI to aim at),
    ``protocol`` (hf2019 fixes its blocks), ``max-rounds`` (the limit is the minimum)."""
    if settings.budget_s is None:
        return "no-budget"
    if not local:
        return "cluster"
    if settings.rounds < MIN_ROUNDS_FOR_CI:
        return "no-ci"
    if settings.protocol == "hf2019":
        return "protocol"
    if settings.round_limit <= settings.rounds:
        return "max-rounds"
    return None


def choose(groups: Sequence[GroupRun], widest: Mapping[str, float | None], settings: Settings, left_s: float) -> Choice:
    """Of ``groups`` (none stopped yet), the one to give a round, and the groups that stop now: target met, the round
    limit, a cell that failed in an extra round, or a next round (costed at the group's last one) that would end
    after ``left_s`` more seconds (it never fits later: time only passes). The chosen group is the one whose widest
    CI is widest against the target per second of its round (one round narrows a CI by about the same share
    whatever its width, so this is the most narrowing per second); a group with no CI yet counts as infinitely
    wide."""
    stops: dict[str, RoundsStop] = {}
    candidates: list[tuple[float, GroupRun]] = []
    for group in groups:
        width = widest.get(group.key)

        def stop(reason: str, group: GroupRun = group, width: float | None = width) -> None:
            stops[group.key] = RoundsStop(reason, group.rounds_run, width, settings.target_ci)

        if group.extra_failed:
            stop("failure")
        elif width is not None and width <= settings.target_ci:
            stop("target")
        elif group.rounds_run >= settings.round_limit:
            stop("max-rounds")
        elif not group.round_wall_s or group.round_wall_s[-1] > left_s:
            stop("budget")
        else:
            open_by = math.inf if width is None else width / settings.target_ci
            candidates.append((open_by / max(group.round_wall_s[-1], 1e-3), group))
    if not candidates:
        return Choice(None, stops)
    _, chosen = max(candidates, key=lambda item: item[0])  # ties: the first in plan order
    return Choice(chosen, stops)


def spend_budget(
    groups: Sequence[GroupRun],
    read_run: Callable[[], Sequence[ResultRecord]],
    extra_round: Callable[[GroupRun], None],
    settings: Settings,
    started: float,
    hear: RoundListener | None = None,
) -> dict[str, RoundsStop]:
    """Give ``groups`` (each with its minimum rounds, stored) extra rounds while :func:`choose` picks one:
    ``read_run()`` reads the whole run back (moderated), ``extra_round(group)`` runs a group's next round and stores
    its cells again. ``started``: the run's start (``time.monotonic()``), which ``settings.budget_s`` counts from.
    Returns why each group stopped, by group key, each with its widest CI as the whole run, read at the end, gives
    it (the prior moves with every round: a group may end a little inside or outside the target it stopped at)."""
    if settings.budget_s is None:
        raise ValueError("extra rounds need a budget")
    stopped: dict[str, RoundsStop] = {}
    while True:
        open_groups = [group for group in groups if group.key not in stopped]
        widest = widest_by_group(read_run())
        left_s = settings.budget_s - (time.monotonic() - started)
        choice = choose(open_groups, widest, settings, left_s)
        stopped.update(choice.stops)
        for ended in open_groups:
            if ended.key in choice.stops:
                ended.close()  # its export cache: it runs no more
        chosen = choice.group
        if chosen is None:
            break
        if hear is not None:
            hear(_announce(chosen, widest.get(chosen.key), settings))
        extra_round(chosen)
    final = widest_by_group(read_run())
    rounds_run = {group.key: group.rounds_run for group in groups}
    return {
        key: dataclasses.replace(stop, rounds=rounds_run[key], widest=final.get(key)) for key, stop in stopped.items()
    }


def _announce(group: GroupRun, width: float | None, settings: Settings) -> str:
    """``extra round 4 of mlp inference b=1 fp32 (7 runtimes): widest CI ±7.3% > ±5.0%``."""
    case = group.cases[0]
    what = f"{case.model} {case.phase} {case.shape} {case.dtype} ({len(group.active)} runtimes)"
    wide = "no CI yet" if width is None else f"widest CI ±{width:.1%} > ±{format_percent(settings.target_ci)}"
    return f"extra round {group.rounds_run + 1} of {what}: {wide}"
