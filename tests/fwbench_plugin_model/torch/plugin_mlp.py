"""plugin-mlp in PyTorch: Linear → tanh → Linear.

Input ``x``: (batch, 8) float32 → ``(logits,)``, logits (batch, 4).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fwbench.frameworks.torch.weights import load_canonical
from fwbench_plugin_model import PluginMLP


class PluginMLPModule(nn.Module):
    def __init__(self, description: PluginMLP) -> None:
        super().__init__()
        n_in, hidden, n_out = description.widths
        self.hidden = nn.Linear(n_in, hidden)
        self.out = nn.Linear(hidden, n_out)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.out(torch.tanh(self.hidden(x))),)


def build_model(description: PluginMLP, weights: dict[str, np.ndarray], device: str) -> PluginMLPModule:
    """The module with the canonical weights (names and layouts are nn.Linear's own), on ``device``."""
    module = PluginMLPModule(description)
    load_canonical(module, weights, {spec.name: spec.name for spec in description.param_schema()})
    return module.to(device).eval()


def training_logits(module: PluginMLPModule, x: torch.Tensor) -> torch.Tensor:
    """(batch, 4) logits the training loss is taken of."""
    return module(x)[0]
