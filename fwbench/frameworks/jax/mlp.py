"""The MLP in JAX: a pure function over a parameter pytree, matmul + bias with ReLU between layers.

Input ``x``: (batch, in_features) float32 → ``(logits,)`` with logits (batch, out_features).
Canonical weights are (out, in); kernels here are (in, out), transposed once when loading.
``taps``: every layer's output (after its ReLU) by its prefix (fwbench.models.checkpoints), when given a dict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from fwbench.frameworks.jax import precision
from fwbench.frameworks.jax.weights import CanonicalParams
from fwbench.models.checkpoints import Taps, tap
from fwbench.models.mlp import MLP
from fwbench.models.weightmap import transpose

Params = dict[str, Any]  # {"layers": [{"kernel": (in, out), "bias": (out,)}, ...]}


@dataclass(frozen=True, eq=False)
class MLPModule:
    """The MLP's parameters and its forward function; ``apply`` reads weights only from its argument,
    so under ``jax.jit`` they are inputs of the compiled program, never baked-in constants."""

    params: Params
    layer_names: tuple[str, ...]  # each layer's checkpoint (its canonical prefix)

    def apply(self, params: Params, x: jax.Array, taps: Taps = None) -> tuple[jax.Array]:
        """x (batch, in_features) → (logits (batch, out_features),)."""
        last = len(params["layers"]) - 1
        for i, (layer, name) in enumerate(zip(params["layers"], self.layer_names, strict=True)):
            x = precision.dense(x, layer["kernel"], layer["bias"])
            if i < last:
                x = jax.nn.relu(x)
            tap(taps, name, x)
        return (x,)


def build_model(description: MLP, weights: dict[str, np.ndarray], device: str) -> MLPModule:
    """The MLP with the canonical weights, its arrays placed on ``device``."""
    canonical = CanonicalParams(weights, device)
    layers = [
        {
            "kernel": canonical.take(f"{prefix}.weight", (fan_in, fan_out), transpose),
            "bias": canonical.take(f"{prefix}.bias", (fan_out,)),
        }
        for prefix, fan_in, fan_out in description.layers
    ]
    canonical.check_all_used()
    return MLPModule({"layers": layers}, tuple(prefix for prefix, _, _ in description.layers))


def inference_logits(model: MLPModule, params: Params, stats: Any, x: jax.Array) -> jax.Array:
    """The logits (batch, out_features) after training (phase fit's evaluation); ``stats``: the empty state."""
    return model.apply(params, x)[0]


def training_logits(model: MLPModule, params: Params, x: jax.Array) -> jax.Array:
    """The logits the training loss is taken of: (batch, out_features)."""
    return model.apply(params, x)[0]
