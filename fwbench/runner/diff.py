"""``fwbench diff``: one model, one input and one set of weights in several runtimes, each in its own worker; every
checkpoint (fwbench.models.checkpoints) and output of each runtime against the float64 reference, and the first
one over its share of the tolerance (fwbench.runner.divergence) named per runtime. No framework is imported here."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fwbench.models import get_model
from fwbench.models.checkpoints import missing_checkpoints
from fwbench.models.weights_io import load_weights
from fwbench.runner.divergence import CHECKPOINT_KEY, TAPPED_KEY, LayerError, first_divergence, layer_errors
from fwbench.runner.tolerances import parity_tolerance, relative_errors
from fwbench.runner.verify import inference_arrays
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

    @property
    def first(self) -> LayerError | None:
        return first_divergence(list(self.layers))

    @property
    def failed(self) -> bool:
        """It diverged, or it did not run (a skipped runtime has not failed)."""
        return self.status not in ("ok", "skipped") or self.first is not None

    def to_dict(self) -> dict[str, Any]:
        first = self.first
        return {
            "runtime": self.runtime,
            "status": self.status,
            "reason": self.reason,
            "first_divergence": None if first is None else first.to_dict(),
            "checkpoints_unavailable": self.unavailable,
            "tapped_outputs_rel_l2": self.tapped_rel_l2,
            "layers": [layer.to_dict() for layer in self.layers],
        }


@dataclass(frozen=True)
class ModelDiff:
    """``fwbench diff`` of one model: the case it ran (phase, dtype, shape, its output tolerance), the model's
    checkpoints in order, and each runtime's :class:`RuntimeDiff`."""

    model: str
    phase: str
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
) -> ModelDiff:
    """Each runtime's checkpoints and outputs at one input (default: the model's parity shape) against the float64
    reference (SpecError for a model without one)."""
    description = get_model(model)
    default_batch, default_seq = description.parity_shape()
    batch = batch_size or default_batch
    seq = (seq_len or default_seq) if description.has_sequence else None
    weights = load_weights(description, weights_path) if weights_path else description.canonical_weights(settings.seed)
    arrays = description.make_inputs(batch, seq, settings.seed)
    reference_outputs = description.reference_forward(weights, arrays)
    if reference_outputs is None:
        raise SpecError(f"{model} has no float64 reference to compare with")
    reference_checkpoints = description.reference_checkpoints(weights, arrays) or {}
    del weights
    tolerance = parity_tolerance(model, dtype)
    results = []
    with tempfile.TemporaryDirectory(prefix="fwbench-diff-") as scratch:
        for runtime in runtimes:
            case = Case(model, runtime, batch_size=batch, seq_len=seq, dtype=dtype)
            got = inference_arrays(case, settings, weights_path, Path(scratch), checkpoints=True)
            if got.status != "ok":
                results.append(RuntimeDiff(runtime, got.status, got.reason))
                continue
            outputs = {name: got.arrays[name] for name in description.output_names if name in got.arrays}
            captured = {k[len(CHECKPOINT_KEY) :]: v for k, v in got.arrays.items() if k.startswith(CHECKPOINT_KEY)}
            tapped = {k[len(TAPPED_KEY) :]: v for k, v in got.arrays.items() if k.startswith(TAPPED_KEY)}
            unavailable = got.details.get("checkpoints_unavailable")
            if not captured and unavailable is None and reference_checkpoints:
                unavailable = "the runtime returned no checkpoints"
            differs = missing_checkpoints(tuple(reference_checkpoints), captured) if captured else None
            if differs:
                results.append(RuntimeDiff(runtime, "error", f"{runtime}: {differs}"))
                continue
            agreement = [relative_errors(tapped[n], outputs[n])[0] for n in outputs if n in tapped]
            results.append(
                RuntimeDiff(
                    runtime,
                    "ok",
                    layers=tuple(layer_errors(outputs, captured, reference_outputs, reference_checkpoints, tolerance)),
                    unavailable=unavailable,
                    tapped_rel_l2=max(agreement) if agreement else None,
                )
            )
    return ModelDiff(
        model,
        "inference",
        dtype,
        batch,
        seq,
        tolerance,
        tuple(reference_checkpoints),
        tuple(reference_outputs),
        tuple(results),
    )
