"""The MLP in PyTorch: nn.Linear layers with ReLU between them.

Input ``x``: (batch, in_features) float32 → ``(logits,)`` with logits (batch, out_features).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fwbench.frameworks.torch.weights import load_canonical
from fwbench.models.checkpoints import Taps, tap
from fwbench.models.mlp import MLP


class MLPModule(nn.Module):
    def __init__(self, description: MLP) -> None:
        super().__init__()
        self.layer_names = [prefix for prefix, _, _ in description.layers]
        for prefix, fan_in, fan_out in description.layers:
            self.add_module(prefix, nn.Linear(fan_in, fan_out))

    def forward(self, x: torch.Tensor, taps: Taps = None) -> tuple[torch.Tensor]:
        """``taps``: every layer's output by its name (fwbench.models.checkpoints), when given a dict."""
        last = len(self.layer_names) - 1
        for i, name in enumerate(self.layer_names):
            x = getattr(self, name)(x)
            if i < last:
                x = torch.relu(x)
            tap(taps, name, x)
        return (x,)


def build_model(description: MLP, weights: dict[str, np.ndarray], device: str) -> MLPModule:
    """The MLP with the canonical weights (names and layouts are nn.Linear's own), on ``device``."""
    module = MLPModule(description)
    mapping = {spec.name: spec.name for spec in description.param_schema()}
    load_canonical(module, weights, mapping)
    return module.to(device).eval()


def training_logits(module: MLPModule, x: torch.Tensor) -> torch.Tensor:
    """The logits the training loss is taken of: (batch, out_features)."""
    return module(x)[0]
