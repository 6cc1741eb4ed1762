"""Keras 3 itself, loaded with one backend: what the keras runtimes (``fwbench/frameworks/keras/``) and TensorFlow's
native training (TF 2.21's optimizers are Keras 3's) share, below both. Keras reads ``KERAS_BACKEND`` once, when it is
first imported, so this module imports no framework at its top; :mod:`.optimizers` (which imports keras) holds the
optimizers both build from fwbench's ``OptimizerSpec``."""

from __future__ import annotations

import os
import sys
from types import ModuleType


def _check_backend(keras: ModuleType, backend: str) -> None:
    active = keras.backend.backend()
    if active != backend:
        raise RuntimeError(
            f"keras:{backend} needs Keras' {backend} backend, but keras was imported with the "
            f"{active} backend in this process (KERAS_BACKEND is read once, when keras is first "
            f"imported): run keras:{backend} in a fresh process"
        )


def refuse_other_backend(backend: str) -> None:
    """RuntimeError if keras is already loaded in this process with a backend other than ``backend``."""
    loaded = sys.modules.get("keras")
    if loaded is not None:
        _check_backend(loaded, backend)


def import_keras(backend: str, device: str) -> ModuleType:
    """keras, imported with ``backend`` as its backend; RuntimeError if it is (already) loaded with another."""
    refuse_other_backend(backend)
    if "keras" not in sys.modules:
        os.environ["KERAS_BACKEND"] = backend
        if backend == "torch":  # where keras.ops create tensors inside a call (arange, ones, ...)
            os.environ["KERAS_TORCH_DEVICE"] = "cuda" if device == "cuda" else "cpu"
    import keras

    _check_backend(keras, backend)  # e.g. a keras that ignores KERAS_BACKEND
    image_format = keras.config.image_data_format()
    if image_format != "channels_last":
        raise RuntimeError(f"keras image_data_format is {image_format!r}; the Keras models here are channels_last")
    return keras
