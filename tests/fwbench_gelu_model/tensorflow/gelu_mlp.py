"""gelu-mlp in TensorFlow: matmul + bias → exact GELU written as Keras writes it (``erfc``) → matmul + bias.

Input ``x``: (batch, 8) float32 → ``(logits,)``, logits (batch, 4).
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from fwbench.frameworks.tensorflow.weights import CanonicalVariables
from fwbench.models.weightmap import identity, transpose
from fwbench_gelu_model import GeluMLP


class GeluMLPModule(tf.Module):
    def __init__(self, description: GeluMLP, weights: dict[str, np.ndarray]) -> None:
        super().__init__(name="gelu_mlp")
        n_in, hidden, n_out = description.widths
        canonical = CanonicalVariables(weights)
        variable = canonical.take
        self.hidden_kernel = variable("hidden.weight", (n_in, hidden), transpose)
        self.hidden_bias = variable("hidden.bias", (hidden,), identity)
        self.out_kernel = variable("out.weight", (hidden, n_out), transpose)
        self.out_bias = variable("out.bias", (n_out,), identity)
        canonical.check_all_used()

    def __call__(self, x: tf.Tensor) -> tuple[tf.Tensor]:
        pre = tf.matmul(x, self.hidden_kernel) + self.hidden_bias
        hidden = 0.5 * pre * tf.math.erfc(-pre / math.sqrt(2.0))
        return (tf.matmul(hidden, self.out_kernel) + self.out_bias,)


def build_model(description: GeluMLP, weights: dict[str, np.ndarray], device: str) -> GeluMLPModule:
    with tf.device("/GPU:0" if device == "cuda" else "/CPU:0"):
        return GeluMLPModule(description, weights)
