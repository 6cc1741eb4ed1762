"""The gemm microbenchmark in PyTorch: one bias-free square matmul.

Input ``x``: (batch, n) float32 → ``(y,)`` with y = x @ weight, (batch, n).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fwbench.frameworks.torch.weights import load_canonical
from fwbench.models.gemm import Gemm


class GemmModule(nn.Module):
    def __init__(self, description: Gemm) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(description.n, description.n))  # (in, out)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (torch.matmul(x, self.weight),)


def build_model(description: Gemm, weights: dict[str, np.ndarray], device: str) -> GemmModule:
    """The matmul with the canonical weight (same name, same (in, out) layout), on ``device``."""
    module = GemmModule(description)
    load_canonical(module, weights, {"weight": "weight"})
    return module.to(device).eval()
