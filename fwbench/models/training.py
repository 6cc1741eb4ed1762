"""What phase ``training`` computes, framework-free: targets, the loss, and the optimizers as data.

Targets (``ModelDescription.make_targets``) are two arrays of the same shape: ``labels`` (int32 class
or token ids) and ``label_weights`` (float32, 1 where a position counts in the loss, 0 elsewhere):
(batch,) for the MLP, (batch, seq) for the text models.

The loss is softmax cross-entropy over the last axis of the training logits, averaged over the
counted positions: ``loss = Σ w·(logsumexp(z) − z[label]) / Σ w`` (every framework computes exactly
this, from logits, in float32; the reference here in float64).

Optimizers are :class:`OptimizerSpec` values, one per ``Settings.optimizer``; each framework builds its
own library's optimizer from the same numbers (torch.optim, optax, Keras). Weight decay is decoupled
as ``torch.optim.AdamW`` defines it (``p ← p − lr·wd·p`` alongside the Adam update), applied to every
trained parameter, biases and LayerNorm parameters included.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fwbench.models.base import tensor_rng
from fwbench.spec import OPTIMIZER_KINDS, OptimizerKind


@dataclass(frozen=True)
class OptimizerSpec:
    """One optimizer's hyperparameters. ``sgd``: heavy-ball momentum as torch.optim.SGD (buf ← μ·buf + g,
    p ← p − lr·buf; no dampening, no Nesterov, no weight decay). ``adamw``: torch.optim.AdamW (bias
    corrected moments, ε added to √v̂, decoupled weight decay ``weight_decay``).

    AdamW's ε is 1e-10, not torch's default 1e-8: Keras adds ε to √v, not to √v̂ (so its ε acts like
    ε/√(1 − β₂ᵗ), 32x larger at the first step), and with 1e-8 that alone moved the MLP's parameters by
    5e-5 (relative) after two steps; at 1e-10 every library agrees with torch to ~1e-6."""

    kind: OptimizerKind
    learning_rate: float
    momentum: float = 0.0
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-8
    weight_decay: float = 0.0


OPTIMIZERS: dict[str, OptimizerSpec] = {
    "sgd": OptimizerSpec("sgd", learning_rate=1e-2, momentum=0.9),
    "adamw": OptimizerSpec("adamw", learning_rate=1e-3, beta_1=0.9, beta_2=0.999, epsilon=1e-10, weight_decay=0.01),
}
assert set(OPTIMIZERS) == set(OPTIMIZER_KINDS)


def optimizer_spec(kind: str) -> OptimizerSpec:
    """The optimizer ``Settings.optimizer`` names (validated there)."""
    return OPTIMIZERS[kind]


def cross_entropy_sums(logits: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> tuple[float, float]:
    """(Σ w·CE, Σ w) in float64 for logits (..., classes), labels and weights (...)."""
    z = logits.astype(np.float64)
    top = z.max(-1, keepdims=True)
    logsumexp = np.log(np.exp(z - top).sum(-1)) + top[..., 0]
    picked = np.take_along_axis(z, labels[..., None].astype(np.int64), axis=-1)[..., 0]
    w = weights.astype(np.float64)
    return float((w * (logsumexp - picked)).sum()), float(w.sum())


def reference_loss(logits: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> float:
    """The training loss in float64: Σ w·CE / Σ w."""
    total, count = cross_entropy_sums(logits, labels, weights)
    return total / count


def tied_lm_reference_loss(
    hidden: np.ndarray, embeddings: np.ndarray, labels: np.ndarray, weights: np.ndarray
) -> float:
    """The loss of a tied LM head, logits = hidden @ embeddings.T, computed one sequence at a time so that
    the float64 logits of one row (seq, vocab) are all that is held. hidden (B, S, H), embeddings (V, H)."""
    table = embeddings.astype(np.float64)
    total = count = 0.0
    for row in range(hidden.shape[0]):
        row_total, row_count = cross_entropy_sums(hidden[row].astype(np.float64) @ table.T, labels[row], weights[row])
        total, count = total + row_total, count + row_count
    return total / count


def class_targets(batch_size: int, num_classes: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded classification targets: labels (batch,) int32 class ids in [0, num_classes), label_weights
    (batch,) float32 all 1 (every sample counts)."""
    rng = tensor_rng(seed, f"targets/labels/{batch_size}")
    labels = rng.integers(0, num_classes, size=batch_size, dtype=np.int64).astype(np.int32)
    return {"labels": labels, "label_weights": np.ones(batch_size, dtype=np.float32)}
