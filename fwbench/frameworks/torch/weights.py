"""Copy canonical numpy weights into a torch module through an explicit name map, with shape asserts."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from torch import nn


def load_canonical(
    module: nn.Module,
    weights: dict[str, np.ndarray],
    mapping: dict[str, str],
    transforms: dict[str, Callable[[np.ndarray], np.ndarray]] | None = None,
) -> None:
    """Set each ``module`` parameter ``mapping[canonical]`` to ``weights[canonical]``.

    ``transforms`` changes a tensor's layout on the way (e.g. a transpose). Every canonical tensor
    must be used, every parameter set, and every shape equal after the transform (no broadcasting).
    """
    transforms = transforms or {}
    params = dict(module.named_parameters())
    unset = sorted(set(params) - set(mapping.values()))
    unknown = sorted(set(mapping.values()) - set(params))
    unused = sorted(set(weights) - set(mapping))
    if unset or unknown or unused:
        raise ValueError(f"weight map: parameters unset {unset}, unknown {unknown}, tensors unused {unused}")
    with torch.no_grad():
        for canonical, target in mapping.items():
            value = transforms.get(canonical, lambda a: a)(weights[canonical])
            if tuple(params[target].shape) != value.shape:
                raise ValueError(f"{canonical} -> {target}: shape {value.shape} != {tuple(params[target].shape)}")
            params[target].copy_(torch.from_numpy(np.ascontiguousarray(value)))
