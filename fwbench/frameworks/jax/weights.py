"""Place canonical numpy weights into a JAX parameter pytree through an explicit map, with shape asserts.

Each architecture asks for every canonical tensor by name with the shape it expects after an
optional layout transform; :class:`CanonicalParams` takes it through :class:`fwbench.models.weightmap.WeightTaker`
(the tensor exists, is taken only once and has that shape; at the end none was left over), puts it on the device
and remembers which canonical tensor the device array holds (:func:`canonical_name`).
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import jax
import numpy as np

from fwbench.models.weightmap import Transform, WeightTaker, identity

# The canonical name each array CanonicalParams handed out holds, by id (with a weak reference that tells a
# live array from a later one reusing its id).
_CANONICAL_NAMES: dict[int, tuple[weakref.ref[Any], str]] = {}


def jax_device(device: str) -> jax.Device:
    """This process's JAX device for fwbench's device name (``cpu`` or ``cuda``)."""
    return jax.local_devices(backend="gpu" if device == "cuda" else "cpu")[0]


class CanonicalParams:
    """Hands out canonical tensors as device arrays, each exactly once, each with its expected shape."""

    def __init__(self, weights: dict[str, np.ndarray], device: str) -> None:
        self.taker = WeightTaker(weights)
        self.device = jax_device(device)

    def take(self, name: str, expected_shape: tuple[int, ...], transform: Transform = identity) -> jax.Array:
        """``transform(weights[name])`` on the device; ValueError if missing, taken twice or misshapen."""
        value = self.taker.take(name, expected_shape, transform)
        placed = jax.device_put(np.asarray(value, dtype=np.float32), self.device)
        key = id(placed)
        _CANONICAL_NAMES[key] = (weakref.ref(placed, functools.partial(_forget, key)), name)
        return placed

    def check_all_used(self) -> None:
        """Raise unless every canonical tensor was mapped onto a parameter."""
        self.taker.check_all_used()


def _forget(key: int, _: object) -> None:
    """A weak reference's callback: the array with id ``key`` is gone."""
    _CANONICAL_NAMES.pop(key, None)


def canonical_name(leaf: Any) -> str | None:
    """The canonical tensor a parameter leaf holds, as handed out by :meth:`CanonicalParams.take` (the same
    array object), else None (a derived array: fused, folded, cast or updated)."""
    entry = _CANONICAL_NAMES.get(id(leaf))
    return entry[1] if entry is not None and entry[0]() is leaf else None


def parameter_arrays(params: object) -> list[np.ndarray]:
    """Every floating leaf of the parameter pytree ``params`` (``jax.tree_util.tree_leaves`` order) as
    float32 numpy copies."""
    leaves = jax.tree_util.tree_leaves(params)
    return [
        np.asarray(leaf, dtype=np.float32)
        for leaf in leaves
        if np.issubdtype(np.dtype(leaf.dtype), np.floating) or str(leaf.dtype) == "bfloat16"
    ]
