"""Copy canonical numpy weights into a torch module through an explicit name map, with shape asserts."""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping

import numpy as np
import torch
from torch import nn

from fwbench.models.weightmap import Transform, mapped_weights

# Buffers that are not part of any canonical weight set: BatchNorm's step counter (used only by a
# momentum-less running average in training).
NOT_CANONICAL_BUFFERS = ("num_batches_tracked",)
# The weight map each module was loaded through (canonical name -> parameter or buffer name).
_WEIGHT_MAPS: weakref.WeakKeyDictionary[nn.Module, dict[str, str]] = weakref.WeakKeyDictionary()


def load_canonical(
    module: nn.Module,
    weights: dict[str, np.ndarray],
    mapping: dict[str, str],
    transforms: Mapping[str, Transform] | None = None,
) -> None:
    """Set each parameter or buffer ``mapping[canonical]`` of ``module`` to ``weights[canonical]``.

    ``transforms`` changes a tensor's layout on the way (e.g. ``weightmap.transpose``). Checked by
    :func:`fwbench.models.weightmap.mapped_weights`: every canonical tensor used, every parameter and
    buffer (but ``NOT_CANONICAL_BUFFERS``) set exactly once, and every shape equal after the transform
    (no broadcasting); otherwise ValueError.
    """
    targets: dict[str, torch.Tensor] = dict(module.named_parameters())
    targets.update((n, b) for n, b in module.named_buffers() if not n.endswith(NOT_CANONICAL_BUFFERS))
    shapes = {name: tuple(tensor.shape) for name, tensor in targets.items()}
    with torch.no_grad():
        for target, value in mapped_weights(shapes, mapping, weights, transforms):
            targets[target].copy_(torch.from_numpy(np.ascontiguousarray(value)))
    _WEIGHT_MAPS[module] = dict(mapping)


def gradient_arrays(model: nn.Module) -> list[np.ndarray]:
    """The gradient of each tensor :func:`parameter_arrays` lists, in its order and layout, float32: a parameter's
    ``.grad`` (zeros where it has none: frozen, or not reached by the loss), zeros for a buffer."""
    tensors: list[tuple[torch.Tensor, torch.Tensor | None]] = [(p, p.grad) for _, p in model.named_parameters()]
    tensors += [(b, None) for n, b in model.named_buffers() if not n.endswith(NOT_CANONICAL_BUFFERS)]
    return [
        (torch.zeros_like(t) if g is None else g).detach().to("cpu", torch.float32).numpy().copy()
        for t, g in tensors
        if t.is_floating_point()
    ]


def variable_names(module: nn.Module, canonical: Iterable[str]) -> set[str]:
    """The parameter or buffer names of ``module`` the ``canonical`` tensors were loaded into (through the map
    :func:`load_canonical` checked); ValueError for a module not loaded by it or a name not in its map."""
    mapping = _WEIGHT_MAPS.get(module)
    if mapping is None:
        raise ValueError(f"{type(module).__name__} was not loaded by load_canonical")
    unknown = sorted(set(canonical) - set(mapping))
    if unknown:
        raise ValueError(f"{type(module).__name__}: canonical tensors {unknown} are not in its weight map")
    return {mapping[name] for name in canonical}


def parameter_arrays(model: nn.Module) -> list[np.ndarray]:
    """Every floating parameter and buffer of ``model`` (in ``named_parameters`` then ``named_buffers``
    order, ``NOT_CANONICAL_BUFFERS`` left out) as float32 numpy copies, in the module's own layout."""
    tensors: list[torch.Tensor] = [p for _, p in model.named_parameters()]
    tensors += [b for n, b in model.named_buffers() if not n.endswith(NOT_CANONICAL_BUFFERS)]
    return [t.detach().to("cpu", torch.float32).numpy().copy() for t in tensors if t.is_floating_point()]
