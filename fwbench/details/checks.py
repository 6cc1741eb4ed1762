"""The worker's checks of a cell and its training loop: ``details.parity``, ``details.precision`` and
``details.training`` (with each step's part of the loop)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from fwbench.details.parse import as_dict, as_float, as_int, as_str, strs


@dataclass(frozen=True)
class OutputError:
    """One output's error against the float64 reference: relative L2 and max-abs (None: not stored)."""

    rel_l2: float | None = None
    max_abs: float | None = None


@dataclass(frozen=True)
class FirstDivergence:
    """``details.parity.divergence.first`` of a mismatch: the first checkpoint (or output) over its share of the
    tolerance (fwbench.runner.divergence), its relative L2 error (None: not finite) and that share."""

    name: str
    rel_l2: float | None
    limit: float | None

    @classmethod
    def parse(cls, raw: Any) -> FirstDivergence | None:
        first = as_dict(as_dict(raw).get("first"))
        name = as_str(first.get("name"))
        return None if name is None else cls(name, as_float(first.get("rel_l2")), as_float(first.get("limit")))


@dataclass(frozen=True)
class ParityCheck:
    """``details.parity``: the check of one cell's outputs (inference) or first-step loss (training) against
    the float64 reference. ``ok`` None: the stored check has no verdict. ``shape``: (batch, seq or None)
    it was checked at; ``outputs``: each output's error, by output name, in stored order; ``first_divergence``: where
    a mismatch starts (None: the check passed, or the runtime has no checkpoints)."""

    ok: bool | None = None
    reference: str | None = None
    tolerance_rel_l2: float | None = None
    checked: str | None = None
    shape: tuple[int | None, ...] = ()
    outputs: Mapping[str, OutputError] = field(default_factory=dict)
    reference_loss: float | None = None
    first_divergence: FirstDivergence | None = None

    @property
    def passed(self) -> bool:
        """The check ran and passed."""
        return bool(self.ok)

    @property
    def worst_rel_l2(self) -> float:
        """The largest relative L2 error over the outputs (an output without one counts 0; 0 without outputs)."""
        return max((o.rel_l2 or 0.0 for o in self.outputs.values()), default=0.0)

    @classmethod
    def parse(cls, raw: Any) -> ParityCheck | None:
        """The check stored as ``raw``; None when there is none (not a JSON object)."""
        if not isinstance(raw, dict):
            return None
        outputs = {
            str(name): OutputError(as_float(v.get("rel_l2")), as_float(v.get("max_abs")))
            for name, v in as_dict(raw.get("outputs")).items()
            if isinstance(v, dict)
        }
        shape = raw.get("shape")
        return cls(
            ok=bool(raw["ok"]) if "ok" in raw else None,
            reference=as_str(raw.get("reference")),
            tolerance_rel_l2=as_float(raw.get("tolerance_rel_l2")),
            checked=as_str(raw.get("checked")),
            shape=tuple(as_int(s) for s in shape) if isinstance(shape, list) else (),
            outputs=outputs,
            reference_loss=as_float(raw.get("reference_loss")),
            first_divergence=FirstDivergence.parse(raw.get("divergence")),
        )


@dataclass(frozen=True)
class PrecisionCheck:
    """``details.precision``: the policy a cell ran under (its dtype, fwbench.precision) and what the framework's
    own graph showed: op class → the dtypes it read (``observable`` False where the runtime cannot be looked
    into; ``error`` when looking failed), and each op class that did not compute as the policy says."""

    policy: str | None = None
    observable: bool = False
    observed: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    mismatches: tuple[str, ...] = ()
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """As the worker stores it: ``observed`` null where the runtime could not be looked into, ``error`` only
        when looking failed."""
        out: dict[str, Any] = {
            "policy": self.policy,
            "observed": {op: list(dtypes) for op, dtypes in self.observed.items()} if self.observable else None,
            "mismatches": list(self.mismatches),
        }
        if self.error is not None:
            out["error"] = self.error
        return out

    @classmethod
    def parse(cls, raw: Any) -> PrecisionCheck | None:
        """The check stored as ``raw``; None when there is none (not a JSON object)."""
        if not isinstance(raw, dict):
            return None
        observed = {
            str(op): tuple(str(d) for d in dtypes)
            for op, dtypes in as_dict(raw.get("observed")).items()
            if isinstance(dtypes, list)
        }
        return cls(
            policy=as_str(raw.get("policy")),
            observable=isinstance(raw.get("observed"), dict),
            observed=observed,
            mismatches=strs(raw.get("mismatches")) or (),
            error=as_str(raw.get("error")),
        )


@dataclass(frozen=True)
class StepLossParts:
    """How many optimizer steps of a training cell's loop were which part, in the order they ran."""

    first_call: int = 0
    warmup: int = 0
    calibration: int = 0
    timed: int = 0

    @property
    def before_timed(self) -> int:
        """Steps run before the first timed one (first call, warm-up, the timer's calibration)."""
        return self.first_call + self.warmup + self.calibration

    def to_dict(self) -> dict[str, int]:
        """As stored (``details_json`` keeps keys sorted)."""
        return {
            "calibration": self.calibration,
            "first_call": self.first_call,
            "timed": self.timed,
            "warmup": self.warmup,
        }

    @classmethod
    def parse(cls, raw: Any) -> StepLossParts | None:
        if not isinstance(raw, dict):
            return None
        return cls(**{f.name: as_int(raw.get(f.name)) or 0 for f in fields(cls)})


@dataclass(frozen=True)
class TrainingDetails:
    """``details.training`` of a training cell: the optimizer, the first (before any update) and final loss,
    and every step's loss in the order the steps ran (``step_loss_parts`` says which step was which)."""

    optimizer: dict[str, Any] | None = None
    loss: str | None = None
    first_loss: float | None = None
    final_loss: float | None = None
    counted_steps_before_final: int | None = None
    step_losses: tuple[float, ...] | None = None
    step_loss_parts: StepLossParts | None = None
    samples_per_step: int | None = None
    tokens_per_step: int | None = None

    @classmethod
    def parse(cls, raw: Any) -> TrainingDetails | None:
        """None without training details (absent or empty)."""
        if not isinstance(raw, dict) or not raw:
            return None
        losses = raw.get("step_losses")
        optimizer = raw.get("optimizer")
        return cls(
            optimizer=optimizer if isinstance(optimizer, dict) else None,
            loss=as_str(raw.get("loss")),
            first_loss=as_float(raw.get("first_loss")),
            final_loss=as_float(raw.get("final_loss")),
            counted_steps_before_final=as_int(raw.get("counted_steps_before_final")),
            step_losses=None if not isinstance(losses, list) else tuple(float(x) for x in losses),
            step_loss_parts=StepLossParts.parse(raw.get("step_loss_parts")),
            samples_per_step=as_int(raw.get("samples_per_step")),
            tokens_per_step=as_int(raw.get("tokens_per_step")),
        )
