"""The gemm microbenchmark in JAX: a pure function of (params, x), one bias-free square matmul.

Input ``x``: (batch, n) float32 → ``(y,)`` with y = x @ kernel, (batch, n). The canonical weight is
already (in, out): no transpose.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from fwbench.frameworks.jax import precision
from fwbench.frameworks.jax.weights import CanonicalParams
from fwbench.models.gemm import Gemm

Params = dict[str, Any]  # {"kernel": (n, n)}


@dataclass(frozen=True, eq=False)
class GemmModule:
    """The weight and the forward function; under ``jax.jit`` the weight is an input of the compiled
    program, never a baked-in constant."""

    params: Params

    def apply(self, params: Params, x: jax.Array) -> tuple[jax.Array]:
        """x (batch, n) → (y (batch, n),)."""
        return (precision.matmul(x, params["kernel"]),)


def build_model(description: Gemm, weights: dict[str, np.ndarray], device: str) -> GemmModule:
    """The matmul with the canonical weight, placed on ``device``."""
    canonical = CanonicalParams(weights, device)
    kernel = canonical.take("weight", (description.n, description.n))
    canonical.check_all_used()
    return GemmModule({"kernel": kernel})
