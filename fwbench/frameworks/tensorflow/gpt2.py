"""GPT-2 in TensorFlow: causal pre-LN decoder, tanh GELU, LM head tied to the token embedding.

Inputs: input_ids, attention_mask, each (batch, seq) int32. Returns ``(last_hidden_state, logits)``:
(batch, seq, hidden) and (batch, seq, vocab). tf.Module and tf ops, not Keras. Canonical Conv1D
weights are (in, out), which is already the kernel layout here: no transpose when loading.
Hidden states stay 2-D (batch·seq, hidden) between layers, so every dense layer is one MatMul. Phase generate:
:func:`new_cache` (key/value variables of a fixed length, padded) and :func:`cached_forward` (scatters each call's keys
and values into them).
``taps``: the checkpoints (fwbench.models.checkpoints), recorded (batch, seq, hidden) only when given a dict.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from fwbench.frameworks.tensorflow import precision
from fwbench.frameworks.tensorflow.bert import MASKED, dense, dims, layer_norm, tap_hidden
from fwbench.frameworks.tensorflow.weights import CanonicalVariables, MakeVariable
from fwbench.models.checkpoints import Taps
from fwbench.models.gpt2 import GPT2, LAYER_SUFFIXES
from fwbench.models.weightmap import identity


def gelu_tanh(x: tf.Tensor) -> tf.Tensor:
    """GPT-2's tanh GELU, 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))); x³ as x·x·x, since an eager
    tf.pow (what tf.nn.gelu(approximate=True) calls) is several times slower."""
    return 0.5 * x * (1.0 + tf.tanh(float(np.sqrt(2.0 / np.pi)) * (x + 0.044715 * x * x * x)))


def causal_mask(attention_mask: tf.Tensor, s: int | tf.Tensor) -> tf.Tensor:
    """attention_mask (B, S), 1 = real token → (B, 1, S, S) additive float32: 0 where query i may see key j ≤ i
    (a real token), MASKED elsewhere."""
    causal = tf.linalg.band_part(tf.ones([s, s], tf.float32), -1, 0)  # (S, S), 1 on and below the diagonal
    allowed = causal[None, None] * tf.cast(attention_mask, tf.float32)[:, None, None, :]
    return (1.0 - allowed) * MASKED


class DecoderLayer(tf.Module):
    def __init__(self, description: GPT2, i: int, variable: MakeVariable) -> None:
        super().__init__(name=f"h_{i}")
        c = description.config
        h, inter = c.hidden, c.intermediate
        self.heads, self.eps = c.heads, c.layer_norm_eps
        self.checkpoints = (f"h.{i}.attn", f"h.{i}.mlp", f"h.{i}")  # its attention, MLP and layer outputs

        def pair(suffix: str, shape: tuple[int, ...]) -> tuple[tf.Variable, tf.Variable]:
            """(weight, bias) of ``h.{i}.{suffix}``; Conv1D weights are (in, out) kernels as they are."""
            return (
                variable(f"h.{i}.{suffix}.weight", shape, identity),
                variable(f"h.{i}.{suffix}.bias", (shape[-1],), identity),
            )

        self.ln_1 = pair("ln_1", (h,))
        self.c_attn = pair("attn.c_attn", (h, 3 * h))
        self.attn_proj = pair("attn.c_proj", (h, h))
        self.ln_2 = pair("ln_2", (h,))
        self.c_fc = pair("mlp.c_fc", (h, inter))
        self.mlp_proj = pair("mlp.c_proj", (inter, h))

    def __call__(
        self, x: tf.Tensor, mask: tf.Tensor, b: int | tf.Tensor, s: int | tf.Tensor, taps: Taps = None
    ) -> tf.Tensor:
        """x (B·S, H), mask (B, 1, S, S) additive → (B·S, H)."""
        q, k, v = self.projected(x, b, s)
        return self.after_attention(x, self.attend(q, k, v, mask), b, s, taps)

    def projected(self, x: tf.Tensor, b: int | tf.Tensor, s: int | tf.Tensor) -> tuple[tf.Tensor, ...]:
        """x (B·S, H) → q, k, v, each (B, heads, S, d)."""
        d = x.shape[-1] // self.heads
        qkv = tf.reshape(dense(layer_norm(x, *self.ln_1, self.eps), *self.c_attn), [b, s, 3, self.heads, d])
        return tuple(tf.unstack(tf.transpose(qkv, [2, 0, 3, 1, 4])))

    def attend(self, q: tf.Tensor, k: tf.Tensor, v: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
        """The context (B, heads, S, d) of q over k, v (B, heads, S_k, d), ``mask`` additive (.., S, S_k)."""
        return precision.attention(q, k, v, mask, 1.0 / float(np.sqrt(q.shape[-1])))

    def after_attention(
        self, x: tf.Tensor, context: tf.Tensor, b: int | tf.Tensor, s: int | tf.Tensor, taps: Taps = None
    ) -> tf.Tensor:
        """The layer after its attention: x (B·S, H) and the context (B, heads, S, d) → (B·S, H)."""
        h = x.shape[-1]
        attention_name, mlp_name, layer_name = self.checkpoints
        attention = dense(tf.reshape(tf.transpose(context, [0, 2, 1, 3]), [-1, h]), *self.attn_proj)
        x = precision.add(x, tap_hidden(taps, attention_name, attention, b, s))
        ffn = dense(gelu_tanh(dense(layer_norm(x, *self.ln_2, self.eps), *self.c_fc)), *self.mlp_proj)
        return tap_hidden(taps, layer_name, precision.add(x, tap_hidden(taps, mlp_name, ffn, b, s)), b, s)


class GPT2Module(tf.Module):
    def __init__(self, description: GPT2, weights: dict[str, np.ndarray]) -> None:
        super().__init__(name=description.arch)
        c = description.config
        self.eps = c.layer_norm_eps
        canonical = CanonicalVariables(weights)
        variable = canonical.take

        self.wte = variable("wte.weight", (c.vocab_size, c.hidden), identity)
        self.wpe = variable("wpe.weight", (c.max_positions, c.hidden), identity)
        self.layers = [DecoderLayer(description, i, variable) for i in range(c.layers)]
        self.ln_f = variable("ln_f.weight", (c.hidden,), identity), variable("ln_f.bias", (c.hidden,), identity)
        canonical.check_all_used()

    def __call__(
        self, input_ids: tf.Tensor, attention_mask: tf.Tensor, taps: Taps = None
    ) -> tuple[tf.Tensor, tf.Tensor]:
        b, s = dims(input_ids)
        h = self.wte.shape[-1]
        x = tf.reshape(tf.gather(self.wte, input_ids) + self.wpe[:s], [-1, h])  # (B·S, H)
        tap_hidden(taps, "embeddings", x, b, s)
        mask = causal_mask(attention_mask, s)
        for layer in self.layers:
            x = layer(x, mask, b, s, taps)
        x = tap_hidden(taps, "ln_f", layer_norm(x, *self.ln_f, self.eps), b, s)
        logits = precision.matmul(x, self.wte, transpose_b=True)  # tied LM head: (B·S, V)
        return tf.reshape(x, [b, s, h]), tf.reshape(logits, [b, s, -1])


Cache = list[tuple[tf.Variable, tf.Variable]]


def cache_update(positions: tf.Tensor, batch: int, heads: int) -> tf.Tensor:
    """The scatter indices (B, heads, S, 3) that write keys or values (B, heads, S, d) at ``positions`` (S,) of a
    cache (B, heads, max_len, d)."""
    rows, columns, at = tf.meshgrid(tf.range(batch), tf.range(heads), positions, indexing="ij")
    return tf.stack([rows, columns, at], axis=-1)


def cache_mask(positions: tf.Tensor, max_len: int) -> tf.Tensor:
    """(1, 1, S, max_len) additive float32: 0 where the query at ``positions`` (S,) may see a cached key (up to its
    own position), MASKED elsewhere."""
    allowed = tf.cast(tf.range(max_len)[None, :] <= positions[:, None], tf.float32)
    return ((1.0 - allowed) * MASKED)[None, None]


def zero_cache(layers: int, shape: tuple[int, ...]) -> Cache:
    """Per layer (keys, values) variables, each float32 zeros of ``shape`` (every decoder's cache)."""
    return [(tf.Variable(tf.zeros(shape), trainable=False), tf.Variable(tf.zeros(shape), trainable=False))
            for _ in range(layers)]  # fmt: skip


def new_cache(module: GPT2Module, batch: int, max_len: int) -> Cache:
    """Per layer (keys, values) variables, each (batch, heads, max_len, hidden / heads) float32 zeros."""
    layer = module.layers[0]
    return zero_cache(len(module.layers), (batch, layer.heads, max_len, module.wte.shape[-1] // layer.heads))


def cached_forward(module: GPT2Module, input_ids: tf.Tensor, start: tf.Tensor, cache: Cache) -> tf.Tensor:
    """input_ids (B, S) at positions start .. start + S - 1 (``start`` an int32 scalar tensor): their keys and values
    scattered into the ``cache`` variables (:func:`new_cache`), each position attending to the cached ones up to
    itself. Returns the last position's logits (B, vocab)."""
    b, s = dims(input_ids)
    h = module.wte.shape[-1]
    positions = start + tf.range(s)
    keys, _ = cache[0]
    indices = cache_update(positions, keys.shape[0], keys.shape[1])
    mask = cache_mask(positions, keys.shape[2])
    x = tf.reshape(tf.gather(module.wte, input_ids) + tf.gather(module.wpe, positions), [-1, h])
    for layer, (keys, values) in zip(module.layers, cache, strict=True):
        q, k, v = layer.projected(x, b, s)
        keys.scatter_nd_update(indices, tf.cast(k, keys.dtype))  # bf16: kept in the float32 cache
        values.scatter_nd_update(indices, tf.cast(v, values.dtype))
        x = layer.after_attention(x, layer.attend(q, keys, values, mask), b, s)
    last = tf.reshape(x, [b, s, h])[:, -1]
    return precision.matmul(layer_norm(last, *module.ln_f, module.eps), module.wte, transpose_b=True)


assert {
    f"{n}.{k}"
    for n in ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj")
    for k in ("weight", "bias")
} == set(LAYER_SUFFIXES)


def build_model(description: GPT2, weights: dict[str, np.ndarray], device: str) -> GPT2Module:
    """GPT-2 with the canonical weights, its variables placed on ``device``."""
    with tf.device("/GPU:0" if device == "cuda" else "/CPU:0"):
        return GPT2Module(description, weights)


def training_logits(module: GPT2Module, input_ids: tf.Tensor, attention_mask: tf.Tensor) -> tf.Tensor:
    """The tied LM head's logits the causal LM loss is taken of: (batch, seq, vocab)."""
    return module(input_ids, attention_mask)[1]
