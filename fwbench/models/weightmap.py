"""How the canonical weights reach a framework's variables: the one checked path every framework loads through.

Framework-free (numpy only); each ``fwbench/frameworks/<framework>/weights.py`` is a thin adapter around it.

- Layout transforms from the canonical (torch) layout: :func:`identity`, :func:`transpose` ((out, in) → (in, out)),
  :func:`hwio` ((out, in, kh, kw) → (kh, kw, in, out)).
- :class:`WeightTaker`: hands out each canonical tensor exactly once, transformed, with the shape its variable
  expects, and at the end checks none was left over (tensorflow and jax ask for tensors by name as they build).
- :func:`check_weight_map` and :func:`mapped_weights`: a name map (canonical name → framework variable) checked to
  be a bijection, then taken through a :class:`WeightTaker` (torch's state dict names, Keras' variable paths).

The error messages are the same for every framework: each names the tensor (and its variable where there is one).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import numpy as np

Transform = Callable[[np.ndarray], np.ndarray]


def identity(value: np.ndarray) -> np.ndarray:
    """The canonical layout as it is."""
    return value


def transpose(value: np.ndarray) -> np.ndarray:
    """(out, in) torch layout → (in, out) kernel layout, so that a dense layer is ``x @ kernel + bias`` (and back:
    GPT-2's (in, out) Conv1D weights → torch's (out, in))."""
    return np.ascontiguousarray(value.T)


def hwio(value: np.ndarray) -> np.ndarray:
    """(out, in, kh, kw) torch conv layout → (kh, kw, in, out) (HWIO, channels-last kernels); ValueError for a
    tensor of another rank (:meth:`WeightTaker.take` reports it as a wrong shape, naming the tensor)."""
    return np.ascontiguousarray(value.transpose(2, 3, 1, 0))


class WeightTaker:
    """Hands out the canonical ``weights``, each exactly once, each checked to have its expected shape after its
    layout transform; :meth:`check_all_used` at the end checks that none was left over. ValueError names the
    tensor."""

    def __init__(self, weights: Mapping[str, np.ndarray]) -> None:
        self.weights = weights
        self.used: set[str] = set()

    def take(
        self, name: str, expected_shape: tuple[int, ...], transform: Transform = identity, *, target: str | None = None
    ) -> np.ndarray:
        """``transform(weights[name])``, which must have ``expected_shape``; ValueError if the tensor is missing,
        was taken before, or has another shape (``target``, the variable it is for, is named in the message)."""
        if name not in self.weights:
            raise ValueError(f"weight map: tensor {name} missing from the canonical weights")
        if name in self.used:
            raise ValueError(f"weight map: tensor {name} mapped twice")
        original = self.weights[name]
        expected = tuple(expected_shape)
        try:
            value: np.ndarray | None = transform(original)
        except ValueError:  # a transform whose axes do not fit a wrongly shaped tensor (hwio of a 2-D one)
            value = None
        if value is None or tuple(value.shape) != expected:
            label = name if target is None else f"{name} -> {target}"
            after = "" if value is None or value.shape == original.shape else f" ({value.shape} after mapping)"
            raise ValueError(f"{label}: shape {original.shape}{after}, expected {expected}")
        self.used.add(name)
        return value

    def check_all_used(self) -> None:
        """Raise ValueError unless every canonical tensor was taken."""
        unused = sorted(set(self.weights) - self.used)
        if unused:
            raise ValueError(f"weight map: tensors unused {unused}")


def check_weight_map(targets: set[str], mapping: Mapping[str, str], weights: Mapping[str, np.ndarray]) -> None:
    """Raise ValueError unless ``mapping`` (canonical name → framework variable) is a bijection between
    ``weights`` and ``targets``: every tensor used, none missing, every variable set exactly once."""
    unset = sorted(targets - set(mapping.values()))
    unknown = sorted(set(mapping.values()) - targets)
    unused = sorted(set(weights) - set(mapping))
    missing = sorted(set(mapping) - set(weights))
    if unset or unknown or unused or missing:
        raise ValueError(
            f"weight map: variables unset {unset}, unknown {unknown}, "
            f"tensors unused {unused}, tensors missing {missing}"
        )
    if len(set(mapping.values())) != len(mapping):
        raise ValueError("weight map: a variable is the target of more than one tensor")


def mapped_weights(
    targets: Mapping[str, tuple[int, ...]],
    mapping: Mapping[str, str],
    weights: Mapping[str, np.ndarray],
    transforms: Mapping[str, Transform] | None = None,
) -> Iterator[tuple[str, np.ndarray]]:
    """``(variable, transforms[canonical](weights[canonical]))`` for each ``canonical → variable`` of ``mapping``,
    in its order; ``targets`` holds each variable's shape. Checked as it is iterated: the map is a bijection
    (:func:`check_weight_map`) before the first pair, each shape as its pair comes (ValueError naming the tensor
    and its variable); ``dict(...)`` of it checks everything before any variable is set."""
    check_weight_map(set(targets), mapping, weights)
    transforms = transforms or {}
    taker = WeightTaker(weights)
    for canonical, target in mapping.items():
        yield target, taker.take(canonical, targets[target], transforms.get(canonical, identity), target=target)
    taker.check_all_used()
