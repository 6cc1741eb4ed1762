"""Phase training in JAX: the loss in jax.numpy and optax optimizers built from fwbench's OptimizerSpec.

The loss is ``models.training``'s: Σ w·CE(logits, labels) / Σ w, softmax cross-entropy over the last axis.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

import jax
import optax

from fwbench.frameworks.jax.weights import canonical_name
from fwbench.frameworks.roles import as_stateful_training_arch, as_training_arch
from fwbench.models.training import OptimizerSpec


def training_trees(arch: ModuleType, model: Any) -> tuple[Any, Any]:
    """(parameters an optimizer trains, non-trained state) of a built model: the arch module's
    ``training_variables`` where it is a StatefulTrainingArch (ResNet: unfolded batch norm and its running
    statistics), else the model's own parameter pytree and no state."""
    stateful = as_stateful_training_arch(arch)
    if stateful is not None:
        return stateful.training_variables(model)
    return model.params, {}


def training_forward(arch: ModuleType, model: Any) -> Callable[..., tuple[jax.Array, Any]]:
    """(params, stats, *inputs) -> (training logits, updated stats): the arch module's
    ``training_logits_and_stats`` where it is a StatefulTrainingArch (ResNet: batch norm on batch statistics
    and the running statistics' update), else its stateless ``training_logits`` (a TrainingArch) with the
    state passed through."""
    stateful = as_stateful_training_arch(arch)
    if stateful is not None:
        return functools.partial(stateful.training_logits_and_stats, model)
    stateless = as_training_arch(arch)

    def forward(params: Any, stats: Any, *inputs: jax.Array) -> tuple[jax.Array, Any]:
        return stateless.training_logits(model, params, *inputs), stats

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
    return optax.adamw(
        spec.learning_rate, b1=spec.beta_1, b2=spec.beta_2, eps=spec.epsilon, weight_decay=spec.weight_decay
    )


def with_frozen(
    optimizer: optax.GradientTransformation, params: Any, frozen: tuple[str, ...]
) -> optax.GradientTransformation:
    """``optimizer`` for every leaf but those holding the canonical tensors ``frozen`` (the description's
    ``frozen_in_training``, found through the weight map: weights.canonical_name), which get no update
    (optax.set_to_zero: neither moved nor decayed). ValueError unless each frozen tensor is one leaf."""
    if not frozen:
        return optimizer
    labels = jax.tree.map(lambda leaf: "frozen" if canonical_name(leaf) in frozen else "trained", params)
    found = sorted(name for leaf in jax.tree_util.tree_leaves(params) if (name := canonical_name(leaf)) in frozen)
    if found != sorted(frozen):
        raise ValueError(f"frozen tensors {sorted(frozen)}: parameter leaves found for {found}")
    return optax.multi_transform({"trained": optimizer, "frozen": optax.set_to_zero()}, labels)
