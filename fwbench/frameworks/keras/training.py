"""Phase training with Keras 3: optimizers built from fwbench's OptimizerSpec (used by the keras runtimes
and, on Keras' tensorflow backend, by the native tensorflow runtimes) and the loss as a Keras loss.

The loss is ``models.training``'s: Σ w·CE(logits, labels) / Σ w (``sample_weight`` = label_weights,
reduction ``mean_with_sample_weight``, which divides by Σ w).
"""

from __future__ import annotations

import keras

from fwbench.models.training import OptimizerSpec


def make_optimizer(spec: OptimizerSpec) -> keras.optimizers.Optimizer:
    """keras.optimizers.SGD (momentum, no Nesterov) or keras.optimizers.AdamW (decoupled weight decay:
    ``p ← p − lr·wd·p`` before the Adam update, as torch.optim.AdamW). Keras adds ε to √v, not to √v̂ as
    torch does; fwbench's small ε (models.training.OPTIMIZERS) keeps that difference below fp32 noise."""
    if spec.kind == "sgd":
        return keras.optimizers.SGD(learning_rate=spec.learning_rate, momentum=spec.momentum)
    return keras.optimizers.AdamW(learning_rate=spec.learning_rate, weight_decay=spec.weight_decay,
                                  beta_1=spec.beta_1, beta_2=spec.beta_2, epsilon=spec.epsilon)


def loss() -> keras.losses.Loss:
    """Sparse softmax cross-entropy of logits, weighted mean over the sample weights."""
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="mean_with_sample_weight")
