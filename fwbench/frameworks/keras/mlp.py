"""The MLP in Keras: a functional model of Dense layers, ReLU on all but the last.

Input ``x``: (batch, in_features) float32 → ``{"logits": (batch, out_features)}``. Each Dense layer is named
after its checkpoint (fwbench.models.checkpoints: ``fcN``, its output after the ReLU): ``checkpoint_model``.
Canonical weights are (out, in); Dense kernels are (in, out), transposed once when loading.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import layers

from fwbench.frameworks.keras.weights import OVERWRITTEN, keras_device, load_canonical
from fwbench.models.mlp import MLP
from fwbench.models.weightmap import transpose


def mlp_model(description: MLP) -> keras.Model:
    x = keras.Input((description.config.in_features,), dtype="float32", name="x")
    h = x
    last = len(description.layers) - 1
    for i, (prefix, _, fan_out) in enumerate(description.layers):
        h = layers.Dense(fan_out, activation="relu" if i < last else None, kernel_initializer=OVERWRITTEN, name=prefix)(
            h
        )
    return keras.Model({"x": x}, {"logits": h}, name="mlp")


def build_model(description: MLP, weights: dict[str, np.ndarray], device: str) -> keras.Model:
    """The MLP with the canonical weights (``fcN.weight`` → ``fcN/kernel``, transposed)."""
    with keras.device(keras_device(device)):
        model = mlp_model(description)
    mapping, transforms = {}, {}
    for prefix, _, _ in description.layers:
        mapping[f"{prefix}.weight"], transforms[f"{prefix}.weight"] = f"{prefix}/kernel", transpose
        mapping[f"{prefix}.bias"] = f"{prefix}/bias"
    load_canonical(model, weights, mapping, transforms)
    return model


def checkpoint_model(model: keras.Model, description: MLP) -> keras.Model:
    """The functional model sharing ``model``'s layers and variables whose outputs are ``model``'s and every
    checkpoint (fwbench.models.checkpoints): each layer's output (after its ReLU), by the layer's name."""
    taps = {name: model.get_layer(name).output for name in description.checkpoint_names()}
    return keras.Model(model.input, {**model.output, **taps}, name=f"{model.name}_checkpoints")


def training_model(model: keras.Model, description: MLP) -> keras.Model:
    """The model train_on_batch trains: the same layers, the logits (batch, out_features) as its one output."""
    return keras.Model(model.input, model.output["logits"], name=f"{model.name}_training")
