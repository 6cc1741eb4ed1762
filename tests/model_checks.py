"""Helpers shared by the per-framework model tests."""

from __future__ import annotations

from typing import Any

import numpy as np

from fwbench.models import text
from fwbench.models.base import ModelDescription

FFN_INPUT_TENSORS = ("intermediate.dense.weight", "ffn.lin1.weight", "mlp.c_fc.weight")
AMPLIFY = 40.0
# With amplified weights a GELU swap moves the outputs by ~3e-5 (the two GELUs never differ by more
# than ~5e-4); float32 implementations land near 3e-7. A test at this tolerance sees a swap.
GELU_TOLERANCE = 5e-6


def reference_outputs(
    description: ModelDescription, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """``description``'s float64 reference outputs; fails the test of a model that has no reference."""
    outputs = description.reference_forward(weights, inputs)
    assert outputs is not None, f"{description.name} has no float64 reference"
    return outputs


def amplified_weights(description: ModelDescription, seed: int = 0) -> dict[str, np.ndarray]:
    """Canonical weights with the feed-forward input matrices scaled up, so the GELU sees inputs of
    order 1 where erf and tanh GELU differ most (with the usual std of 0.02 they agree to ~4e-6,
    below any sensible parity tolerance, and a swapped GELU would go unnoticed)."""
    weights = description.canonical_weights(seed)
    return {k: v * AMPLIFY if k.endswith(FFN_INPUT_TENSORS) else v for k, v in weights.items()}


def gelu_swap_error(
    description: ModelDescription, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray]
) -> float:
    """Relative L2 change of the first output when the reference's GELU is swapped for the other one:
    a parity test at a tolerance well below this would catch an implementation using the wrong GELU."""
    name = description.output_names[0]
    right = reference_outputs(description, weights, inputs)[name]
    saved_erf, saved_tanh = text.gelu_erf, text.gelu_tanh
    module: Any = __import__(type(description).__module__, fromlist=["_"])  # a models module: its GELUs swapped
    saved = getattr(module, "gelu_erf", None), getattr(module, "gelu_tanh", None)
    try:
        if saved[0] is not None:
            module.gelu_erf = saved_tanh
        if saved[1] is not None:
            module.gelu_tanh = saved_erf
        wrong = reference_outputs(description, weights, inputs)[name]
    finally:
        if saved[0] is not None:
            module.gelu_erf = saved[0]
        if saved[1] is not None:
            module.gelu_tanh = saved[1]
    return float(np.linalg.norm(wrong - right) / np.linalg.norm(right))
