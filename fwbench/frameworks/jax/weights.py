"""Place canonical numpy weights into a JAX parameter pytree through an explicit map, with shape asserts.

Each architecture asks for every canonical tensor by name with the shape it expects after an
optional layout transform; :class:`CanonicalParams` checks the tensor exists, is taken only once
and has that shape, puts it on the device, and at the end that no canonical tensor was left over.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

Transform = Callable[[np.ndarray], np.ndarray]
# The canonical name each array CanonicalParams handed out holds, by id (with a weak reference that tells a
# live array from a later one reusing its id).
_CANONICAL_NAMES: dict[int, tuple[weakref.ref[Any], str]] = {}


def identity(value: np.ndarray) -> np.ndarray:
    return value


def transpose(value: np.ndarray) -> np.ndarray:
    """(out, in) torch layout → (in, out) kernel layout, so that a dense layer is ``x @ kernel + bias``."""
    return np.ascontiguousarray(value.T)


def jax_device(device: str) -> jax.Device:
    """This process's JAX device for fwbench's device name (``cpu`` or ``cuda``)."""
    return jax.local_devices(backend="gpu" if device == "cuda" else "cpu")[0]


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
        placed = jax.device_put(np.asarray(value, dtype=np.float32), self.device)
        key = id(placed)
        _CANONICAL_NAMES[key] = (weakref.ref(placed, functools.partial(_forget, key)), name)
        return placed

    def check_all_used(self) -> None:
        """Raise unless every canonical tensor was mapped onto a parameter."""
        unused = sorted(set(self.weights) - self.used)
        if unused:
            raise ValueError(f"weight map: tensors unused {unused}")


def _forget(key: int, _: object) -> None:
    """A weak reference's callback: the array with id ``key`` is gone."""
    _CANONICAL_NAMES.pop(key, None)


def canonical_name(leaf: Any) -> str | None:
    """The canonical tensor a parameter leaf holds, as handed out by :meth:`CanonicalParams.take` (the same
    array object), else None (a derived array: fused, folded, cast or updated)."""
    entry = _CANONICAL_NAMES.get(id(leaf))
    return entry[1] if entry is not None and entry[0]() is leaf else None


def hwio(value: np.ndarray) -> np.ndarray:
    """(out, in, kh, kw) torch layout → (kh, kw, in, out); any other rank passes through unchanged, so
    that the shape check names the tensor."""
    return np.ascontiguousarray(value.transpose(2, 3, 1, 0)) if value.ndim == 4 else value


def parameter_arrays(params: object) -> list[np.ndarray]:
    """Every floating leaf of the parameter pytree ``params`` (``jax.tree_util.tree_leaves`` order) as
    float32 numpy copies."""
    leaves = jax.tree_util.tree_leaves(params)
    return [
        np.asarray(leaf, dtype=np.float32)
        for leaf in leaves
        if np.issubdtype(np.dtype(leaf.dtype), np.floating) or str(leaf.dtype) == "bfloat16"
    ]
