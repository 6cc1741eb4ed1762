"""Where a run's wall time went: how much of it the timed blocks measured, and what the workers spent the rest on.

Read from what every cell stores: its timed blocks (``Block.seconds``: the calls inside the timer), its share of its
comparison group's wall time (``ResultRecord.wall_s``: the group's seconds, worker start to the last stored cell,
over its cells), and each round's worker stages (``details.round_details[].stage_seconds``, else the cell's
``stage_seconds``). The stage seconds are worker-seconds: the workers of an interleaved group live side by side and
mostly wait for their turn in stage ``timing``, so they add up to more than the wall time; the timed blocks run one
at a time and never do. Cells that did not end ``ok`` count their wall time but no blocks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fwbench.store import ResultRecord
from fwbench.units import format_percent, format_seconds

# The worker's stages (runner.messages.STAGES) as the breakdown names them, in the order a worker goes through them.
STAGE_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("start-up and import", ("start", "import")),
    ("build", ("build",)),
    ("compile", ("compile",)),
    ("first call", ("first_call",)),
    ("warm-up", ("warmup",)),
    ("timing", ("timing", "fit", "profile")),  # the blocks, calibration and the waits for a turn; fit's epochs
    ("parity", ("parity", "evaluate")),
    ("kernel probe", ("kernels",)),
)


@dataclass(frozen=True)
class WallTime:
    """A run's (or any set of cells') wall time and what measured it. ``wall_s``: the comparison groups' wall time
    (the cells' ``wall_s`` summed; None when no cell stored one); ``measured_s``: the timed blocks' seconds;
    ``stage_s``: worker-seconds by stage group (:data:`STAGE_GROUPS`), summed over cells and rounds."""

    wall_s: float | None
    measured_s: float
    stage_s: Mapping[str, float] = field(default_factory=dict)

    @property
    def measured_fraction(self) -> float | None:
        """The share of the wall time inside timed blocks; None without a wall time."""
        return self.measured_s / self.wall_s if self.wall_s else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "wall_s": self.wall_s,
            "measured_s": self.measured_s,
            "measured_fraction": self.measured_fraction,
            "worker_stage_s": dict(self.stage_s),
        }


def _round_stages(row: ResultRecord) -> Iterable[Mapping[str, float]]:
    """Each round's worker stage seconds (the cell's own when it stored no rounds)."""
    rounds = [r.stage_seconds for r in row.interleaving.rounds if r.stage_seconds is not None]
    if rounds:
        return [stages.seconds for stages in rounds]
    return [row.stage_seconds.seconds] if row.stage_seconds is not None else []


def wall_time(results: Sequence[ResultRecord]) -> WallTime:
    """The :class:`WallTime` of ``results`` (typically one run's cells)."""
    walls = [row.wall_s for row in results if row.wall_s is not None]
    measured = sum(block.seconds for row in results for block in row.blocks)
    stage_s = dict.fromkeys((name for name, _ in STAGE_GROUPS), 0.0)
    for row in results:
        for seconds in _round_stages(row):
            for name, stages in STAGE_GROUPS:
                stage_s[name] += sum(seconds.get(stage, 0.0) for stage in stages)
    return WallTime(sum(walls) if walls else None, measured, {k: v for k, v in stage_s.items() if v > 0})


def _seconds(value: float) -> str:
    """Seconds for this line: whole seconds from 100 s on (``1330 s``, not ``1.33e+03 s``)."""
    return f"{value:.0f} s" if value >= 100 else format_seconds(value)


def wall_time_line(wall: WallTime) -> str | None:
    """``measured 35.5 s of 380 s of wall time (9%) in timed blocks; worker-seconds by stage ...``; None without a
    wall time."""
    fraction = wall.measured_fraction
    if wall.wall_s is None or fraction is None:
        return None
    stages = ", ".join(f"{name} {_seconds(seconds)}" for name, seconds in wall.stage_s.items())
    line = (
        f"measured {_seconds(wall.measured_s)} of {_seconds(wall.wall_s)} of the comparison groups' wall "
        f"time ({fraction:.0%}) in timed blocks"
    )
    if stages:
        line += f"; worker-seconds by stage (the workers of a group overlap, mostly waiting in timing): {stages}"
    return line


STOP_PHRASES = {  # every reason in fwbench.details.STOP_REASONS
    "target": "met it",
    "budget": "stopped on the budget",
    "max-rounds": "reached the round limit",
    "failure": "stopped after a worker failed in an extra round",
    "no-budget": "had no budget (their minimum rounds only)",
    "no-ci": "had fewer than 3 rounds (no CI to aim at)",
    "protocol": "ran the hf2019 protocol (its blocks are fixed)",
    "cluster": "ran on Ray nodes (extra rounds are given on the local machine only)",
}


def rounds_stop_line(results: Sequence[ResultRecord]) -> str | None:
    """``rounds per comparison group 3–7 (target: the widest speed-up CI within ±5%): 3 groups met it, 2 groups stopped
    on the budget``, from each group's stored :class:`fwbench.details.RoundsStop`; None when no cell stored one."""
    stops = {
        (row.run_id, row.group_key): stop
        for row in results
        if row.group_key is not None and (stop := row.interleaving.stop) is not None
    }
    if not stops:
        return None
    rounds = sorted(stop.rounds for stop in stops.values())
    span = str(rounds[0]) if rounds[0] == rounds[-1] else f"{rounds[0]}–{rounds[-1]}"
    counts = {reason: sum(stop.reason == reason for stop in stops.values()) for reason in STOP_PHRASES}
    parts = [
        f"{count} group{'s' if count != 1 else ''} {STOP_PHRASES[reason]}" for reason, count in counts.items() if count
    ]
    target = next((stop.target for stop in stops.values() if stop.target is not None), None)
    aim = "" if target is None else f" (target: the widest speed-up CI within ±{format_percent(target)})"
    return f"rounds per comparison group {span}{aim}: {', '.join(parts)}"
