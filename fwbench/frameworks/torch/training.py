"""Phase training in PyTorch: the loss and torch.optim optimizers built from fwbench's OptimizerSpec.

The loss is ``models.training``'s: Σ w·CE(logits, labels) / Σ w, softmax cross-entropy over the last axis.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F

from fwbench.frameworks.base import Backend
from fwbench.models.fit import EpochEnd, WaitClock
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


def train_epochs(
    backend: Backend,
    arch: Any,
    model: Any,
    optimizer: torch.optim.Optimizer,
    loader: Any,
    epochs: int,
    epoch_end: EpochEnd,
    clock: WaitClock | None = None,
    epoch_mean: Callable[[torch.Tensor, int], float] = lambda total, batches: float(total) / batches,
) -> tuple[list[float], list[float]]:
    """The manual loop's epochs: for each batch of ``loader`` (inputs..., labels) zero_grad, forward through
    ``model`` (anything ``training_logits`` calls: the module, or DDP's view of it) + F.cross_entropy, backward,
    optimizer step; ``epoch_end`` after each epoch's clock stops. Returns each epoch's seconds and mean loss
    (``epoch_mean`` of the summed batch losses and the batch count; reading it waits for the epoch's work)."""
    device, on_cuda = backend.device, backend.device == "cuda"
    epoch_s: list[float] = []
    epoch_loss: list[float] = []
    for _ in range(epochs):
        epoch_start = time.perf_counter()
        total, batches = torch.zeros((), device=device), 0
        if clock is not None:
            clock.start_epoch()
        for *xs, y in clock.batches(loader) if clock is not None else loader:
            xs, y = [x.to(device, non_blocking=True) for x in xs], y.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(arch.training_logits(model, *xs), y)
            loss.backward()
            optimizer.step()
            total += loss.detach()
            batches += 1
        if clock is not None:
            clock.end_epoch()
        mean = epoch_mean(total, batches)
        if on_cuda:
            torch.cuda.synchronize()
        epoch_s.append(time.perf_counter() - epoch_start)
        epoch_loss.append(mean)
        epoch_end(epoch_s[-1])
    return epoch_s, epoch_loss
