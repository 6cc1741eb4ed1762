"""The gemm microbenchmark in Keras: a functional model of one bias-free Dense layer.

Input ``x``: (batch, n) float32 → ``{"y": (batch, n)}``. The canonical weight is already the Dense
kernel's (in, out) layout: no transpose.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import layers

from fwbench.frameworks.keras.weights import OVERWRITTEN, keras_device, load_canonical
from fwbench.models.gemm import Gemm


def gemm_model(description: Gemm) -> keras.Model:
    x = keras.Input((description.n,), dtype="float32", name="x")
    y = layers.Dense(description.n, use_bias=False, kernel_initializer=OVERWRITTEN, name="matmul")(x)
    return keras.Model({"x": x}, {"y": y}, name="gemm")


def build_model(description: Gemm, weights: dict[str, np.ndarray], device: str) -> keras.Model:
    """The matmul with the canonical weight (``weight`` → ``matmul/kernel``)."""
    with keras.device(keras_device(device)):
        model = gemm_model(description)
    load_canonical(model, weights, {"weight": "matmul/kernel"})
    return model
