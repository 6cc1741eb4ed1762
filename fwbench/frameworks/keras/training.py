"""Phase training with Keras 3: the loss as a Keras loss (the optimizers, shared with the native tensorflow runtimes,
are :mod:`fwbench.frameworks.keras3.optimizers`'s), and keras:jax's training state committed before the first step.

The loss is ``models.training``'s: Σ w·CE(logits, labels) / Σ w (``sample_weight`` = label_weights,
reduction ``mean_with_sample_weight``, which divides by Σ w).
"""

from __future__ import annotations

import keras


def loss() -> keras.losses.Loss:
    """Sparse softmax cross-entropy of logits, weighted mean over the sample weights."""
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="mean_with_sample_weight")


def commit_jax_training_state(model: keras.Model, device: str) -> None:
    """keras:jax, after ``model.compile``: build the optimizer's variables now and commit them and the model's to
    ``device`` (no copy: the same buffers). Keras creates them uncommitted while every state a train step returns is
    committed, so the first step (``train_on_batch`` or ``fit``'s) would compile a program that the second compiles
    again for the committed arguments: twice the compile time, in the first epoch or the warm-up."""
    import jax

    from fwbench.frameworks.jax.weights import jax_device

    model.optimizer.build(model.trainable_variables)
    committed_to = jax_device(device)
    for variable in (*model.variables, *model.optimizer.variables):
        variable.assign(jax.device_put(variable.value, committed_to))
