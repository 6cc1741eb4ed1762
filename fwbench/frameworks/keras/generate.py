"""Phase generate in Keras 3 (:class:`DecodeProgram`): the model file's ``cached_forward`` (the built model's own
layers, called as Keras calls them, over a per-layer key/value cache written with ``keras.ops.slice_update``: Keras'
ops are functional, so the cache goes in and the written cache comes out, as in KerasHub's ``CausalLM.generate``),
compiled the way the Keras backend compiles the runtime's predict step:

- keras:jax: ``jax.jit`` of the stateless step (the model's variables passed as arguments through a
  ``keras.StatelessScope``, as KerasHub and Keras' own predict step do), the cache donated (updated in place); the
  position an int32 scalar on the device, so the prefill's shape and the decode's (batch, 1) are the only programs;
- keras:tensorflow: a ``tf.function`` of the step (``jit_compile`` as "auto" resolves it: XLA on a GPU only, by
  Keras' rule), the position an int32 scalar tensor: two traces;
- keras:torch: the step eagerly under ``torch.no_grad()`` ("auto" never picks torch.compile), the position a Python
  int (Keras' slice_update's fast path).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import keras
import numpy as np
from keras import ops

from fwbench.frameworks.roles import as_cached_decoder_arch
from fwbench.frameworks.tensorflow.tracing import tracing_counters


class DecodeProgram:
    """One cell's prefill and decode calls over one cache, on ``keras_backend`` (tensorflow, jax or torch)."""

    def __init__(
        self, arch: ModuleType, model: keras.Model, batch: int, max_len: int, keras_backend: str, jit_compile: bool,
    ) -> None:  # fmt: skip
        decoder = as_cached_decoder_arch(arch)
        self.keras_backend = keras_backend
        self.cache = decoder.new_cache(model, batch, max_len)

        def step(ids: Any, start: Any, cache: Any) -> tuple[Any, Any, Any]:
            """ids: the prompt (B, P), or the last tokens (B,) (made (B, 1) here, inside the program)."""
            ids = ids if len(ids.shape) == 2 else ids[:, None]
            logits, cache = decoder.cached_forward(model, ids, start, cache)
            return ops.cast(ops.argmax(logits, axis=-1), "int32"), logits, cache

        self._program: Callable[..., tuple[Any, Any, Any]] = step
        self._traced: Any = None  # keras:tensorflow's tf.function, for its trace count
        self._positions: list[Any] = list(range(max_len))  # keras:torch: Python ints
        if keras_backend == "jax":
            self._program = self._jax_program(model, step)
        elif keras_backend == "tensorflow":
            import tensorflow as tf

            self._traced = self._program = tf.function(step, jit_compile=jit_compile)
            self._positions = [tf.constant(p, tf.int32) for p in range(max_len)]
        elif keras_backend == "torch":
            import torch

            def no_grad_step(ids: Any, start: Any, cache: Any) -> tuple[Any, Any, Any]:
                with torch.no_grad():
                    return step(ids, start, cache)

            self._program = no_grad_step
        else:
            raise ValueError(f"no Keras backend {keras_backend!r}")

    def _jax_program(self, model: keras.Model, step: Callable[..., Any]) -> Callable[..., tuple[Any, Any, Any]]:
        """``jax.jit`` of ``step`` with the model's variables as arguments (their current values, held here), the
        cache donated; positions as int32 scalars on the variables' device."""
        import jax
        import jax.numpy as jnp

        variables = list(model.variables)
        values = [v.value for v in variables]
        device = next(iter(values[0].devices()))
        self._positions = [jax.device_put(jnp.int32(p), device) for p in range(len(self._positions))]

        def stateless(values: list[Any], ids: Any, start: Any, cache: Any) -> tuple[Any, Any, Any]:
            with keras.StatelessScope(state_mapping=list(zip(variables, values, strict=True))):
                return step(ids, start, cache)

        jitted = jax.jit(stateless, donate_argnums=(3,))
        return lambda ids, start, cache: jitted(values, ids, start, cache)

    def _call(self, ids: Any, position: int) -> tuple[Any, Any]:
        token, logits, self.cache = self._program(ids, self._positions[position], self.cache)
        return token, logits

    def prefill(self, prompt: Any) -> tuple[Any, Any]:
        return self._call(prompt, 0)

    def decode(self, token: Any, position: int) -> tuple[Any, Any]:
        return self._call(token, position)

    def decode_loop(self, token: Any, position: int, steps: int) -> None:
        return None  # Keras' decode steps are Python calls (KerasHub's generate loops in ops.while_loop; not timed)

    def numpy(self, value: Any) -> np.ndarray:
        return np.asarray(ops.convert_to_numpy(value))

    def compile_counters(self) -> dict[str, int]:
        """keras:tensorflow: the step's tf.function traces (the backend's own counters on jax; none on torch)."""
        return tracing_counters(self._traced) if self._traced is not None else {}
