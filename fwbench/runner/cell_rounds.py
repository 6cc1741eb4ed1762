"""A cell's rounds and their merge: :class:`CellRounds` keeps what each round of one cell gave (its outcome, its
blocks, its noise totals, or the failure that ended it), and :func:`merge_rounds` makes them the cell's one stored
outcome (``fwbench.runner.scheduler`` runs the rounds; ``fwbench.runner.interleave`` runs an interleaved one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fwbench.details import ExtraRoundFailure, Interleaving, RoundDetail, StageSeconds
from fwbench.measure.environment import cpu_list_set
from fwbench.measure.noise import NoiseTotals
from fwbench.measure.rounds import Block, blocks_by_round, time_estimate
from fwbench.runner.outcome import CellOutcome, spread_fields
from fwbench.runner.phases import get_phase
from fwbench.spec import Case, Settings

# Checks of a cell's first round kept when a later round fails: the manager settled its pair's parity on them, so the
# other cells of the pair (``parity_checked_by`` this cell) find the check in the store.
CHECKS_KEPT_ON_FAILURE = ("parity", "precision")


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


def check_placement(outcome: CellOutcome, result: Mapping[str, Any]) -> CellOutcome:
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
