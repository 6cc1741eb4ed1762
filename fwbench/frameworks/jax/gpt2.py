"""GPT-2 in JAX: causal pre-LN decoder, tanh GELU, LM head tied to the token embedding.

Inputs: input_ids, attention_mask, each (batch, seq) int32. Returns ``(last_hidden_state, logits)``:
(batch, seq, hidden) and (batch, seq, vocab). Canonical Conv1D weights are already (in, out), the
layout used here, so they load unchanged; ``logits = h @ wte.T``. Phase generate: :func:`new_cache` and
:func:`cached_forward` (a fixed-size key/value cache, updated functionally at each call's positions). ``taps``: the checkpoints
(fwbench.models.checkpoints), recorded only when given a dict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fwbench.frameworks.jax import precision
from fwbench.frameworks.jax.bert import dense, layer_norm
from fwbench.frameworks.jax.weights import CanonicalParams
from fwbench.models.checkpoints import Taps, tap
from fwbench.models.gpt2 import GPT2, LAYER_SUFFIXES, GPT2Config

Params = dict[str, Any]


def causal_allowed(attention_mask: jax.Array) -> jax.Array:
    """attention_mask (B, S), 1 = real token → (B, 1, S, S) bool: query i may see key j ≤ i if it is real."""
    seq = attention_mask.shape[1]
    causal = jnp.tril(jnp.ones((seq, seq), dtype=jnp.bool_))
    return causal[None, None] & attention_mask.astype(jnp.bool_)[:, None, None, :]


def decoder_layer(
    p: Params,
    x: jax.Array,
    allowed: jax.Array,
    heads: int,
    eps: float,
    names: tuple[str, str, str] = ("", "", ""),
    taps: Taps = None,
) -> jax.Array:
    """x (B, S, H), allowed (B, 1, S, S) bool → (B, S, H). ``names``: its attention, MLP and layer outputs'
    checkpoint names, recorded in ``taps`` when it is a dict."""
    q, k, v = projected(p, x, heads, eps)
    return after_attention(p, x, precision.attention(q, k, v, allowed), eps, names, taps)


def projected(p: Params, x: jax.Array, heads: int, eps: float) -> tuple[jax.Array, ...]:
    """x (B, S, H) → q, k, v, each (B, S, heads, H / heads)."""
    b, s, h = x.shape
    return tuple(
        t.reshape(b, s, heads, h // heads)
        for t in jnp.split(dense(p["c_attn"], layer_norm(p["ln_1"], x, eps)), 3, axis=-1)
    )


def after_attention(
    p: Params,
    x: jax.Array,
    context: jax.Array,
    eps: float,
    names: tuple[str, str, str] = ("", "", ""),
    taps: Taps = None,
) -> jax.Array:
    """The layer after its attention: x (B, S, H) and the context (B, S, heads, H / heads) → its output."""
    b, s, h = x.shape
    attention_name, mlp_name, layer_name = names
    x = x + tap(taps, attention_name, dense(p["attn_proj"], context.reshape(b, s, h)))
    mlp = dense(p["mlp_proj"], jax.nn.gelu(dense(p["c_fc"], layer_norm(p["ln_2"], x, eps)), approximate=True))
    return tap(taps, layer_name, x + tap(taps, mlp_name, mlp))


Cache = list[tuple[jax.Array, jax.Array]]


def cache_allowed(positions: jax.Array, max_len: int) -> jax.Array:
    """(1, 1, S, max_len) bool: the query at ``positions`` (S,) may see the cached keys up to its own position."""
    return (jnp.arange(max_len)[None, :] <= positions[:, None])[None, None]


def cached(
    keys: jax.Array, values: jax.Array, k: jax.Array, v: jax.Array, start: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """The cache's keys and values (B, max_len, heads, d) with ``k`` and ``v`` (B, S, heads, d) written at
    positions start .. start + S - 1."""
    at = (jnp.int32(0), start, jnp.int32(0), jnp.int32(0))
    k, v = k.astype(keys.dtype), v.astype(values.dtype)  # bf16: the policy's products, kept in the float32 cache
    return jax.lax.dynamic_update_slice(keys, k, at), jax.lax.dynamic_update_slice(values, v, at)


@dataclass(frozen=True, eq=False)
class GPT2Module:
    """Static hyperparameters, the parameter pytree, and the forward function. ``apply`` reads weights
    only from its ``params`` argument, so under ``jax.jit`` they are program inputs, not constants."""

    config: GPT2Config
    params: Params
    checkpoints: tuple[tuple[str, str, str], ...]  # per layer: its attention, MLP and layer outputs' names

    def apply(
        self, params: Params, input_ids: jax.Array, attention_mask: jax.Array, taps: Taps = None
    ) -> tuple[jax.Array, jax.Array]:
        c = self.config
        seq = input_ids.shape[1]
        x = tap(taps, "embeddings", params["wte"][input_ids] + params["wpe"][:seq])
        allowed = causal_allowed(attention_mask)
        for layer, names in zip(params["layers"], self.checkpoints, strict=True):
            x = decoder_layer(layer, x, allowed, c.heads, c.layer_norm_eps, names, taps)
        x = tap(taps, "ln_f", layer_norm(params["ln_f"], x, c.layer_norm_eps))
        return x, precision.matmul(x, params["wte"].T)


def zero_cache(layers: int, shape: tuple[int, ...]) -> Cache:
    """Per layer (keys, values), each float32 zeros of ``shape`` (every decoder's cache)."""
    return [(jnp.zeros(shape, jnp.float32), jnp.zeros(shape, jnp.float32)) for _ in range(layers)]


def new_cache(model: GPT2Module, batch: int, max_len: int) -> Cache:
    """Per layer (keys, values), each (batch, max_len, heads, hidden / heads) float32 zeros."""
    c = model.config
    return zero_cache(c.layers, (batch, max_len, c.heads, c.hidden // c.heads))


def cached_forward(
    model: GPT2Module, params: Params, input_ids: jax.Array, start: jax.Array, cache: Cache
) -> tuple[jax.Array, Cache]:
    """input_ids (B, S) at positions start .. start + S - 1 (``start`` an int32 scalar: one program serves every
    step) → (the last position's logits (B, vocab), the cache (:func:`new_cache`) with their keys and values)."""
    c = model.config
    positions = start + jnp.arange(input_ids.shape[1], dtype=jnp.int32)
    allowed = cache_allowed(positions, cache[0][0].shape[1])
    x = params["wte"][input_ids] + params["wpe"][positions]
    updated: Cache = []
    for p, (keys, values) in zip(params["layers"], cache, strict=True):
        q, k, v = projected(p, x, c.heads, c.layer_norm_eps)
        keys, values = cached(keys, values, k, v, start)
        x = after_attention(p, x, precision.attention(q, keys, values, allowed), c.layer_norm_eps)
        updated.append((keys, values))
    x = layer_norm(params["ln_f"], x[:, -1], c.layer_norm_eps)
    return precision.matmul(x, params["wte"].T), updated


# canonical suffix -> (this pytree's path within a layer); Conv1D weights keep their (in, out) layout.
_SUFFIXES = {
    "ln_1.weight": ("ln_1", "scale"),
    "ln_1.bias": ("ln_1", "bias"),
    "attn.c_attn.weight": ("c_attn", "kernel"),
    "attn.c_attn.bias": ("c_attn", "bias"),
    "attn.c_proj.weight": ("attn_proj", "kernel"),
    "attn.c_proj.bias": ("attn_proj", "bias"),
    "ln_2.weight": ("ln_2", "scale"),
    "ln_2.bias": ("ln_2", "bias"),
    "mlp.c_fc.weight": ("c_fc", "kernel"),
    "mlp.c_fc.bias": ("c_fc", "bias"),
    "mlp.c_proj.weight": ("mlp_proj", "kernel"),
    "mlp.c_proj.bias": ("mlp_proj", "bias"),
}
assert set(_SUFFIXES) == set(LAYER_SUFFIXES)


def build_model(description: GPT2, weights: dict[str, np.ndarray], device: str) -> GPT2Module:
    """GPT-2 with the canonical weights (Conv1D (in, out) kernels used as they are)."""
    c = description.config
    h = c.hidden
    kernels = {"c_attn": (h, 3 * h), "attn_proj": (h, h), "c_fc": (h, c.intermediate), "mlp_proj": (c.intermediate, h)}

    def shape(module: str, leaf: str) -> tuple[int, ...]:  # (in, out) kernels, (out,) biases, (h,) norms
        if module in kernels:
            return kernels[module] if leaf == "kernel" else kernels[module][1:]
        return (h,)

    canonical = CanonicalParams(weights, device)
    params: Params = {
        "wte": canonical.take("wte.weight", (c.vocab_size, h)),
        "wpe": canonical.take("wpe.weight", (c.max_positions, h)),
        "ln_f": {"scale": canonical.take("ln_f.weight", (h,)), "bias": canonical.take("ln_f.bias", (h,))},
        "layers": [],
    }
    for i in range(c.layers):
        layer: Params = {}
        for suffix, (module, leaf) in _SUFFIXES.items():
            layer.setdefault(module, {})[leaf] = canonical.take(f"h.{i}.{suffix}", shape(module, leaf))
        params["layers"].append(layer)
    canonical.check_all_used()
    return GPT2Module(c, params, tuple((f"h.{i}.attn", f"h.{i}.mlp", f"h.{i}") for i in range(c.layers)))


def training_logits(model: GPT2Module, params: Params, input_ids: jax.Array, attention_mask: jax.Array) -> jax.Array:
    """The tied LM head's logits the causal LM loss is taken of: (batch, seq, vocab)."""
    return model.apply(params, input_ids, attention_mask)[1]
