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

from fwbench.datasets.images import LoaderInput
from fwbench.frameworks.base import Backend
from fwbench.frameworks.keras.backend import _CHANNELS_FIRST_INPUTS
from fwbench.frameworks.keras.training import commit_jax_training_state
from fwbench.frameworks.keras.training import loss as keras_loss
from fwbench.frameworks.keras3.optimizers import make_optimizer
from fwbench.frameworks.roles import as_keras_training_arch
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


# A fit from images: the loader each backend's model.fit reads (the framework's own, as its users would pass it).
LOADERS = {"tensorflow": "tensorflow:data", "jax": "grain:dataloader"}
NO_WAIT = (
    "not separable: model.fit fetches each batch inside its own train function (tf.function on TensorFlow, the "
    "Python train step on JAX), after the batch-begin callback; the epoch times include the waits"
)


def _loader_data(backend: Backend, source: LoaderInput, batch_size: int, epochs: int) -> Any:
    """What ``model.fit`` reads from the images: tf.data's pipeline (keras:tensorflow) or Grain's DataLoader
    (keras:jax), ``epochs`` passes that model.fit, given ``steps_per_epoch``, reads with one iterator (each epoch
    new random crops); batches (images NHWC, labels): the Keras image models are channels_last."""
    if backend.mode == "tensorflow":
        from fwbench.frameworks.tensorflow import data as tf_data

        return tf_data.make_loader(
            source.folder, batch_size, source.workers, source.crop, source.transform, source.seed, epochs=epochs,
            exclude=source.exclude,
        )  # fmt: skip
    if backend.mode == "jax":
        from fwbench.frameworks.grain import data as grain_data

        return grain_data.make_loader(
            source.folder, batch_size, source.workers, source.crop, source.transform, source.seed, epochs=epochs,
            exclude=source.exclude, indices=False,
        )  # fmt: skip
    raise NotImplementedError(
        f"keras:{backend.mode} has no fit loop reading --input (keras:tensorflow, keras:jax have)"
    )


def fit(
    backend: Backend,
    dataset: FitDataset,
    epochs: int,
    batch_size: int,
    epoch_end: EpochEnd = no_pause,
    loader: LoaderInput | None = None,
) -> FitResult:
    """``epochs`` epochs of ``dataset`` in batches of ``batch_size`` (see the module docstring). With ``loader``
    model.fit reads the images through its backend's loader instead (:data:`LOADERS`), ``dataset`` being the
    evaluation set only; the loop's wait for data cannot be measured apart (:data:`NO_WAIT`)."""
    assert backend.description is not None
    data = _loader_data(backend, loader, batch_size, epochs) if loader is not None else None
    if backend.mode == "torch":
        backend._make_variables_leaves()  # type: ignore[attr-defined]
    arch = as_keras_training_arch(backend.arch_module())
    clock = EpochClock(epoch_end)
    started = time.perf_counter()
    model = arch.training_model(backend.model, backend.description)
    model.compile(
        optimizer=make_optimizer(optimizer_spec(backend.settings.optimizer)), loss=keras_loss(), jit_compile="auto"
    )
    if backend.mode == "jax":
        commit_jax_training_state(model, backend.device)
    inputs = {
        name: np.ascontiguousarray(a.transpose(0, 2, 3, 1)) if name in _CHANNELS_FIRST_INPUTS else a
        for name, a in dataset.inputs.items()
    }  # the Keras image models are channels_last, as inference
    if data is None:
        history = model.fit(
            inputs, dataset.labels, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0, callbacks=[clock]
        )
    else:
        steps = dataset.size // batch_size  # the loader drops the last incomplete batch
        history = model.fit(data, epochs=epochs, steps_per_epoch=steps, verbose=0, callbacks=[clock])
    total_s = time.perf_counter() - started
    logits = model.predict(inputs, batch_size=batch_size, verbose=0)
    extra: dict[str, Any] = {"jit_compile": bool(model.jit_compile)}
    if loader is not None:
        extra["input"] = {
            "loader": LOADERS[backend.mode],
            "layout": "NHWC",
            "wait_fraction": None,
            "measured_as": NO_WAIT,
        }
    # "auto" is XLA on the tensorflow and jax backends and no compiler on torch: the loop's name says which
    return FitResult(
        f"keras model.fit (jit_compile={bool(model.jit_compile)})"
        + (f" over the dataset's JPEGs ({LOADERS[backend.mode]})" if loader is not None else ""),
        clock.epoch_s,
        [float(v) for v in history.history["loss"]],
        np.asarray(logits, dtype=np.float32),
        total_s,
        extra,
    )
