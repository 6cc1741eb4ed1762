"""Keras 3's optimizers built from fwbench's OptimizerSpec: used by the keras runtimes and, on Keras' tensorflow
backend, by the native tensorflow runtimes.

Dense gradients. On Keras' tensorflow backend an embedding lookup (``tf.gather``) gives its table a
``tf.IndexedSlices`` gradient: one slice per gathered position, a row gathered k times appearing k times.
Keras 3.15's Adam/AdamW ``update_step`` squares that gradient for the second moment with ``ops.square``,
which keeps IndexedSlices and squares slice by slice, and only then densifies it (summing the slices of
each row): ``v`` gets Σᵢ gᵢ² where AdamW (torch.optim.AdamW, optax, Keras on jax/torch, Keras on dense
gradients) has (Σᵢ gᵢ)². BERT's ``token_type_embeddings`` (2 rows, each gathered batch·seq/2 times)
moved 4.6e-2 (relative L2) away from torch's in two steps. The optimizers made here therefore densify
every IndexedSlices gradient first (``tf.convert_to_tensor``, TF's own densification, which sums the
slices of each row, as the native tensorflow runtimes do to theirs before the same optimizer), then run
Keras' own ``apply`` unchanged: the same update rule as on the other backends. Keras offers no setting
for this. (SGD's update is linear in the gradient, so it is exact either way; it is densified too, to
give every Keras optimizer the gradients every other runtime's optimizer gets.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras

from fwbench.models.training import OptimizerSpec


def dense_gradients(grads: Sequence[Any]) -> list[Any]:
    """``grads`` with each ``tf.IndexedSlices`` made a dense tensor of its variable's shape (rows summed
    per index); other gradients, and every gradient on the jax and torch backends, unchanged."""
    if keras.backend.backend() != "tensorflow":
        return list(grads)
    import tensorflow as tf

    return [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]


class AdamW(keras.optimizers.AdamW):
    """keras.optimizers.AdamW given dense gradients (module docstring: Keras' sparse second moment)."""

    def apply(self, grads: Sequence[Any], trainable_variables: Sequence[Any] | None = None) -> Any:
        return super().apply(dense_gradients(grads), trainable_variables)


class SGD(keras.optimizers.SGD):
    """keras.optimizers.SGD given dense gradients, as :class:`AdamW`."""

    def apply(self, grads: Sequence[Any], trainable_variables: Sequence[Any] | None = None) -> Any:
        return super().apply(dense_gradients(grads), trainable_variables)


def make_optimizer(spec: OptimizerSpec) -> keras.optimizers.Optimizer:
    """keras.optimizers.SGD (momentum, no Nesterov) or keras.optimizers.AdamW (decoupled weight decay:
    ``p ← p − lr·wd·p`` before the Adam update, as torch.optim.AdamW). Keras adds ε to √v, not to √v̂ as
    torch does; fwbench's small ε (models.training.OPTIMIZERS) keeps that difference below fp32 noise. Both
    densify IndexedSlices gradients before Keras' own update (module docstring)."""
    if spec.kind == "sgd":
        return SGD(learning_rate=spec.learning_rate, momentum=spec.momentum)
    return AdamW(
        learning_rate=spec.learning_rate,
        weight_decay=spec.weight_decay,
        beta_1=spec.beta_1,
        beta_2=spec.beta_2,
        epsilon=spec.epsilon,
    )
