"""The gemm microbenchmark in TensorFlow (tf.Module and tf ops, not Keras): one bias-free square matmul.

Input ``x``: (batch, n) float32 → ``(y,)`` with y = x @ weight, (batch, n). The canonical weight is
already (in, out): no transpose.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from fwbench.frameworks.tensorflow import precision
from fwbench.frameworks.tensorflow.weights import CanonicalVariables
from fwbench.models.gemm import Gemm
from fwbench.models.weightmap import identity


class GemmModule(tf.Module):
    def __init__(self, description: Gemm, weights: dict[str, np.ndarray]) -> None:
        super().__init__(name="gemm")
        canonical = CanonicalVariables(weights)
        self.kernel = canonical.take("weight", (description.n, description.n), identity)
        canonical.check_all_used()

    def __call__(self, x: tf.Tensor) -> tuple[tf.Tensor]:
        return (precision.matmul(x, self.kernel),)


def build_model(description: Gemm, weights: dict[str, np.ndarray], device: str) -> GemmModule:
    """The matmul with the canonical weight, its variable placed on ``device``."""
    with tf.device("/GPU:0" if device == "cuda" else "/CPU:0"):
        return GemmModule(description, weights)
