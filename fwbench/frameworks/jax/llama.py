"""The Llama layout in JAX: RMSNorm, rotary positions, SwiGLU, grouped-query attention, tied or untied head.

Inputs: input_ids, attention_mask, each (batch, seq) int32. Returns ``(last_hidden_state, logits)``: (batch, seq,
hidden) and (batch, seq, vocab); phase generate: :func:`new_cache` and :func:`cached_forward`. Canonical
nn.Linear (out, in) weights are transposed once into (in, out) kernels when loading. ``taps``: the checkpoints
(fwbench.models.checkpoints), recorded only when given a dict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fwbench.frameworks.jax import precision
from fwbench.frameworks.jax.gpt2 import Cache, cache_allowed, cached, causal_allowed, zero_cache
from fwbench.frameworks.jax.weights import CanonicalParams
from fwbench.models.checkpoints import Taps, tap
from fwbench.models.llama import (
    EMBEDDING,
    FINAL_NORM,
    LAYER_SUFFIXES,
    LM_HEAD,
    Llama,
    LlamaConfig,
    layer_checkpoints,
    layer_prefix,
)
from fwbench.models.weightmap import transpose

Params = dict[str, Any]


def rotary_tables(positions: int | jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """(cos, sin), each (S, 1, head_dim) float32 for ``positions`` (S,), or 0..positions-1 when an int
    (fwbench.models.llama.rotary_tables), shaped to broadcast over (B, S, heads, d)."""
    if isinstance(positions, int):
        positions = jnp.arange(positions)
    inverse = theta ** (-jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)
    angles = positions.astype(jnp.float32)[:, None] * inverse[None, :]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, None, :]
    return jnp.cos(angles), jnp.sin(angles)


def rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x (B, S, heads, d) with rotary positions: x·cos + rotate_half(x)·sin."""
    half = x.shape[-1] // 2
    return x * cos + jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1) * sin


def decoder_layer(
    p: Params,
    x: jax.Array,
    allowed: jax.Array,
    tables: tuple[jax.Array, jax.Array],
    config: LlamaConfig,
    names: tuple[str, str, str] = ("", "", ""),
    taps: Taps = None,
) -> jax.Array:
    """x (B, S, H), allowed (B, 1, S, S) bool, rotary tables (S, 1, d) → (B, S, H). ``names``: its attention, MLP
    and layer outputs' checkpoint names, recorded in ``taps`` when it is a dict."""
    q, k, v = projected(p, x, tables, config)
    return after_attention(p, x, grouped_attention(q, k, v, allowed, config), config, names, taps)


def projected(
    p: Params, x: jax.Array, tables: tuple[jax.Array, jax.Array], c: LlamaConfig
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """x (B, S, H) → q (B, S, heads, d), k and v (B, S, kv_heads, d), q and k rotated."""
    b, s, _ = x.shape
    a = precision.rms_norm(x, p["input_layernorm"], c.rms_norm_eps)

    def heads_of(t: jax.Array, count: int) -> jax.Array:  # (B, S, count·d) -> (B, S, count, d)
        return t.reshape(b, s, count, c.head_dim)

    q = rotate(heads_of(precision.matmul(a, p["q_proj"]), c.heads), *tables)
    k = rotate(heads_of(precision.matmul(a, p["k_proj"]), c.kv_heads), *tables)
    return q, k, heads_of(precision.matmul(a, p["v_proj"]), c.kv_heads)


def grouped_attention(q: jax.Array, k: jax.Array, v: jax.Array, allowed: jax.Array, c: LlamaConfig) -> jax.Array:
    """q (B, S, heads, d) over k, v (B, S_k, kv_heads, d), head h reading key/value head h // group."""
    group = c.heads // c.kv_heads
    return precision.attention(q, jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2), allowed)


def after_attention(
    p: Params, x: jax.Array, context: jax.Array, c: LlamaConfig, names: tuple[str, str, str] = ("", "", ""),
    taps: Taps = None,
) -> jax.Array:  # fmt: skip
    """The layer after its attention: x (B, S, H) and the context (B, S, heads, d) → its output."""
    b, s, h = x.shape
    attention_name, mlp_name, layer_name = names
    x = x + tap(taps, attention_name, precision.matmul(context.reshape(b, s, h), p["o_proj"]))
    m = precision.rms_norm(x, p["post_attention_layernorm"], c.rms_norm_eps)
    m = precision.matmul(
        jax.nn.silu(precision.matmul(m, p["gate_proj"])) * precision.matmul(m, p["up_proj"]), p["down_proj"]
    )
    return tap(taps, layer_name, x + tap(taps, mlp_name, m))


