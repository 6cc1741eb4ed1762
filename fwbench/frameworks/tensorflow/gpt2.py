"""GPT-2 in TensorFlow: causal pre-LN decoder, tanh GELU, LM head tied to the token embedding.

Inputs: input_ids, attention_mask, each (batch, seq) int32. Returns ``(last_hidden_state, logits)``:
(batch, seq, hidden) and (batch, seq, vocab). tf.Module and tf ops, not Keras. Canonical Conv1D
weights are (in, out), which is already the kernel layout here: no transpose when loading.
Hidden states stay 2-D (batch·seq, hidden) between layers, so every dense layer is one MatMul.
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
        h = x.shape[-1]
        d = h // self.heads
        attention_name, mlp_name, layer_name = self.checkpoints
        qkv = tf.reshape(dense(layer_norm(x, *self.ln_1, self.eps), *self.c_attn), [b, s, 3, self.heads, d])
        q, k, v = tf.unstack(tf.transpose(qkv, [2, 0, 3, 1, 4]))  # each (B, heads, S, d)
        context = precision.attention(q, k, v, mask, 1.0 / float(np.sqrt(d)))  # (B, heads, S, d)
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
