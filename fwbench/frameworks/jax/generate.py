"""Phase generate in JAX (:class:`DecodeProgram`): the model file's ``cached_forward`` over a fixed-size key/value
cache (``new_cache``), ``jax.jit``-compiled with the cache donated (updated in place, not copied, where the backend
allows donation) and the position an int32 scalar argument: the prefill's shape and the decode's (batch, 1) are the
only two programs. :meth:`DecodeProgram.decode_loop` is the other way JAX decodes: every decode step inside one
compiled ``jax.lax.fori_loop`` (one call, no Python between the steps)."""

from __future__ import annotations

from functools import partial
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fwbench.frameworks.jax import precision
from fwbench.frameworks.roles import as_cached_decoder_arch


class DecodeProgram:
    """One cell's prefill, decode and decode-loop programs over one cache."""

    def __init__(self, arch: ModuleType, model: Any, batch: int, max_len: int, dtype: str, device: jax.Device) -> None:
        decoder = as_cached_decoder_arch(arch)
        forward = precision.scoped(dtype, partial(decoder.cached_forward, model))
        self.params = model.params
        self.cache = jax.device_put(decoder.new_cache(model, batch, max_len), device)
        # one int32 scalar per position, on the device, made here
        self._positions = [jax.device_put(jnp.int32(p), device) for p in range(max_len)]

        def step(params: Any, ids: jax.Array, start: jax.Array, cache: Any) -> tuple[jax.Array, jax.Array, Any]:
            """ids: the prompt (B, P), or the last tokens (B,) (made (B, 1) here, inside the program)."""
            logits, cache = forward(params, ids if ids.ndim == 2 else ids[:, None], start, cache)
            return jnp.argmax(logits, axis=-1).astype(jnp.int32), logits, cache

        def loop(params: Any, token: jax.Array, start: jax.Array, cache: Any, steps: int) -> tuple[jax.Array, Any]:
            tokens = jnp.zeros((token.shape[0], steps), jnp.int32)

            def body(i: jax.Array, carry: tuple[jax.Array, jax.Array, Any]) -> tuple[jax.Array, jax.Array, Any]:
                token, tokens, cache = carry
                token, _, cache = step(params, token, start + i, cache)
                return token, tokens.at[:, i].set(token), cache

            _, tokens, cache = jax.lax.fori_loop(0, steps, body, (token, tokens, cache))
            return tokens, cache

        self._step = jax.jit(step, donate_argnums=(3,))
        self._loop = jax.jit(loop, static_argnums=(4,), donate_argnums=(3,))

    def position(self, position: int) -> Any:
        """What the programs get for ``position``: its int32 scalar on the device."""
        return self._positions[position]

    def prefill(self, prompt: jax.Array) -> tuple[jax.Array, jax.Array]:
        token, logits, self.cache = self._step(self.params, prompt, self.position(0), self.cache)
        return token, logits

    def decode(self, token: jax.Array, position: int) -> tuple[jax.Array, jax.Array]:
        token, logits, self.cache = self._step(self.params, token, self.position(position), self.cache)
        return token, logits

    def decode_loop(self, token: jax.Array, position: int, steps: int) -> jax.Array:
        tokens, self.cache = self._loop(self.params, token, self.position(position), self.cache, steps)
        return tokens

    def numpy(self, value: jax.Array) -> np.ndarray:
        return np.asarray(value)
