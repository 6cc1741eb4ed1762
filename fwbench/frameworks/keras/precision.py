"""fwbench's precision policy (fwbench.precision) in Keras 3, and what the backend's graph shows.

``bf16`` is Keras' own ``mixed_bfloat16`` global policy (float32 variables; Dense, convolutions and the tied
head cast their inputs and read their variables in bfloat16) plus what makes it the policy torch.autocast
defines: the embeddings, the layer norms and the transformer layers that carry the residual stream are float32
layers (``dtype="float32"``), so the residual adds and layer norms stay float32 as in torch, where Keras'
policy alone would round the residual stream to bfloat16 at every layer. Batch norm computes its statistics
in float32 itself. :func:`observed_dtypes` reads the backend's own graph: the jaxpr (keras:jax), the traced
tf.function graph (keras:tensorflow), the dispatched aten ops (keras:torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
from keras import layers

FLOAT32 = "float32"  # the dtype policy of the layers the mixed policy keeps in float32


def layer_norm(eps: float, name: str) -> layers.LayerNormalization:
    """A LayerNormalization computing in float32 under every policy."""
    return layers.LayerNormalization(epsilon=eps, name=name, dtype=FLOAT32)


def rms_norm(eps: float, name: str) -> layers.RMSNormalization:
    """An RMSNormalization (the Llama layout's norm) computing in float32 under every policy."""
    return layers.RMSNormalization(epsilon=eps, name=name, dtype=FLOAT32)


def _scopes(model: keras.Model) -> dict[str, str]:
    """Layer name → op class for the normalisation layers (their arithmetic is observed as that class)."""
    scopes: dict[str, str] = {}
    # Keras' own walk over every nested layer (model.layers lists only a functional model's top level)
    for layer in model._flatten_layers(include_self=False):
        if isinstance(layer, (layers.LayerNormalization, layers.RMSNormalization)):
            scopes[layer.name] = "layer_norm"
        elif isinstance(layer, layers.BatchNormalization):
            scopes[layer.name] = "batch_norm"
    return scopes


def observed_dtypes(model: keras.Model, names: Sequence[str], inputs: Sequence[Any]) -> dict[str, list[str]]:
    """Op class → operand dtypes in the backend's graph of ``model`` called on ``inputs`` (named ``names``)."""
    backend = keras.backend.backend()
    scopes = _scopes(model)
    if backend == "jax":
        from fwbench.frameworks.jax import precision as jax_precision

        def forward(trainable: Any, non_trainable: Any, *tensors: Any) -> Any:
            return model.stateless_call(trainable, non_trainable, dict(zip(names, tensors)))[0]

        values = ([v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables])
        return jax_precision.observed_dtypes(forward, *values, *inputs, scopes=scopes)
    if backend == "tensorflow":
        from fwbench.frameworks.tensorflow import precision as tf_precision

        return tf_precision.observed_dtypes(lambda *tensors: model(dict(zip(names, tensors))), inputs, scopes=scopes)
    from fwbench.frameworks.torch import precision as torch_precision

    return torch_precision.observed_dtypes(lambda *tensors: model(dict(zip(names, tensors))), inputs)
