"""How the scheduler ran a cell's rounds: each round's worker figures, the interleaving sub-groups, why its
comparison group ran no more rounds (``details.rounds_stop``) and an extra round that failed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fwbench.details.compile import StageSeconds
from fwbench.details.parse import all_fields, as_float, as_int, as_str, each, ints, stored


@dataclass(frozen=True)
class RoundDetail:
    """One round of a cell, in ``details.round_details`` (``runner.cell_rounds.merge_rounds``): its worker's first
    call, calls per timed sample, resident peak and stage seconds, and whether its worker started side by side
    with the group's others (rounds after the first: its first call and stage seconds were then not measured with
    the machine to itself)."""

    first_call_s: float | None = None
    calls_per_sample: int | None = None
    peak_memory_bytes: int | None = None
    stage_seconds: StageSeconds | None = None
    started_together: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Every key, as the scheduler writes it."""
        return all_fields(self)

    @classmethod
    def parse(cls, raw: Any) -> RoundDetail | None:
        if not isinstance(raw, dict):
            return None
        return cls(
            first_call_s=as_float(raw.get("first_call_s")),
            calls_per_sample=as_int(raw.get("calls_per_sample")),
            peak_memory_bytes=as_int(raw.get("peak_memory_bytes")),
            stage_seconds=StageSeconds.parse(raw.get("stage_seconds")),
            started_together=raw.get("started_together") is True,
        )


STOP_REASONS = ("target", "budget", "max-rounds", "failure", "no-budget", "no-ci", "protocol", "cluster")


@dataclass(frozen=True)
class RoundsStop:
    """Why a cell's comparison group ran no more rounds (``runner.extra_rounds``), in ``details.rounds_stop``.
    ``reason``: ``target`` (its widest CI met the target), ``budget`` (the next round would not have fitted in the
    run's ``--budget``), ``max-rounds``, ``failure`` (a worker failed in its last extra round), or, its minimum
    rounds only: ``no-budget`` (the run had none), ``no-ci`` (fewer than 3 rounds: no CI to aim at), ``protocol``
    (hf2019 fixes its blocks) or ``cluster`` (it ran on a Ray node: extra rounds are given on the local machine).
    ``widest``: the group's widest relative CI half-width (0.05 = ±5%) as the whole run read at its end gives it — of
    a speed-up over its baseline, or, in a group that shows none, of a cell time; None when it had no CI. ``target``: the half-width
    aimed at. ``rounds``: the rounds the group ran."""

    reason: str
    rounds: int
    widest: float | None = None
    target: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Every key, as the manager writes it."""
        return all_fields(self)

    @classmethod
    def parse(cls, raw: Any) -> RoundsStop | None:
        """None for a cell that stored none (stored before extra rounds existed, or still waiting for them)."""
        if (
            not isinstance(raw, dict)
            or as_str(raw.get("reason")) not in STOP_REASONS
            or as_int(raw.get("rounds")) is None
        ):
            return None
        return cls(
            reason=str(raw["reason"]),
            rounds=int(raw["rounds"]),
            widest=as_float(raw.get("widest")),
            target=as_float(raw.get("target")),
        )


@dataclass(frozen=True)
class ExtraRoundFailure:
    """An extra round (``runner.extra_rounds``) in which a cell's worker failed, in ``details.extra_round_failure``:
    the round (from 1), the status it would have had and why. The cell keeps the rounds before it; its group gets
    no more."""

    round: int
    status: str
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Every key, as the scheduler writes it."""
        return all_fields(self)

    @classmethod
    def parse(cls, raw: Any) -> ExtraRoundFailure | None:
        if not isinstance(raw, dict) or as_int(raw.get("round")) is None or as_str(raw.get("status")) is None:
            return None
        return cls(round=int(raw["round"]), status=str(raw["status"]), reason=as_str(raw.get("reason")))


@dataclass(frozen=True)
class Interleaving:
    """How a cell's rounds ran (``runner.scheduler``): ``details.round_details``, each round's worker figures (a cell
    that ended ok), ``details.interleave_subgroups``, the sub-groups its comparison group was split into in each
    round when its workers did not all fit in memory together (stored only when some round was split), and
    ``details.rounds_stop``, why its group ran no more rounds, and ``details.extra_round_failure``, an extra round
    of the cell that failed. Empty for rows stored before these."""

    subgroups: tuple[int, ...] = ()
    rounds: tuple[RoundDetail, ...] = ()
    stop: RoundsStop | None = None
    extra_failure: ExtraRoundFailure | None = None

    @property
    def most_subgroups(self) -> int | None:
        """The most sub-groups a round was split into; None when no split was stored."""
        return max(self.subgroups) if self.subgroups else None

    def to_dict(self) -> dict[str, Any]:
        """The top-level details keys of what is set (``interleave_subgroups``, ``round_details``)."""
        out: dict[str, Any] = {}
        if self.subgroups:
            out["interleave_subgroups"] = list(self.subgroups)
        if self.rounds:
            out["round_details"] = stored(self.rounds)
        if self.stop is not None:
            out["rounds_stop"] = self.stop.to_dict()
        if self.extra_failure is not None:
            out["extra_round_failure"] = self.extra_failure.to_dict()
        return out

    @classmethod
    def from_details(cls, details: Mapping[str, Any]) -> Interleaving:
        """From a row's whole ``details`` (both are top-level keys); the empty record without them."""
        return cls(
            subgroups=ints(details.get("interleave_subgroups")) or (),
            rounds=each(RoundDetail.parse, details.get("round_details")),
            stop=RoundsStop.parse(details.get("rounds_stop")),
            extra_failure=ExtraRoundFailure.parse(details.get("extra_round_failure")),
        )
