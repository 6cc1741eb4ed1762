"""Assign canonical numpy weights to a Keras model's variables through an explicit map, with shape asserts.

Variables are addressed by their Keras path (``variable.path``, e.g. ``layers_0/query/kernel``: the
names of the layers that own it, then the variable's name), which is unique in a functional model.
Layers are created with the :data:`OVERWRITTEN` initializer: ``load_canonical`` sets every variable,
and Keras' random initializers would compile one random-number program per shape on jax (seconds
for a ResNet) for values thrown away.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import keras
import numpy as np

from fwbench.frameworks.base import check_weight_map

Transform = Callable[[np.ndarray], np.ndarray]

OVERWRITTEN = "zeros"  # initializer of kernels and embeddings that load_canonical overwrites


def identity(value: np.ndarray) -> np.ndarray:
    return value


def transpose(value: np.ndarray) -> np.ndarray:
    """(out, in) torch layout → (in, out) Dense kernel layout."""
    return np.ascontiguousarray(value.T)


def conv_kernel(value: np.ndarray) -> np.ndarray:
    """(out, in, kh, kw) torchvision layout → (kh, kw, in, out) Conv2D kernel layout."""
    return np.ascontiguousarray(value.transpose(2, 3, 1, 0))


def load_canonical(
    model: keras.Model,
    weights: dict[str, np.ndarray],
    mapping: dict[str, str],
    transforms: Mapping[str, Transform] | None = None,
) -> None:
    """Assign ``transforms[canonical](weights[canonical])`` to the variable at path ``mapping[canonical]``.

    Every canonical tensor must be used exactly once, every variable of ``model`` (trainable or not,
    e.g. batch-norm moving statistics) set exactly once, and every shape equal after the transform
    (no broadcasting); otherwise ValueError, before any variable is changed.
    """
    transforms = transforms or {}
    variables = {v.path: v for v in model.weights}
    if len(variables) != len(model.weights):
        raise ValueError("weight map: two variables of the model share a path")
    check_weight_map(set(variables), mapping, weights)
    values: dict[str, np.ndarray] = {}
    for canonical, target in mapping.items():
        original = weights[canonical]
        expected = tuple(variables[target].shape)
        try:
            value = transforms.get(canonical, identity)(original)
        except ValueError:  # e.g. a transpose whose axes do not fit a wrongly shaped tensor
            value = None
        if value is None or tuple(value.shape) != expected:
            after = "" if value is None or value.shape == original.shape else f" ({value.shape} after mapping)"
            raise ValueError(f"{canonical} -> {target}: shape {original.shape}{after}, variable shape {expected}")
        values[target] = np.asarray(value, dtype=np.float32)
    for target, value in values.items():
        variables[target].assign(value)


def keras_device(device: str) -> str:
    """The Keras device name (for ``keras.device``) of fwbench's device name (``cpu`` or ``cuda``): this process's
    first device (JAX numbers the devices of a multi-process run globally: another process's are not this one's)."""
    kind = "gpu" if device == "cuda" else "cpu"
    if keras.backend.backend() == "jax":
        import jax

        return f"{kind}:{jax.local_devices(backend=kind)[0].id}"
    return f"{kind}:0"


def parameter_arrays(model: keras.Model) -> list[np.ndarray]:
    """Every floating variable of ``model`` (``model.weights`` order, trainable or not) as float32 numpy
    copies; after ``train_on_batch`` the variables hold the trained values."""
    return [
        np.asarray(keras.ops.convert_to_numpy(v.value), dtype=np.float32)
        for v in model.weights
        if "float" in str(v.dtype)
    ]
