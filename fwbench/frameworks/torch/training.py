"""Phase training in PyTorch: the loss and torch.optim optimizers built from fwbench's OptimizerSpec.

The loss is ``models.training``'s: Σ w·CE(logits, labels) / Σ w, softmax cross-entropy over the last axis.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F

from fwbench.models.training import OptimizerSpec


def weighted_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """logits (..., classes), labels (...) int64, weights (...) float32 → the scalar loss Σ w·CE / Σ w."""
    per_position = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
    return (per_position * weights.reshape(-1)).sum() / weights.sum()


def make_optimizer(spec: OptimizerSpec, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """torch.optim.SGD (momentum, no dampening or Nesterov) or torch.optim.AdamW with ``spec``'s numbers."""
    if spec.kind == "sgd":
        return torch.optim.SGD(params, lr=spec.learning_rate, momentum=spec.momentum)
    return torch.optim.AdamW(
        params,
        lr=spec.learning_rate,
        betas=(spec.beta_1, spec.beta_2),
        eps=spec.epsilon,
        weight_decay=spec.weight_decay,
    )
