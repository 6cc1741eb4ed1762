"""The BERT family in TensorFlow (BERT with pooler, DistilBERT without): post-LN encoder, erf GELU.

Inputs: input_ids, attention_mask[, token_type_ids], each (batch, seq) int32.
Returns ``(last_hidden_state[, pooler_output])``: (batch, seq, hidden) and (batch, hidden).
tf.Module and tf ops, not Keras. Hidden states stay 2-D (batch·seq, hidden) between layers, so
every dense layer is one plain MatMul; Q, K and V are one matmul, their kernels concatenated once
when loading. Attention is batched matmuls with an additive key mask (0 or -1e9 per key). Matmuls, attention and layer
norms go through ``precision`` (the --dtype policy).
Canonical linear weights are (out, in); kernels here are (in, out), transposed once when loading.
``taps``: the checkpoints (fwbench.models.checkpoints), recorded only when given a dict; hidden states are
recorded (batch, seq, hidden), reshaped only then (:func:`tap_hidden`).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from fwbench.frameworks.tensorflow import precision
from fwbench.frameworks.tensorflow.weights import CanonicalVariables, MakeVariable
from fwbench.models.bert import Bert
from fwbench.models.checkpoints import Taps, tap
from fwbench.models.weightmap import Transform, identity, transpose

MASKED = -1e9  # added to the scores of excluded keys: exp underflows to exactly 0


layer_norm = precision.layer_norm  # float32 under every policy
dense = precision.dense  # (N, in) @ (in, out) + bias, under the precision policy


def gelu_erf(x: tf.Tensor) -> tf.Tensor:
    """Exact GELU: x·Φ(x) = 0.5·x·(1 + erf(x / √2))."""
    return 0.5 * x * (1.0 + tf.math.erf(x * (1.0 / float(np.sqrt(2.0)))))


def key_mask(attention_mask: tf.Tensor) -> tf.Tensor:
    """(B, S) int, 1 = real token → (B, 1, 1, S) additive float32 (the scores' dtype in every policy): 0 to
    attend, -1e9 to exclude."""
    return (1.0 - tf.cast(attention_mask, tf.float32))[:, None, None, :] * MASKED


def dims(input_ids: tf.Tensor) -> tuple[int | tf.Tensor, int | tf.Tensor]:
    """(batch, seq): Python ints when the shape is static (eager calls, a fixed signature), else tensors."""
    b, s = input_ids.shape
    if b is None or s is None:
        dynamic = tf.shape(input_ids)
        return dynamic[0], dynamic[1]
    return b, s


def tap_hidden(taps: Taps, name: str, x: tf.Tensor, b: int | tf.Tensor, s: int | tf.Tensor) -> tf.Tensor:
    """``x`` (B·S, H), recorded as checkpoint ``name`` reshaped to (B, S, H) when capturing (``taps`` a dict): the
    reshape is an op of the capturing program only, never of the timed one."""
    if taps is not None:
        taps[name] = tf.reshape(x, [b, s, -1])
    return x


class EncoderLayer(tf.Module):
    def __init__(self, description: Bert, i: int, variable: MakeVariable) -> None:
        super().__init__(name=f"layer_{i}")
        c = description.config
        h, inter = c.hidden, c.intermediate
        self.heads, self.eps = c.heads, c.layer_norm_eps
        # the names of its attention, feed-forward and layer outputs (checkpoints)
        self.checkpoints = description.layer_checkpoints(i)

        def weight(role: str, shape: tuple[int, ...]) -> tf.Variable:
            return variable(description.param(role, i), shape, transpose if len(shape) == 2 else identity)

        def bias(role: str, size: int) -> tf.Variable:
            return variable(description.param(role, i, "bias"), (size,), identity)

        qkv = ("query", "key", "value")  # fused: (h, 3h) kernel, (3h,) bias
        self.qkv_kernel = tf.Variable(tf.concat([weight(r, (h, h)) for r in qkv], axis=1), name="qkv_kernel")
        self.qkv_bias = tf.Variable(tf.concat([bias(r, h) for r in qkv], axis=0), name="qkv_bias")
        self.attention_out = weight("attention_out", (h, h)), bias("attention_out", h)
        self.attention_norm = weight("attention_norm", (h,)), bias("attention_norm", h)
        self.ffn_in = weight("ffn_in", (h, inter)), bias("ffn_in", inter)
        self.ffn_out = weight("ffn_out", (inter, h)), bias("ffn_out", h)
        self.ffn_norm = weight("ffn_norm", (h,)), bias("ffn_norm", h)

    def __call__(
        self, x: tf.Tensor, mask: tf.Tensor, b: int | tf.Tensor, s: int | tf.Tensor, taps: Taps = None
    ) -> tf.Tensor:
        """x (B·S, H), mask (B, 1, 1, S) additive → (B·S, H)."""
        h = x.shape[-1]
        d = h // self.heads
        attention_name, ffn_name, layer_name = self.checkpoints
        qkv = tf.reshape(dense(x, self.qkv_kernel, self.qkv_bias), [b, s, 3, self.heads, d])
        q, k, v = tf.unstack(tf.transpose(qkv, [2, 0, 3, 1, 4]))  # each (B, heads, S, d)
        context = precision.attention(q, k, v, mask, 1.0 / float(np.sqrt(d)))  # (B, heads, S, d)
        context = tf.reshape(tf.transpose(context, [0, 2, 1, 3]), [-1, h])
        x = layer_norm(precision.add(x, dense(context, *self.attention_out)), *self.attention_norm, self.eps)
        tap_hidden(taps, attention_name, x, b, s)
        ffn = tap_hidden(taps, ffn_name, dense(gelu_erf(dense(x, *self.ffn_in)), *self.ffn_out), b, s)
        return tap_hidden(taps, layer_name, layer_norm(precision.add(x, ffn), *self.ffn_norm, self.eps), b, s)


class BertModule(tf.Module):
    def __init__(self, description: Bert, weights: dict[str, np.ndarray]) -> None:
        super().__init__(name=description.arch)
        c = description.config
        self.with_token_types, self.with_pooler = description.has_token_types, description.has_pooler
        self.eps = c.layer_norm_eps
        canonical = CanonicalVariables(weights)
        variable = canonical.take

        def param(
            role: str, shape: tuple[int, ...], kind: str = "weight", transform: Transform = identity
        ) -> tf.Variable:
            return variable(description.param(role, kind=kind), shape, transform)

        self.word_embeddings = param("word_embeddings", (c.vocab_size, c.hidden))
        self.position_embeddings = param("position_embeddings", (c.max_positions, c.hidden))
        if self.with_token_types:
            self.token_type_embeddings = param("token_type_embeddings", (c.type_vocab_size, c.hidden))
        self.embeddings_norm = param("embeddings_norm", (c.hidden,)), param("embeddings_norm", (c.hidden,), "bias")
        self.layers = [EncoderLayer(description, i, variable) for i in range(c.layers)]
        if self.with_pooler:
            self.pooler = (
                param("pooler", (c.hidden, c.hidden), transform=transpose),
                param("pooler", (c.hidden,), "bias"),
            )
        canonical.check_all_used()

    def __call__(
        self,
        input_ids: tf.Tensor,
        attention_mask: tf.Tensor,
        token_type_ids: tf.Tensor | None = None,
        *,
        taps: Taps = None,
    ) -> tuple[tf.Tensor, ...]:
        b, s = dims(input_ids)
        h = self.word_embeddings.shape[-1]
        x = tf.gather(self.word_embeddings, input_ids) + self.position_embeddings[:s]
        if self.with_token_types:
            x = x + tf.gather(self.token_type_embeddings, token_type_ids)
        x = layer_norm(tf.reshape(x, [-1, h]), *self.embeddings_norm, self.eps)  # (B·S, H)
        tap_hidden(taps, "embeddings", x, b, s)
        mask = key_mask(attention_mask)  # (B, 1, 1, S)
        for layer in self.layers:
            x = layer(x, mask, b, s, taps)
        x = tf.reshape(x, [b, s, h])
        if self.with_pooler:
            return x, tap(taps, "pooler", tf.tanh(dense(x[:, 0], *self.pooler)))
        return (x,)


def build_model(description: Bert, weights: dict[str, np.ndarray], device: str) -> BertModule:
    """The encoder with the canonical weights, its variables placed on ``device``."""
    with tf.device("/GPU:0" if device == "cuda" else "/CPU:0"):
        return BertModule(description, weights)


def training_logits(module: BertModule, *inputs: tf.Tensor) -> tf.Tensor:
    """Masked-LM logits from the tied word embeddings, last_hidden_state @ word_embeddings.T (no decoder
    bias): (batch, seq, vocab)."""
    hidden = module(*inputs)[0]
    b, s = dims(inputs[0])
    logits = precision.matmul(tf.reshape(hidden, [-1, hidden.shape[-1]]), module.word_embeddings, transpose_b=True)
    return tf.reshape(logits, [b, s, -1])
