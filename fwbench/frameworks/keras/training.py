"""Phase training with Keras 3: the loss as a Keras loss (the optimizers, shared with the native tensorflow runtimes,
are :mod:`fwbench.frameworks.keras3.optimizers`'s).

The loss is ``models.training``'s: Σ w·CE(logits, labels) / Σ w (``sample_weight`` = label_weights,
reduction ``mean_with_sample_weight``, which divides by Σ w).
"""

from __future__ import annotations

import keras


def loss() -> keras.losses.Loss:
    """Sparse softmax cross-entropy of logits, weighted mean over the sample weights."""
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="mean_with_sample_weight")
