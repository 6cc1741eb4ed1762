"""Assign canonical numpy weights to a Keras model's variables through an explicit map, with shape asserts.

Variables are addressed by their Keras path (``variable.path``, e.g. ``layers_0_attention/query/kernel``: the
names of the layers that own it, then the variable's name), which is unique in a functional model.
Layers are created with the :data:`OVERWRITTEN` initializer: ``load_canonical`` sets every variable,
and Keras' random initializers would compile one random-number program per shape on jax (seconds
for a ResNet) for values thrown away.
"""

from __future__ import annotations

from collections.abc import Mapping

import keras
import numpy as np

from fwbench.models.weightmap import Transform, mapped_weights

OVERWRITTEN = "zeros"  # initializer of kernels and embeddings that load_canonical overwrites


def load_canonical(
    model: keras.Model,
    weights: dict[str, np.ndarray],
    mapping: dict[str, str],
    transforms: Mapping[str, Transform] | None = None,
) -> None:
    """Assign ``transforms[canonical](weights[canonical])`` to the variable at path ``mapping[canonical]``.

    Checked by :func:`fwbench.models.weightmap.mapped_weights`: every canonical tensor used exactly once,
    every variable of ``model`` (trainable or not, e.g. batch-norm moving statistics) set exactly once, and
    every shape equal after the transform (no broadcasting); otherwise ValueError, before any variable is changed.
    """
    variables = {v.path: v for v in model.weights}
    if len(variables) != len(model.weights):
        raise ValueError("weight map: two variables of the model share a path")
    shapes = {path: tuple(variable.shape) for path, variable in variables.items()}
    values = dict(mapped_weights(shapes, mapping, weights, transforms))
    for target, value in values.items():
        variables[target].assign(np.asarray(value, dtype=np.float32))


def keras_device(device: str) -> str:
    """The Keras device name (for ``keras.device``) of fwbench's device name (``cpu`` or ``cuda``): this process's
    first device (JAX numbers the devices of a multi-process run globally: another process's are not this one's)."""
    kind = "gpu" if device == "cuda" else "cpu"
    if keras.backend.backend() == "jax":
        import jax

        return f"{kind}:{jax.local_devices(backend=kind)[0].id}"
    return f"{kind}:0"


def floating_variables(model: keras.Model) -> list[keras.Variable]:
    """Every floating variable of ``model``, trainable or not, in ``model.weights`` order."""
    return [v for v in model.weights if "float" in str(v.dtype)]


def parameter_arrays(model: keras.Model) -> list[np.ndarray]:
    """Every floating variable of ``model`` (:func:`floating_variables`) as float32 numpy copies; after
    ``train_on_batch`` the variables hold the trained values."""
    return [np.asarray(keras.ops.convert_to_numpy(v.value), dtype=np.float32) for v in floating_variables(model)]
