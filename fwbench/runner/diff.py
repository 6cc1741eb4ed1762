"""``fwbench diff``: one model, one input and one set of weights in several runtimes, each in its own worker; every
checkpoint (fwbench.models.checkpoints) and output of each runtime against the float64 reference, and the first
one over its share of the tolerance (fwbench.runner.divergence) named per runtime. ``--phase training`` adds a
second worker per runtime: its first training step's loss against the float64 reference loss, and the gradient of
every trained tensor against the first runtime's (there is no float64 gradient), the first one over the tolerance
named in backward order. No framework is imported here."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fwbench.models import get_model
from fwbench.models.base import ModelDescription
from fwbench.models.checkpoints import missing_checkpoints
from fwbench.runner.divergence import (
    CHECKPOINT_KEY,
    GRADIENT_KEY,
    TAPPED_KEY,
    LayerError,
    finite,
    first_divergence,
    gradient_errors,
    layer_errors,
)
from fwbench.runner.tolerances import PARITY_REL_L2_TOLERANCE, gradient_tolerance, parity_tolerance, relative_errors
from fwbench.runner.verify import WorkerArrays, verify_arrays, verify_shape, verify_weights
from fwbench.spec import Case, Dtype, Settings, SpecError


@dataclass(frozen=True)
class RuntimeDiff:
    """One runtime's errors at every checkpoint and output, in forward order (``layers``), or why it has none
    (``status`` other than ok, ``reason``). ``unavailable``: why it has its outputs only (an exported file).
    ``tapped_rel_l2``: the worst relative L2 error between the outputs of the program built with the checkpoints
    and those of the timed program (both compiled by the runtime: they should agree to rounding)."""

    runtime: str
    status: str
    reason: str | None = None
    layers: tuple[LayerError, ...] = ()
    unavailable: str | None = None
    tapped_rel_l2: float | None = None
    training: TrainingDiff | None = None  # --phase training

    @property
    def first(self) -> LayerError | None:
        return first_divergence(list(self.layers))

    @property
    def failed(self) -> bool:
        """It diverged, or it did not run (a skipped runtime has not failed)."""
        trained = self.training is not None and self.training.failed
        return self.status not in ("ok", "skipped") or self.first is not None or trained

    def to_dict(self) -> dict[str, Any]:
        first = self.first
        return {
            "runtime": self.runtime,
            "status": self.status,
            "reason": self.reason,
            "first_divergence": None if first is None else first.to_dict(),
            "checkpoints_unavailable": self.unavailable,
            "tapped_outputs_rel_l2": finite(self.tapped_rel_l2),
            "layers": [layer.to_dict() for layer in self.layers],
            **({} if self.training is None else {"training": self.training.to_dict()}),
        }


@dataclass(frozen=True)
class TrainingDiff:
    """One runtime's first training step: its loss's relative error against the float64 reference loss (within
    ``loss_tolerance``), and each trained tensor's gradient against ``against`` (the first runtime with gradients),
    in backward order; or why it has none (``status``, ``reason``)."""

    status: str
    reason: str | None = None
    loss: float | None = None
    loss_rel: float | None = None
    loss_tolerance: float | None = None
    against: str | None = None
    gradients: tuple[LayerError, ...] = ()

    @property
    def first(self) -> LayerError | None:
        return first_divergence(list(self.gradients))

    @property
    def loss_diverged(self) -> bool:
        return (
            self.loss_rel is not None and self.loss_tolerance is not None and not self.loss_rel <= self.loss_tolerance
        )

    @property
    def failed(self) -> bool:
        return self.status not in ("ok", "skipped") or self.loss_diverged or self.first is not None

    def to_dict(self) -> dict[str, Any]:
        first = self.first
        return {
            "status": self.status,
            "reason": self.reason,
            "loss": finite(self.loss),
            "loss_rel_to_reference": finite(self.loss_rel),
            "loss_tolerance": self.loss_tolerance,
            "gradients_against": self.against,
            "first_gradient_divergence": None if first is None else first.to_dict(),
            "gradients": [g.to_dict() for g in self.gradients],
        }


@dataclass(frozen=True)
class ModelDiff:
    """``fwbench diff`` of one model: the case it ran (phase, dtype, shape, its output tolerance), the model's
    checkpoints in order, and each runtime's :class:`RuntimeDiff`."""

    model: str
    phase: str  # inference, or training (the inference checkpoints and the first training step)
    dtype: str
    batch_size: int
    seq_len: int | None
    tolerance: float
    checkpoints: tuple[str, ...]
    outputs: tuple[str, ...]
    runtimes: tuple[RuntimeDiff, ...]

    @property
    def failed(self) -> bool:
        return any(runtime.failed for runtime in self.runtimes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "phase": self.phase,
            "dtype": self.dtype,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "tolerance_rel_l2": self.tolerance,
            "reference": "numpy-float64",
            "checkpoints": list(self.checkpoints),
            "outputs": list(self.outputs),
            "runtimes": [runtime.to_dict() for runtime in self.runtimes],
        }


