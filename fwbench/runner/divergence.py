"""Where a runtime parts from the float64 reference: each checkpoint's error (fwbench.models.checkpoints) against its
share of the model's output tolerance, and the first checkpoint over its share.

The share: a model's outputs may be ``tolerance`` away from the reference (relative L2,
fwbench.runner.tolerances.parity_tolerance); the k-th of n checkpoints, in forward order, with the outputs as the
n+1-th step, may be ``tolerance · sqrt(k / (n + 1))`` away. Rounding errors of independent steps add up like a random
walk, so the budget grows with the square root of the depth and reaches the whole tolerance at the outputs. A fault
(a wrong epsilon, a transposed weight, another GELU) shows as a jump far above any share at the first checkpoint after
it; a runtime that only rounds more (bf16) shows a steady growth. No framework is imported here.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from fwbench.runner.tolerances import relative_errors

CHECKPOINT_KEY = "checkpoint/"  # prefix of a checkpoint's array in a verify output (.npz): checkpoint/<name>
TAPPED_KEY = "tapped/"  # prefix of an output of the program that returned the checkpoints: tapped/<name>
GRADIENT_KEY = "gradient/"  # prefix of a trained tensor's gradient in a training diff output: gradient/<name>
# Gradients have no float64 reference: each runtime's are compared with the first runtime's, tensor by tensor.
# A tensor's error is ‖g − g₀‖ / max(‖g₀‖, GRADIENT_FLOOR · the median tensor's ‖g₀‖): the attention key biases' exact
# gradient is 0 (softmax ignores a shift shared by every key), so theirs is rounding noise, ~1e-10 in fp32.
GRADIENT_FLOOR = 1e-3


def finite(value: float | None) -> float | None:
    """``value`` for JSON, which has no inf or NaN: None in their place."""
    return None if value is None or not math.isfinite(value) else value


@dataclass(frozen=True)
class LayerError:
    """One compared tensor: a checkpoint (``kind`` "checkpoint"), a model output ("output") or a trained tensor's
    gradient ("gradient"), its relative L2 and max absolute error against the float64 reference (a gradient: against
    the first runtime's), and its limit: a checkpoint's share of the tolerance, else the tolerance."""

    name: str
    kind: str
    rel_l2: float
    max_abs: float
    limit: float

    @property
    def diverged(self) -> bool:
        """Over its share (a NaN or a shape that differs counts as over)."""
        return not self.rel_l2 <= self.limit

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: an error that is not finite (NaN, or a tensor missing or of another shape) is None."""
        return {k: (finite(v) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def share_of_tolerance(tolerance: float, position: int, count: int) -> float:
    """The error the ``position``-th (1-based) of ``count`` compared steps may have: tolerance · sqrt(position/count)."""
    return tolerance * math.sqrt(position / count)


def layer_errors(
    outputs: dict[str, np.ndarray],
    checkpoints: dict[str, np.ndarray],
    reference_outputs: dict[str, np.ndarray],
    reference_checkpoints: dict[str, np.ndarray],
    tolerance: float,
) -> list[LayerError]:
    """Every checkpoint of the reference (in its order) that ``checkpoints`` has, then every reference output, with
    their errors and shares. ``checkpoints`` empty: the outputs only (a runtime that exposes nothing else). A
    checkpoint or output the runtime lacks is an error of inf. A checkpoint that is an output under another name (the
    last layer's output is ``last_hidden_state``) gets the output's whole tolerance: it passes where its output
    does."""
    count = len(reference_checkpoints) + 1
    rows = []
    if checkpoints:
        for position, (name, expected) in enumerate(reference_checkpoints.items(), start=1):
            got = checkpoints.get(name)
            rel, worst = relative_errors(got, expected) if got is not None else (math.inf, math.inf)
            output = any(np.array_equal(expected, value) for value in reference_outputs.values())
            limit = tolerance if output else share_of_tolerance(tolerance, position, count)
            rows.append(LayerError(name, "checkpoint", rel, worst, limit))
    for name, expected in reference_outputs.items():
        got = outputs.get(name)
        rel, worst = relative_errors(got, expected) if got is not None else (math.inf, math.inf)
        rows.append(LayerError(name, "output", rel, worst, tolerance))
    return rows


def gradient_errors(
    gradients: dict[str, np.ndarray], base: dict[str, np.ndarray], order: list[str], tolerance: float
) -> list[LayerError]:
    """Each tensor's gradient (kind "gradient") against the first runtime's ``base``, in ``order`` (backward order:
    the last layer's parameters first, where a backward pass starts), within ``tolerance`` each (GRADIENT_FLOOR)."""
    norms = [float(np.linalg.norm(np.asarray(g, np.float64))) for g in base.values()]
    floor = GRADIENT_FLOOR * float(np.median([n for n in norms if n > 0] or [1.0]))
    rows = []
    for name in order:
        expected, got = base.get(name), gradients.get(name)
        if expected is None:
            continue
        if got is None or np.shape(got) != np.shape(expected):
            rows.append(LayerError(name, "gradient", math.inf, math.inf, tolerance))
            continue
        difference = np.asarray(got, np.float64) - np.asarray(expected, np.float64)
        scale = max(float(np.linalg.norm(np.asarray(expected, np.float64))), floor)
        worst = float(np.max(np.abs(difference), initial=0.0))
        rows.append(LayerError(name, "gradient", float(np.linalg.norm(difference)) / scale, worst, tolerance))
    return rows


def first_divergence(errors: list[LayerError]) -> LayerError | None:
    """The first tensor over its share, in forward order (None: none is)."""
    return next((error for error in errors if error.diverged), None)