@dataclass(frozen=True, eq=False)
class LlamaModule:
    """Static hyperparameters, the parameter pytree, and the forward function. ``apply`` reads weights only from
    its ``params`` argument, so under ``jax.jit`` they are program inputs, not constants."""

    config: LlamaConfig
    params: Params
    checkpoints: tuple[tuple[str, str, str], ...]  # per layer: its attention, MLP and layer outputs' names

    def apply(
        self, params: Params, input_ids: jax.Array, attention_mask: jax.Array, taps: Taps = None
    ) -> tuple[jax.Array, jax.Array]:
        c = self.config
        seq = input_ids.shape[1]
        x = tap(taps, "embeddings", params["embed_tokens"][input_ids])
        tables = rotary_tables(seq, c.head_dim, c.rope_theta)
        allowed = causal_allowed(attention_mask)
        for layer, names in zip(params["layers"], self.checkpoints, strict=True):
            x = decoder_layer(layer, x, allowed, tables, c, names, taps)
        x = tap(taps, "norm", precision.rms_norm(x, params["norm"], c.rms_norm_eps))
        head = params["embed_tokens"] if c.tied else params["lm_head"]
        return x, precision.matmul(x, head.T)


def new_cache(model: LlamaModule, batch: int, max_len: int) -> Cache:
    """Per layer (keys, values), each (batch, max_len, kv_heads, head_dim) float32 zeros."""
    c = model.config
    return zero_cache(c.layers, (batch, max_len, c.kv_heads, c.head_dim))


def cached_forward(
    model: LlamaModule, params: Params, input_ids: jax.Array, start: jax.Array, cache: Cache
) -> tuple[jax.Array, Cache]:
    """input_ids (B, S) at positions start .. start + S - 1 (``start`` an int32 scalar: one program serves every
    step) → (the last position's logits (B, vocab), the cache (:func:`new_cache`) with their keys and values)."""
    c = model.config
    positions = start + jnp.arange(input_ids.shape[1], dtype=jnp.int32)
    tables = rotary_tables(positions, c.head_dim, c.rope_theta)
    allowed = cache_allowed(positions, cache[0][0].shape[1])
    x = params["embed_tokens"][input_ids]
    updated: Cache = []
    for p, (keys, values) in zip(params["layers"], cache, strict=True):
        q, k, v = projected(p, x, tables, c)
        keys, values = cached(keys, values, k, v, start)
        x = after_attention(p, x, grouped_attention(q, keys, values, allowed, c), c)
        updated.append((keys, values))
    x = precision.rms_norm(x[:, -1], params["norm"], c.rms_norm_eps)
    head = params["embed_tokens"] if c.tied else params["lm_head"]
    return precision.matmul(x, head.T), updated


# canonical suffix -> this pytree's leaf within a layer; nn.Linear (out, in) weights become (in, out) kernels.
_SUFFIXES = {
    "input_layernorm.weight": "input_layernorm",
    "self_attn.q_proj.weight": "q_proj",
    "self_attn.k_proj.weight": "k_proj",
    "self_attn.v_proj.weight": "v_proj",
    "self_attn.o_proj.weight": "o_proj",
    "post_attention_layernorm.weight": "post_attention_layernorm",
    "mlp.gate_proj.weight": "gate_proj",
    "mlp.up_proj.weight": "up_proj",
    "mlp.down_proj.weight": "down_proj",
}
assert set(_SUFFIXES) == set(LAYER_SUFFIXES)


def build_model(description: Llama, weights: dict[str, np.ndarray], device: str) -> LlamaModule:
    """The decoder with the canonical weights (nn.Linear (out, in) → (in, out) kernels)."""
    c = description.config
    h, kv, inter = c.hidden, c.kv_hidden, c.intermediate
    kernels = {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h)}
    kernels |= {"gate_proj": (h, inter), "up_proj": (h, inter), "down_proj": (inter, h)}  # (in, out)
    canonical = CanonicalParams(weights, device)
    params: Params = {"embed_tokens": canonical.take(EMBEDDING, (c.vocab_size, h)), "layers": []}
    for i in range(c.layers):
        layer: Params = {}
        for suffix, leaf in _SUFFIXES.items():
            name = layer_prefix(i) + suffix
            layer[leaf] = (
                canonical.take(name, kernels[leaf], transpose) if leaf in kernels else canonical.take(name, (h,))
            )
        params["layers"].append(layer)
    params["norm"] = canonical.take(FINAL_NORM, (h,))
    if not c.tied:
        params["lm_head"] = canonical.take(LM_HEAD, (c.vocab_size, h))
    canonical.check_all_used()
    return LlamaModule(c, params, tuple(layer_checkpoints(i) for i in range(c.layers)))


def training_logits(model: LlamaModule, params: Params, input_ids: jax.Array, attention_mask: jax.Array) -> jax.Array:
    """The LM head's logits the causal LM loss is taken of: (batch, seq, vocab)."""
    return model.apply(params, input_ids, attention_mask)[1]
