"""Phase fit with Keras 3 (``keras:tensorflow``, ``keras:jax``, ``keras:torch``): ``model.fit`` as a user
calls it, on the numpy arrays, after ``model.compile(optimizer, loss, jit_compile="auto")`` of the arch's
training model (the same layers and variables, the logits as its one output). Per-epoch wall time from a
Keras callback (on_epoch_begin / on_epoch_end), per-epoch loss from the History. fwbench.models.fit says
what is trained. ResNet: ``fit`` calls the model with ``training=True`` (every BatchNorm on batch statistics,
updating its moving ones, torch's rule), ``predict`` with ``training=False`` (the moving statistics).
"""

from __future__ import annotations

import time
from typing import Any

import keras
import numpy as np

from fwbench.frameworks.base import Backend, as_keras_training_arch
from fwbench.frameworks.keras.backend import _CHANNELS_FIRST_INPUTS
from fwbench.frameworks.keras.training import loss as keras_loss
from fwbench.frameworks.keras.training import make_optimizer
from fwbench.models.fit import EpochEnd, FitDataset, FitResult, no_pause
from fwbench.models.training import optimizer_spec


class EpochClock(keras.callbacks.Callback):
    """Wall seconds of each epoch, from Keras' own epoch hooks, each handed to ``epoch_end`` once measured."""

    def __init__(self, epoch_end: EpochEnd) -> None:
        super().__init__()
        self.epoch_s: list[float] = []
        self.epoch_end = epoch_end

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.epoch_s.append(time.perf_counter() - self.start)
        self.epoch_end(self.epoch_s[-1])


def fit(
    backend: Backend, dataset: FitDataset, epochs: int, batch_size: int, epoch_end: EpochEnd = no_pause
) -> FitResult:
    """``epochs`` epochs of ``dataset`` in batches of ``batch_size`` (see the module docstring)."""
    assert backend.description is not None
    if backend.mode == "torch":
        backend._make_variables_leaves()  # type: ignore[attr-defined]
    arch = as_keras_training_arch(backend.arch_module())
    clock = EpochClock(epoch_end)
    started = time.perf_counter()
    model = arch.training_model(backend.model, backend.description)
    model.compile(
        optimizer=make_optimizer(optimizer_spec(backend.settings.optimizer)), loss=keras_loss(), jit_compile="auto"
    )
    inputs = {
        name: np.ascontiguousarray(a.transpose(0, 2, 3, 1)) if name in _CHANNELS_FIRST_INPUTS else a
        for name, a in dataset.inputs.items()
    }  # the Keras image models are channels_last, as inference
    history = model.fit(
        inputs, dataset.labels, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0, callbacks=[clock]
    )
    total_s = time.perf_counter() - started
    logits = model.predict(inputs, batch_size=batch_size, verbose=0)
    # "auto" is XLA on the tensorflow and jax backends and no compiler on torch: the loop's name says which
    return FitResult(
        f"keras model.fit (jit_compile={bool(model.jit_compile)})",
        clock.epoch_s,
        [float(v) for v in history.history["loss"]],
        np.asarray(logits, dtype=np.float32),
        total_s,
        {"jit_compile": bool(model.jit_compile)},
    )
