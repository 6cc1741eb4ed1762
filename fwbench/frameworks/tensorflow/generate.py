"""Phase generate in TensorFlow (:class:`DecodeProgram`): the model file's ``cached_forward`` over key/value
variables padded to the generation's full length (``new_cache``), each call scattering its keys and values in place.
eager calls it as it is; function and xla as two tf.functions with fixed input signatures, the prefill's (batch,
prompt_len) and the decode's (batch,), the position an int32 scalar tensor (xla: ``jit_compile=True``): each
traces and compiles once, and no decode step retraces (the padded cache is what lets XLA keep one program, as
Hugging Face's TF generation found)."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
import tensorflow as tf

from fwbench.frameworks.roles import as_cached_decoder_arch
from fwbench.frameworks.tensorflow import precision
from fwbench.frameworks.tensorflow.tracing import tracing_counters


class DecodeProgram:
    """One cell's prefill and decode calls over one padded cache (``mode``: eager, function or xla)."""

    def __init__(self, arch: ModuleType, model: tf.Module, batch: int, prompt_len: int, max_len: int, mode: str,
                 dtype: str) -> None:  # fmt: skip
        decoder = as_cached_decoder_arch(arch)
        self.cache = decoder.new_cache(model, batch, max_len)
        forward = precision.scoped(dtype, decoder.cached_forward, xla=mode == "xla")
        cache = self.cache
        self._positions = [tf.constant(p, tf.int32) for p in range(max_len)]

        def prefill(ids: tf.Tensor, start: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            logits = forward(model, ids, start, cache)
            return tf.argmax(logits, axis=-1, output_type=tf.int32), logits

        def decode(token: tf.Tensor, start: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            return prefill(token[:, None], start)

        position = tf.TensorSpec([], tf.int32)
        self._programs: tuple[Callable[..., Any], Callable[..., Any]] = (prefill, decode)
        if mode in ("function", "xla"):
            self._programs = (
                tf.function(prefill, input_signature=[tf.TensorSpec([batch, prompt_len], tf.int32), position],
                            jit_compile=mode == "xla"),
                tf.function(decode, input_signature=[tf.TensorSpec([batch], tf.int32), position],
                            jit_compile=mode == "xla"),
            )  # fmt: skip

    def position(self, position: int) -> Any:
        """What the programs get for ``position``: its int32 scalar tensor."""
        return self._positions[position]

    def prefill(self, prompt: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return self._programs[0](prompt, self.position(0))

    def decode(self, token: tf.Tensor, position: int) -> tuple[tf.Tensor, tf.Tensor]:
        return self._programs[1](token, self.position(position))

    def decode_loop(self, token: tf.Tensor, position: int, steps: int) -> None:
        return None  # the decode steps are Python calls

    def numpy(self, value: tf.Tensor) -> np.ndarray:
        return np.asarray(value.numpy())

    def compile_counters(self) -> dict[str, int]:
        """Both tf.functions' traces (none eagerly)."""
        programs = [p for p in self._programs if hasattr(p, "experimental_get_tracing_count")]
        return {"traces": sum(tracing_counters(p)["traces"] for p in programs)} if programs else {}
