"""The Llama layout in TensorFlow: RMSNorm, rotary positions, SwiGLU, grouped-query attention, tied or untied head.

Inputs: input_ids, attention_mask, each (batch, seq) int32. Returns ``(last_hidden_state, logits)``: (batch, seq,
hidden) and (batch, seq, vocab). tf.Module and tf ops, not Keras. Canonical nn.Linear (out, in) weights are
transposed once into (in, out) kernels when loading. Hidden states stay 2-D (batch·seq, hidden) between layers, so
every projection is one MatMul. Phase generate: :func:`new_cache` and :func:`cached_forward` (tensorflow/gpt2.py's
padded key/value variables). ``taps``: the checkpoints (fwbench.models.checkpoints), recorded (batch, seq,
hidden) only when given a dict.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from fwbench.frameworks.tensorflow import precision
from fwbench.frameworks.tensorflow.bert import dims, tap_hidden
from fwbench.frameworks.tensorflow.gpt2 import Cache, cache_mask, cache_update, causal_mask, zero_cache
from fwbench.frameworks.tensorflow.weights import CanonicalVariables, MakeVariable
from fwbench.models.checkpoints import Taps
from fwbench.models.llama import EMBEDDING, FINAL_NORM, LM_HEAD, Llama, LlamaConfig, layer_checkpoints, layer_prefix
from fwbench.models.weightmap import identity, transpose


def rotary_tables(positions: int | tf.Tensor, head_dim: int, theta: float) -> tuple[tf.Tensor, tf.Tensor]:
    """(cos, sin), each (S, head_dim) float32 for ``positions``: a (S,) tensor of them, or S for 0..S-1
    (fwbench.models.llama.rotary_tables)."""
    if isinstance(positions, int) or positions.shape.rank == 0:
        positions = tf.range(positions)
    inverse = tf.constant(theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim), tf.float32)
    angles = tf.cast(positions, tf.float32)[:, None] * inverse[None, :]
    angles = tf.concat([angles, angles], axis=-1)
    return tf.cos(angles), tf.sin(angles)


def rotate(x: tf.Tensor, cos: tf.Tensor, sin: tf.Tensor) -> tf.Tensor:
    """x (B, heads, S, d) with rotary positions: x·cos + rotate_half(x)·sin, in x's dtype (bf16: bfloat16, as the
    product it came from; TF does not promote)."""
    half = x.shape[-1] // 2
    cos, sin = tf.cast(cos, x.dtype), tf.cast(sin, x.dtype)
    return x * cos + tf.concat([-x[..., half:], x[..., :half]], axis=-1) * sin


class DecoderLayer(tf.Module):
    def __init__(self, config: LlamaConfig, i: int, variable: MakeVariable) -> None:
        super().__init__(name=f"layers_{i}")
        c = self.config = config
        h, kv, inter = c.hidden, c.kv_hidden, c.intermediate
        self.checkpoints = layer_checkpoints(i)  # its attention, MLP and layer outputs
        p = layer_prefix(i)

        def kernel(suffix: str, fan_in: int, fan_out: int) -> tf.Variable:  # (out, in) -> (in, out)
            return variable(p + suffix, (fan_in, fan_out), transpose)

        self.input_layernorm = variable(p + "input_layernorm.weight", (h,), identity)
        self.q_proj = kernel("self_attn.q_proj.weight", h, h)
        self.k_proj = kernel("self_attn.k_proj.weight", h, kv)
        self.v_proj = kernel("self_attn.v_proj.weight", h, kv)
        self.o_proj = kernel("self_attn.o_proj.weight", h, h)
        self.post_attention_layernorm = variable(p + "post_attention_layernorm.weight", (h,), identity)
        self.gate_proj = kernel("mlp.gate_proj.weight", h, inter)
        self.up_proj = kernel("mlp.up_proj.weight", h, inter)
        self.down_proj = kernel("mlp.down_proj.weight", inter, h)

    def __call__(
        self,
        x: tf.Tensor,
        mask: tf.Tensor,
        tables: tuple[tf.Tensor, tf.Tensor],
        b: int | tf.Tensor,
        s: int | tf.Tensor,
        taps: Taps = None,
    ) -> tf.Tensor:
        """x (B·S, H), mask (B, 1, S, S) additive, rotary tables (S, d) → (B·S, H)."""
        q, k, v = self.projected(x, tables, b, s)
        return self.after_attention(x, self.attend(q, k, v, mask), b, s, taps)

    def projected(
        self, x: tf.Tensor, tables: tuple[tf.Tensor, tf.Tensor], b: int | tf.Tensor, s: int | tf.Tensor
    ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """x (B·S, H) → q (B, heads, S, d), k and v (B, kv_heads, S, d), q and k rotated."""
        c = self.config
        a = precision.rms_norm(x, self.input_layernorm, c.rms_norm_eps)

        def heads_of(t: tf.Tensor, count: int) -> tf.Tensor:  # (B·S, count·d) -> (B, count, S, d)
            return tf.transpose(tf.reshape(t, [b, s, count, c.head_dim]), [0, 2, 1, 3])

        q = rotate(heads_of(precision.matmul(a, self.q_proj), c.heads), *tables)
        k = rotate(heads_of(precision.matmul(a, self.k_proj), c.kv_heads), *tables)
        return q, k, heads_of(precision.matmul(a, self.v_proj), c.kv_heads)

    def attend(self, q: tf.Tensor, k: tf.Tensor, v: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
        """The context (B, heads, S, d) of q over k, v (B, kv_heads, S_k, d), head h reading key/value head
        h // group; ``mask`` additive (.., S, S_k)."""
        c = self.config
        group = c.heads // c.kv_heads
        k, v = tf.repeat(k, group, axis=1), tf.repeat(v, group, axis=1)
        return precision.attention(q, k, v, mask, 1.0 / float(np.sqrt(c.head_dim)))

    def after_attention(
        self, x: tf.Tensor, context: tf.Tensor, b: int | tf.Tensor, s: int | tf.Tensor, taps: Taps = None
    ) -> tf.Tensor:
        """The layer after its attention: x (B·S, H) and the context (B, heads, S, d) → (B·S, H)."""
        c = self.config
        attention_name, mlp_name, layer_name = self.checkpoints
        attention = precision.matmul(tf.reshape(tf.transpose(context, [0, 2, 1, 3]), [-1, c.hidden]), self.o_proj)
        x = precision.add(x, tap_hidden(taps, attention_name, attention, b, s))
        m = precision.rms_norm(x, self.post_attention_layernorm, c.rms_norm_eps)
        gated = tf.nn.silu(precision.matmul(m, self.gate_proj)) * precision.matmul(m, self.up_proj)
        m = precision.matmul(gated, self.down_proj)
        return tap_hidden(taps, layer_name, precision.add(x, tap_hidden(taps, mlp_name, m, b, s)), b, s)


