"""Create tf.Variables from canonical numpy weights through an explicit map, with shape asserts."""

from __future__ import annotations

from typing import Callable

import numpy as np
import tensorflow as tf

Transform = Callable[[np.ndarray], np.ndarray]


def identity(value: np.ndarray) -> np.ndarray:
    return value


def transpose(value: np.ndarray) -> np.ndarray:
    """(out, in) torch layout → (in, out) kernel layout."""
    return np.ascontiguousarray(value.T)


def canonical_variable(
    weights: dict[str, np.ndarray], name: str, expected_shape: tuple[int, ...], transform: Transform = identity
) -> tf.Variable:
    """A variable holding ``transform(weights[name])``, which must have ``expected_shape``."""
    value = transform(weights[name])
    if tuple(value.shape) != tuple(expected_shape):
        raise ValueError(f"{name}: shape {value.shape} after mapping, expected {expected_shape}")
    return tf.Variable(value, name=name.replace(".", "_"), trainable=True)


def check_all_used(weights: dict[str, np.ndarray], used: set[str]) -> None:
    """Raise unless every canonical tensor was mapped onto a variable exactly once."""
    unused, unknown = sorted(set(weights) - used), sorted(used - set(weights))
    if unused or unknown:
        raise ValueError(f"weight map: tensors unused {unused}, unknown {unknown}")
