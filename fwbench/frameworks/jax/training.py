"""Phase training in JAX: the loss in jax.numpy and optax optimizers built from fwbench's OptimizerSpec.

The loss is ``models.training``'s: Σ w·CE(logits, labels) / Σ w, softmax cross-entropy over the last axis.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import optax

from fwbench.models.training import OptimizerSpec


def training_trees(arch: Any, model: Any) -> tuple[Any, Any]:
    """(parameters an optimizer trains, non-trained state) of a built model: the arch module's
    ``training_variables`` where it has one (ResNet: unfolded batch norm and its running statistics), else
    the model's own parameter pytree and no state."""
    if hasattr(arch, "training_variables"):
        return arch.training_variables(model)
    return model.params, {}


def training_forward(arch: Any, model: Any) -> Callable[..., tuple[jax.Array, Any]]:
    """(params, stats, *inputs) -> (training logits, updated stats): the arch module's
    ``training_logits_and_stats`` where the model has state (ResNet: batch norm on batch statistics and
    the running statistics' update), else its stateless ``training_logits`` with the state passed through."""
    if hasattr(arch, "training_logits_and_stats"):
        return functools.partial(arch.training_logits_and_stats, model)

    def forward(params: Any, stats: Any, *inputs: jax.Array) -> tuple[jax.Array, Any]:
        return arch.training_logits(model, params, *inputs), stats

    return forward


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
