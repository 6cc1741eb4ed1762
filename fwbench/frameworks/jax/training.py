"""Phase training in JAX: the loss in jax.numpy and optax optimizers built from fwbench's OptimizerSpec.

The loss is ``models.training``'s: Σ w·CE(logits, labels) / Σ w, softmax cross-entropy over the last axis.
"""

from __future__ import annotations

from typing import Any

import jax
import optax

from fwbench.models.training import OptimizerSpec


def weighted_cross_entropy(logits: jax.Array, labels: jax.Array, weights: jax.Array) -> jax.Array:
    """logits (..., classes), labels (...) int32, weights (...) float32 → the scalar loss Σ w·CE / Σ w."""
    per_position = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    return (per_position * weights).sum() / weights.sum()


def make_optimizer(spec: OptimizerSpec) -> optax.GradientTransformation:
    """optax.sgd (heavy-ball momentum: trace t ← g + μ·t, as torch.optim.SGD) or optax.adamw (ε added to
    √v̂ and decoupled weight decay lr·wd·p, as torch.optim.AdamW)."""
    if spec.kind == "sgd":
        return optax.sgd(spec.learning_rate, momentum=spec.momentum)
    return optax.adamw(spec.learning_rate, b1=spec.beta_1, b2=spec.beta_2, eps=spec.epsilon,
                       weight_decay=spec.weight_decay)


def with_frozen(optimizer: optax.GradientTransformation, params: Any,
                frozen_keys: tuple[str, ...]) -> optax.GradientTransformation:
    """``optimizer`` for every leaf but those under the top-level ``frozen_keys``, which get no update
    (optax.set_to_zero: neither moved nor decayed)."""
    if not frozen_keys:
        return optimizer
    labels = {key: jax.tree.map(lambda _, k=key: "frozen" if k in frozen_keys else "trained", value)
              for key, value in params.items()}
    return optax.multi_transform({"trained": optimizer, "frozen": optax.set_to_zero()}, labels)
