"""Phase training in TensorFlow: the loss in tf ops; optimizers are Keras 3's (the optimizers TensorFlow
ships with, ``tf.keras.optimizers``), applied to the models' plain tf.Variables.

The loss is ``models.training``'s: Σ w·CE(logits, labels) / Σ w, softmax cross-entropy over the last axis.
"""

from __future__ import annotations

import tensorflow as tf


def weighted_cross_entropy(logits: tf.Tensor, labels: tf.Tensor, weights: tf.Tensor) -> tf.Tensor:
    """logits (..., classes), labels (...) int32, weights (...) float32 → the scalar loss Σ w·CE / Σ w."""
    per_position = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    return tf.reduce_sum(per_position * weights) / tf.reduce_sum(weights)


def variable_name(canonical: str) -> str:
    """The tf.Variable name (without ``:0``) a canonical tensor was loaded into (weights.CanonicalVariables.take)."""
    return canonical.replace(".", "_")
