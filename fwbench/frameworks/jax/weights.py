"""Place canonical numpy weights into a JAX parameter pytree through an explicit map, with shape asserts.

Each architecture asks for every canonical tensor by name with the shape it expects after an
optional layout transform; :class:`CanonicalParams` checks the tensor exists, is taken only once
and has that shape, puts it on the device, and at the end that no canonical tensor was left over.
"""

from __future__ import annotations

from typing import Callable

import jax
import numpy as np

Transform = Callable[[np.ndarray], np.ndarray]


def identity(value: np.ndarray) -> np.ndarray:
    return value


def transpose(value: np.ndarray) -> np.ndarray:
    """(out, in) torch layout → (in, out) kernel layout, so that a dense layer is ``x @ kernel + bias``."""
    return np.ascontiguousarray(value.T)


def jax_device(device: str) -> jax.Device:
    """The JAX device for fwbench's device name (``cpu`` or ``cuda``)."""
    return jax.devices("gpu" if device == "cuda" else "cpu")[0]


class CanonicalParams:
    """Hands out canonical tensors as device arrays, each exactly once, each with its expected shape."""

    def __init__(self, weights: dict[str, np.ndarray], device: str) -> None:
        self.weights = weights
        self.device = jax_device(device)
        self.used: set[str] = set()

    def take(self, name: str, expected_shape: tuple[int, ...], transform: Transform = identity) -> jax.Array:
        """``transform(weights[name])`` on the device; ValueError if missing, taken twice or misshapen."""
        if name not in self.weights:
            raise ValueError(f"weight map: tensor {name} missing from the canonical weights")
        if name in self.used:
            raise ValueError(f"weight map: tensor {name} mapped twice")
        value = transform(self.weights[name])
        if tuple(value.shape) != tuple(expected_shape):
            raise ValueError(f"{name}: shape {value.shape} after mapping, expected {tuple(expected_shape)}")
        self.used.add(name)
        return jax.device_put(np.asarray(value, dtype=np.float32), self.device)

    def check_all_used(self) -> None:
        """Raise unless every canonical tensor was mapped onto a parameter."""
        unused = sorted(set(self.weights) - self.used)
        if unused:
            raise ValueError(f"weight map: tensors unused {unused}")


def hwio(value: np.ndarray) -> np.ndarray:
    """(out, in, kh, kw) torch layout → (kh, kw, in, out); any other rank passes through unchanged, so
    that the shape check names the tensor."""
    return np.ascontiguousarray(value.transpose(2, 3, 1, 0)) if value.ndim == 4 else value


def parameter_arrays(params: object) -> list[np.ndarray]:
    """Every floating leaf of the parameter pytree ``params`` (``jax.tree_util.tree_leaves`` order) as
    float32 numpy copies."""
    leaves = jax.tree_util.tree_leaves(params)
    return [np.asarray(leaf, dtype=np.float32) for leaf in leaves if np.issubdtype(np.dtype(leaf.dtype), np.floating)
            or str(leaf.dtype) == "bfloat16"]