def diff_model(
    model: str,
    runtimes: Sequence[str],
    settings: Settings,
    batch_size: int | None = None,
    seq_len: int | None = None,
    weights_path: Path | None = None,
    *,
    dtype: Dtype = "fp32",
    phase: str = "inference",
) -> ModelDiff:
    """Each runtime's checkpoints and outputs at one input (default: the model's parity shape) against the float64
    reference (SpecError for a model without one); ``phase`` training: also its first training step."""
    description = get_model(model)
    batch, seq = verify_shape(description, batch_size, seq_len)
    weights = verify_weights(description, weights_path, settings.seed)
    arrays = description.make_inputs(batch, seq, settings.seed)
    reference_outputs = description.reference_forward(weights, arrays)
    if reference_outputs is None:
        raise SpecError(f"{model} has no float64 reference to compare with")
    reference_checkpoints = description.reference_checkpoints(weights, arrays) or {}
    reference_loss = None
    if phase == "training":
        unsupported = description.training_unsupported()
        if unsupported:
            raise SpecError(unsupported)
        reference_loss = description.reference_loss(
            weights, arrays, description.make_targets(batch, seq, settings.seed)
        )
    del weights
    tolerance = parity_tolerance(model, dtype)
    results = []
    base: tuple[str, dict[str, Any]] | None = None  # the first runtime's gradients
    with tempfile.TemporaryDirectory(prefix="fwbench-diff-") as scratch:
        for runtime in runtimes:
            training = None
            if phase == "training":
                trained = verify_arrays(
                    Case(model, runtime, phase="training", batch_size=batch, seq_len=seq, dtype=dtype),
                    settings, weights_path, Path(scratch), checkpoints=True,
                )  # fmt: skip
                gradients = {k[len(GRADIENT_KEY) :]: v for k, v in trained.arrays.items() if k.startswith(GRADIENT_KEY)}
                if base is None and gradients:
                    base = (runtime, gradients)
                training = _training_diff(description, dtype, trained, gradients, reference_loss, base)
            case = Case(model, runtime, batch_size=batch, seq_len=seq, dtype=dtype)
            got = verify_arrays(case, settings, weights_path, Path(scratch), checkpoints=True)
            if got.status != "ok":
                results.append(RuntimeDiff(runtime, got.status, got.reason, training=training))
                continue
            outputs = {name: got.arrays[name] for name in description.output_names if name in got.arrays}
            captured = {k[len(CHECKPOINT_KEY) :]: v for k, v in got.arrays.items() if k.startswith(CHECKPOINT_KEY)}
            tapped = {k[len(TAPPED_KEY) :]: v for k, v in got.arrays.items() if k.startswith(TAPPED_KEY)}
            unavailable = got.details.get("checkpoints_unavailable")
            if not captured and unavailable is None and reference_checkpoints:
                unavailable = "the runtime returned no checkpoints"
            differs = missing_checkpoints(tuple(reference_checkpoints), captured) if captured else None
            if differs:
                results.append(RuntimeDiff(runtime, "error", f"{runtime}: {differs}", training=training))
                continue
            agreement = [relative_errors(tapped[n], outputs[n])[0] for n in outputs if n in tapped]
            results.append(
                RuntimeDiff(
                    runtime,
                    "ok",
                    layers=tuple(layer_errors(outputs, captured, reference_outputs, reference_checkpoints, tolerance)),
                    unavailable=unavailable,
                    tapped_rel_l2=max(agreement) if agreement else None,
                    training=training,
                )
            )
    return ModelDiff(
        model,
        phase,
        dtype,
        batch,
        seq,
        tolerance,
        tuple(reference_checkpoints),
        tuple(reference_outputs),
        tuple(results),
    )


def _training_diff(
    description: ModelDescription,
    dtype: str,
    got: WorkerArrays,
    gradients: dict[str, Any],
    reference_loss: float | None,
    base: tuple[str, dict[str, Any]] | None,
) -> TrainingDiff:
    """One runtime's first training step against the float64 loss and the first runtime's gradients."""
    if got.status != "ok":
        return TrainingDiff(got.status, got.reason)
    if not gradients:
        return TrainingDiff("skipped", got.details.get("gradients_unavailable") or "no gradients returned")
    loss = float(got.arrays["losses"][0])
    loss_rel = None if reference_loss is None else relative_errors(loss, reference_loss)[0]
    assert base is not None  # this runtime's gradients are the base when no earlier runtime had any
    order = [p.name for p in reversed(description.param_schema()) if p.name in base[1]]
    return TrainingDiff(
        "ok",
        loss=loss,
        loss_rel=loss_rel,
        loss_tolerance=PARITY_REL_L2_TOLERANCE[dtype],
        against=base[0],
        gradients=tuple(gradient_errors(gradients, base[1], order, gradient_tolerance(description.name, dtype))),
    )
