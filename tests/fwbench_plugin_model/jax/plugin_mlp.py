"""plugin-mlp in JAX: a pure ``apply(params, x)`` over a parameter pytree.

Input ``x``: (batch, 8) float32 → ``(logits,)``, logits (batch, 4).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fwbench.frameworks.jax.weights import CanonicalParams
from fwbench.models.weightmap import transpose
from fwbench_plugin_model import PluginMLP

Params = dict[str, Any]


@dataclass(frozen=True)
class PluginMLPModule:
    params: Params  # {"hidden": {"kernel": (8, 16), "bias": (16,)}, "out": {"kernel": (16, 4), "bias": (4,)}}

    def apply(self, params: Params, x: jax.Array) -> tuple[jax.Array]:
        hidden = jnp.tanh(x @ params["hidden"]["kernel"] + params["hidden"]["bias"])
        return (hidden @ params["out"]["kernel"] + params["out"]["bias"],)


def build_model(description: PluginMLP, weights: dict[str, np.ndarray], device: str) -> PluginMLPModule:
    """The pytree of the canonical weights, kernels (in, out), on ``device``."""
    canonical = CanonicalParams(weights, device)
    n_in, hidden, n_out = description.widths

    def linear(name: str, fan_in: int, fan_out: int) -> Params:
        return {
            "kernel": canonical.take(f"{name}.weight", (fan_in, fan_out), transpose),
            "bias": canonical.take(f"{name}.bias", (fan_out,)),
        }

    params = {"hidden": linear("hidden", n_in, hidden), "out": linear("out", hidden, n_out)}
    canonical.check_all_used()
    return PluginMLPModule(params)


def training_logits(model: PluginMLPModule, params: Params, x: jax.Array) -> jax.Array:
    """(batch, 4) logits, pure in ``params``."""
    return model.apply(params, x)[0]