class LlamaModule(tf.Module):
    def __init__(self, description: Llama, weights: dict[str, np.ndarray]) -> None:
        super().__init__(name=description.arch)
        c = self.config = description.config
        canonical = CanonicalVariables(weights)
        variable = canonical.take
        self.embed_tokens = variable(EMBEDDING, (c.vocab_size, c.hidden), identity)
        self.layers = [DecoderLayer(c, i, variable) for i in range(c.layers)]
        self.norm = variable(FINAL_NORM, (c.hidden,), identity)
        self.lm_head = None if c.tied else variable(LM_HEAD, (c.vocab_size, c.hidden), identity)
        canonical.check_all_used()

    def __call__(
        self, input_ids: tf.Tensor, attention_mask: tf.Tensor, taps: Taps = None
    ) -> tuple[tf.Tensor, tf.Tensor]:
        c = self.config
        b, s = dims(input_ids)
        x = tf.reshape(tf.gather(self.embed_tokens, input_ids), [-1, c.hidden])  # (B·S, H)
        tap_hidden(taps, "embeddings", x, b, s)
        tables = rotary_tables(s, c.head_dim, c.rope_theta)
        mask = causal_mask(attention_mask, s)
        for layer in self.layers:
            x = layer(x, mask, tables, b, s, taps)
        x = tap_hidden(taps, "norm", precision.rms_norm(x, self.norm, c.rms_norm_eps), b, s)
        head = self.embed_tokens if self.lm_head is None else self.lm_head
        logits = precision.matmul(x, head, transpose_b=True)  # (B·S, V)
        return tf.reshape(x, [b, s, c.hidden]), tf.reshape(logits, [b, s, -1])


def new_cache(module: LlamaModule, batch: int, max_len: int) -> Cache:
    """Per layer (keys, values) variables, each (batch, kv_heads, max_len, head_dim) float32 zeros."""
    c = module.config
    return zero_cache(len(module.layers), (batch, c.kv_heads, max_len, c.head_dim))


def cached_forward(module: LlamaModule, input_ids: tf.Tensor, start: tf.Tensor, cache: Cache) -> tf.Tensor:
    """input_ids (B, S) at positions start .. start + S - 1 (``start`` an int32 scalar tensor): their keys and values
    scattered into the ``cache`` variables (:func:`new_cache`), each position attending to the cached ones up to
    itself. Returns the last position's logits (B, vocab)."""
    c = module.config
    b, s = dims(input_ids)
    positions = start + tf.range(s)
    keys, _ = cache[0]
    indices = cache_update(positions, keys.shape[0], keys.shape[1])
    mask = cache_mask(positions, keys.shape[2])
    tables = rotary_tables(positions, c.head_dim, c.rope_theta)
    x = tf.reshape(tf.gather(module.embed_tokens, input_ids), [-1, c.hidden])
    for layer, (keys, values) in zip(module.layers, cache, strict=True):
        q, k, v = layer.projected(x, tables, b, s)
        keys.scatter_nd_update(indices, tf.cast(k, keys.dtype))  # bf16: kept in the float32 cache
        values.scatter_nd_update(indices, tf.cast(v, values.dtype))
        x = layer.after_attention(x, layer.attend(q, keys, values, mask), b, s)
    last = precision.rms_norm(tf.reshape(x, [b, s, c.hidden])[:, -1], module.norm, c.rms_norm_eps)
    head = module.embed_tokens if module.lm_head is None else module.lm_head
    return precision.matmul(last, head, transpose_b=True)


def build_model(description: Llama, weights: dict[str, np.ndarray], device: str) -> LlamaModule:
    """The decoder with the canonical weights, its variables placed on ``device``."""
    with tf.device("/GPU:0" if device == "cuda" else "/CPU:0"):
        return LlamaModule(description, weights)


def training_logits(module: LlamaModule, input_ids: tf.Tensor, attention_mask: tf.Tensor) -> tf.Tensor:
    """The LM head's logits the causal LM loss is taken of: (batch, seq, vocab)."""
    return module(input_ids, attention_mask)[1]
