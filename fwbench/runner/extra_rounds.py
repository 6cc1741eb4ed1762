"""Extra rounds where the verdict is still open (``--budget``, ``--target-ci``, ``--max-rounds``).

Once every comparison group of a run has its minimum rounds (``--rounds``), the manager reads the run back (each
interval moderated over the run's cells, :mod:`fwbench.store.moderation`) and asks, group by group, how wide its
widest 95% CI still is: of a speed-up over the group's baseline (the report's default: ``torch:eager`` when the
group has it, else its first runtime), or of the cell time in a group with one runtime. While the run's wall time
allows, the group whose widest CI is widest against ``--target-ci`` gets one more round (fresh workers, the same
interleaving), its cells are stored again with every round, and the run is read again: one round moves the
group's own CI and, through the prior, every other one. A group stops at the first of: its widest CI within the
target (``target``), ``--max-rounds`` rounds (``max-rounds``), or a next round that would end after the budget
(``budget``: its cost is its last round's wall time). Without a budget each group runs its minimum rounds
(``no-budget``). Why each group stopped is stored with its cells (:class:`fwbench.details.RoundsStop`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from fwbench.details import RoundsStop
from fwbench.report.summary import DEFAULT_BASELINE, row_ratio
from fwbench.runner.scheduler import GroupRun
from fwbench.spec import Settings
from fwbench.store import ResultRecord

RoundListener = Callable[[str], None]  # hears one line per extra round


def relative_half_width(value: float | None, low: float | None, high: float | None) -> float | None:
    """Half a CI's width over its estimate (0.05 = ±5%); None without a CI or a positive estimate."""
    if value is None or low is None or high is None or not value > 0:
        return None
    return (high - low) / 2 / value


def group_widest(rows: Sequence[ResultRecord]) -> float | None:
    """The widest relative CI half-width of one comparison group's ``ok`` cells (``rows``, read with the run's
    priors): of each speed-up over the group's baseline, or of the cell time when one cell is ``ok``; None when
    none has a CI (fewer than 3 rounds)."""
    ok = [row for row in rows if row.status == "ok"]
    if len(ok) == 1:
        return relative_half_width(ok[0].median_s, ok[0].ci_low_s, ok[0].ci_high_s)
    if not ok:
        return None
    baseline = next((row for row in ok if row.runtime == DEFAULT_BASELINE), ok[0])
    widths = []
    for row in ok:
        if row is baseline:
            continue
        ratio = row_ratio(baseline, row)
        width = None if ratio is None else relative_half_width(ratio.ratio, ratio.ci_low, ratio.ci_high)
        if width is not None:
            widths.append(width)
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


def choose(
    groups: Sequence[GroupRun], widest: Mapping[str, float | None], settings: Settings, left_s: float | None
) -> Choice:
    """Of ``groups`` (none stopped yet), the one whose widest CI is widest against the target among those whose next
    round fits in ``left_s`` seconds (None: no budget), and the groups that stop: target met, the round limit, a
    round that does not fit (it never will: time only passes), or no budget. A group with no CI yet (fewer than 3
    rounds) counts as infinitely wide."""
    stops: dict[str, RoundsStop] = {}
    candidates: list[tuple[float, GroupRun]] = []
    for group in groups:
        width = widest.get(group.key)

        def stop(reason: str, group: GroupRun = group, width: float | None = width) -> None:
            stops[group.key] = RoundsStop(reason, group.rounds_run, width, settings.target_ci)

        if width is not None and width <= settings.target_ci:
            stop("target")
        elif left_s is None:
            stop("no-budget")
        elif group.rounds_run >= settings.round_limit:
            stop("max-rounds")
        elif not group.round_wall_s or group.round_wall_s[-1] > left_s:
            stop("budget")
        else:
            candidates.append((math.inf if width is None else width / settings.target_ci, group))
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
    Returns why each group stopped, by group key (a group with no cell left to run has none)."""
    stopped: dict[str, RoundsStop] = {}
    while True:
        open_groups = [group for group in groups if group.key not in stopped and group.active]
        if not open_groups:
            return stopped
        left_s = None if settings.budget_s is None else settings.budget_s - (time.monotonic() - started)
        widest = widest_by_group(read_run())
        choice = choose(open_groups, widest, settings, left_s)
        stopped.update(choice.stops)
        group = choice.group
        if group is None:
            return stopped
        if hear is not None:
            hear(_announce(group, widest.get(group.key), settings))
        extra_round(group)


def _announce(group: GroupRun, width: float | None, settings: Settings) -> str:
    """``extra round 4 of mlp inference b=1 fp32 (7 runtimes): widest CI ±7.3% > ±5.0%``."""
    case = group.cases[0]
    what = f"{case.model} {case.phase} {case.shape} {case.dtype} ({len(group.active)} runtimes)"
    wide = "no CI yet" if width is None else f"widest CI ±{width:.1%} > ±{settings.target_ci:.1%}"
    return f"extra round {group.rounds_run + 1} of {what}: {wide}"
