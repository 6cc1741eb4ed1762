"""The MLP in TensorFlow (tf.Module and tf ops, not Keras): matmul + bias, ReLU between layers.

Input ``x``: (batch, in_features) float32 → ``(logits,)`` with logits (batch, out_features).
Canonical weights are (out, in); kernels here are (in, out), transposed once when loading.
``taps``: every layer's output (after its ReLU) by its prefix (fwbench.models.checkpoints), when given a dict.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from fwbench.frameworks.tensorflow import precision
from fwbench.frameworks.tensorflow.weights import CanonicalVariables
from fwbench.models.checkpoints import Taps, tap
from fwbench.models.mlp import MLP
from fwbench.models.weightmap import identity, transpose


class MLPModule(tf.Module):
    def __init__(self, description: MLP, weights: dict[str, np.ndarray]) -> None:
        super().__init__(name="mlp")
        self.kernels: list[tf.Variable] = []
        self.biases: list[tf.Variable] = []
        self.layer_names = tuple(prefix for prefix, _, _ in description.layers)  # each layer's checkpoint
        canonical = CanonicalVariables(weights)
        variable = canonical.take
        for prefix, fan_in, fan_out in description.layers:
            self.kernels.append(variable(f"{prefix}.weight", (fan_in, fan_out), transpose))
            self.biases.append(variable(f"{prefix}.bias", (fan_out,), identity))
        canonical.check_all_used()

    def __call__(self, x: tf.Tensor, taps: Taps = None) -> tuple[tf.Tensor]:
        last = len(self.kernels) - 1
        for i, (kernel, bias, name) in enumerate(zip(self.kernels, self.biases, self.layer_names)):
            x = precision.dense(x, kernel, bias)
            if i < last:
                x = tf.nn.relu(x)
            tap(taps, name, x)
        return (x,)


def build_model(description: MLP, weights: dict[str, np.ndarray], device: str) -> MLPModule:
    """The MLP with the canonical weights, its variables placed on ``device``."""
    with tf.device("/GPU:0" if device == "cuda" else "/CPU:0"):
        return MLPModule(description, weights)


def inference_logits(module: MLPModule, x: tf.Tensor) -> tf.Tensor:
    """The logits (batch, out_features) after training (phase fit's evaluation): the forward itself."""
    return module(x)[0]


def training_logits(module: MLPModule, x: tf.Tensor) -> tf.Tensor:
    """The logits the training loss is taken of: (batch, out_features)."""
    return module(x)[0]
