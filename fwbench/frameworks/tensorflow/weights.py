"""Create tf.Variables from canonical numpy weights through an explicit map, with shape asserts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np
import tensorflow as tf

Transform = Callable[[np.ndarray], np.ndarray]


def identity(value: np.ndarray) -> np.ndarray:
    return value


def transpose(value: np.ndarray) -> np.ndarray:
    """(out, in) torch layout → (in, out) kernel layout."""
    return np.ascontiguousarray(value.T)


def canonical_variable(
    weights: dict[str, np.ndarray],
    name: str,
    expected_shape: tuple[int, ...],
    transform: Transform = identity,
    trainable: bool = True,
) -> tf.Variable:
    """A variable holding ``transform(weights[name])``, which must have ``expected_shape``; ``trainable=False``
    for state that training updates without a gradient (batch-norm running statistics)."""
    value = transform(weights[name])
    if tuple(value.shape) != tuple(expected_shape):
        raise ValueError(f"{name}: shape {value.shape} after mapping, expected {expected_shape}")
    return tf.Variable(value, name=name.replace(".", "_"), trainable=trainable)


def check_all_used(weights: dict[str, np.ndarray], used: set[str]) -> None:
    """Raise unless every canonical tensor was mapped onto a variable exactly once."""
    unused, unknown = sorted(set(weights) - used), sorted(used - set(weights))
    if unused or unknown:
        raise ValueError(f"weight map: tensors unused {unused}, unknown {unknown}")


class MakeVariable(Protocol):
    """canonical name, expected shape after the transform, transform[, trainable] -> a checked tf.Variable"""

    def __call__(
        self, name: str, shape: tuple[int, ...], transform: Transform, trainable: bool = True
    ) -> tf.Variable: ...


def tracked_variables(weights: dict[str, np.ndarray], used: set[str]) -> MakeVariable:
    """``canonical_variable`` that records each name in ``used`` (for ``check_all_used``) and raises
    ValueError for a tensor that is missing or mapped twice."""

    def variable(name: str, shape: tuple[int, ...], transform: Transform, trainable: bool = True) -> tf.Variable:
        if name not in weights:
            raise ValueError(f"weight map: tensor {name} missing")
        if name in used:
            raise ValueError(f"weight map: tensor {name} mapped twice")
        used.add(name)
        return canonical_variable(weights, name, shape, transform, trainable)

    return variable


def hwio(value: np.ndarray) -> np.ndarray:
    """(out, in, kh, kw) torch layout → (kh, kw, in, out); any other rank passes through unchanged, so
    that the shape check names the tensor."""
    return np.ascontiguousarray(value.transpose(2, 3, 1, 0)) if value.ndim == 4 else value


def parameter_arrays(model: tf.Module) -> list[np.ndarray]:
    """Every floating variable of ``model`` (``tf.Module.variables`` order) as float32 numpy copies."""
    return [np.asarray(tf.cast(v, tf.float32).numpy()) for v in model.variables if v.dtype.is_floating]
