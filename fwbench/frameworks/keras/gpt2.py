"""GPT-2 in Keras: causal pre-LN decoder, tanh GELU, LM head tied to the token embedding.

Inputs: input_ids, attention_mask, each (batch, seq) int32, passed as a dict. Returns
``{"last_hidden_state", "logits"}``: (batch, seq, hidden) and (batch, seq, vocab). A functional model; each
decoder layer is an attention block and an MLP block (keras Layers of LayerNormalization / Dense sublayers,
ending before their residual sums), the residual sums in the functional graph, the second a layer of its own
(``layers_{i}``), as is the embeddings' sum: each checkpoint (fwbench.models.checkpoints) is the output of a layer
called once, which ``checkpoint_model`` adds as outputs. The embeddings, layer norms and residual stream are
float32 under every policy (``precision``), Dense layers follow the global one. The token embedding is a
``keras.layers.ReversibleEmbedding``, called in reverse for the tied LM head (``logits = h @ wte.T``).
Canonical Conv1D weights are (in, out), which is already the Dense kernel layout: no transpose when loading.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import KerasTensor, layers, ops

from fwbench.frameworks.keras import precision
from fwbench.frameworks.keras.bert import PositionEmbedding, dense
from fwbench.frameworks.keras.weights import OVERWRITTEN, keras_device, load_canonical
from fwbench.models.gpt2 import GPT2, LAYER_SUFFIXES, GPT2Config


class Residual(layers.Layer):
    """``ops.add(x, y)`` as a layer, so that a sum that is a checkpoint is a named node of the functional graph.
    Not autocast: ops.add itself promotes a float32 residual + bfloat16 block output to float32 on every backend
    (TF's + would not)."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(dtype=precision.FLOAT32, autocast=False, **kwargs)

    def call(self, x, y):  # type: ignore[no-untyped-def]
        return ops.add(x, y)


class Attention(layers.Layer):
    """A decoder layer's attention block before its residual: x (B, S, H), allowed (B, 1, S, S) bool →
    attn_proj(attention(c_attn(ln_1(x)))) (B, S, H), in the Dense layers' (the policy's) dtype. A float32 layer
    (the residual stream it reads), its Dense layers the policy's."""

    def __init__(self, hidden: int, heads: int, eps: float, **kwargs: object) -> None:
        super().__init__(dtype=precision.FLOAT32, **kwargs)
        self.heads, self.hidden = heads, hidden
        self.ln_1 = precision.layer_norm(eps, "ln_1")
        self.c_attn = dense(3 * hidden, "c_attn")
        self.attn_proj = dense(hidden, "attn_proj")

    def build(self, x_shape, allowed_shape):  # type: ignore[no-untyped-def]
        for layer in (self.ln_1, self.c_attn, self.attn_proj):
            layer.build((None, None, self.hidden))

    def call(self, x, allowed):  # type: ignore[no-untyped-def]
        b, s = ops.shape(x)[0], ops.shape(x)[1]
        q, k, v = (
            ops.reshape(t, (b, s, self.heads, self.hidden // self.heads))  # (B, S, heads, H / heads)
            for t in ops.split(self.c_attn(self.ln_1(x)), 3, axis=-1)
        )
        context = ops.dot_product_attention(q, k, v, mask=allowed)
        return self.attn_proj(ops.reshape(context, (b, s, self.hidden)))


class MLP(layers.Layer):
    """A decoder layer's MLP block before its residual: x (B, S, H) → mlp_proj(gelu_tanh(c_fc(ln_2(x))))
    (B, S, H), in the Dense layers' (the policy's) dtype; a float32 layer, as :class:`Attention`."""

    def __init__(self, hidden: int, intermediate: int, eps: float, **kwargs: object) -> None:
        super().__init__(dtype=precision.FLOAT32, **kwargs)
        self.hidden, self.intermediate = hidden, intermediate
        self.ln_2 = precision.layer_norm(eps, "ln_2")
        self.c_fc = dense(intermediate, "c_fc")
        self.mlp_proj = dense(hidden, "mlp_proj")

    def build(self, x_shape):  # type: ignore[no-untyped-def]
        for layer in (self.ln_2, self.c_fc):
            layer.build((None, None, self.hidden))
        self.mlp_proj.build((None, None, self.intermediate))

    def call(self, x):  # type: ignore[no-untyped-def]
        return self.mlp_proj(ops.gelu(self.c_fc(self.ln_2(x)), approximate=True))


# checkpoint of decoder layer i (its suffix after ``h.{i}``) -> the layer whose output it is
_CHECKPOINT_LAYERS = {".attn": "layers_{i}_attn", ".mlp": "layers_{i}_mlp", "": "layers_{i}"}


def decoder_layer(x: KerasTensor, allowed: KerasTensor, c: GPT2Config, i: int) -> KerasTensor:
    """Decoder layer ``i`` on the functional graph's x (B, S, H), pre-LN: x + attention block, then
    (``layers_{i}``) that + MLP block; each block and the layer's output is the output of a layer of its own
    (_CHECKPOINT_LAYERS), one of the layer's checkpoints."""
    names = {suffix: name.format(i=i) for suffix, name in _CHECKPOINT_LAYERS.items()}
    attention = Attention(c.hidden, c.heads, c.layer_norm_eps, name=names[".attn"])(x, allowed)
    # ops.add: float32 residual + bfloat16 Dense output promotes to float32 on every backend (TF's + would not)
    x = ops.add(x, attention)
    return Residual(name=names[""])(x, MLP(c.hidden, c.intermediate, c.layer_norm_eps, name=names[".mlp"])(x))


class CausalMask(layers.Layer):
    """attention_mask (B, S) int, 1 = real token → (B, 1, S, S) bool: query i may see key j ≤ i if it is real."""

    def call(self, attention_mask):  # type: ignore[no-untyped-def]
        seq = ops.shape(attention_mask)[1]
        causal = ops.tril(ops.ones((seq, seq), dtype="bool"))
        return ops.logical_and(causal[None, None], ops.cast(attention_mask, "bool")[:, None, None, :])


def gpt2_model(description: GPT2) -> keras.Model:
    c = description.config
    inputs = {name: keras.Input((None,), dtype="int32", name=name) for name in ("input_ids", "attention_mask")}
    # reverse_dtype: the tied LM head computes in the policy's compute dtype. Keras' default (None) leaves the
    # float32 embedding uncast, so under mixed_bfloat16 the largest matmul of the model ran in float32.
    wte = layers.ReversibleEmbedding(
        c.vocab_size,
        c.hidden,
        tie_weights=True,
        embeddings_initializer=OVERWRITTEN,
        reverse_dtype=keras.config.dtype_policy().compute_dtype,
        name="wte",
        dtype=precision.FLOAT32,  # the lookup float32; the head in reverse_dtype
    )
    wpe = PositionEmbedding(
        c.max_positions, c.hidden, embeddings_initializer=OVERWRITTEN, name="wpe", dtype=precision.FLOAT32
    )
    x = Residual(name="embeddings")(wte(inputs["input_ids"]), wpe(inputs["input_ids"]))  # (B, S, H) + (S, H)
    allowed = CausalMask(name="causal_mask")(inputs["attention_mask"])  # (B, 1, S, S)
    for i in range(c.layers):
        x = decoder_layer(x, allowed, c, i)
    x = precision.layer_norm(c.layer_norm_eps, "ln_f")(x)
    return keras.Model(inputs, {"last_hidden_state": x, "logits": wte(x, reverse=True)}, name=description.name)


# canonical suffix -> this model's variable path in decoder layer i; Conv1D weights keep their (in, out) layout.
_SUFFIXES = {
    "ln_1.weight": "layers_{i}_attn/ln_1/gamma",
    "ln_1.bias": "layers_{i}_attn/ln_1/beta",
    "attn.c_attn.weight": "layers_{i}_attn/c_attn/kernel",
    "attn.c_attn.bias": "layers_{i}_attn/c_attn/bias",
    "attn.c_proj.weight": "layers_{i}_attn/attn_proj/kernel",
    "attn.c_proj.bias": "layers_{i}_attn/attn_proj/bias",
    "ln_2.weight": "layers_{i}_mlp/ln_2/gamma",
    "ln_2.bias": "layers_{i}_mlp/ln_2/beta",
    "mlp.c_fc.weight": "layers_{i}_mlp/c_fc/kernel",
    "mlp.c_fc.bias": "layers_{i}_mlp/c_fc/bias",
    "mlp.c_proj.weight": "layers_{i}_mlp/mlp_proj/kernel",
    "mlp.c_proj.bias": "layers_{i}_mlp/mlp_proj/bias",
}
assert set(_SUFFIXES) == set(LAYER_SUFFIXES)


def build_model(description: GPT2, weights: dict[str, np.ndarray], device: str) -> keras.Model:
    """GPT-2 with the canonical weights (Conv1D (in, out) kernels used as they are)."""
    with keras.device(keras_device(device)):
        model = gpt2_model(description)
    mapping = {
        "wte.weight": "wte/embeddings",
        "wpe.weight": "wpe/embeddings",
        "ln_f.weight": "ln_f/gamma",
        "ln_f.bias": "ln_f/beta",
    }
    for i in range(description.config.layers):
        for canonical, own in _SUFFIXES.items():
            mapping[f"h.{i}.{canonical}"] = own.format(i=i)
    load_canonical(model, weights, mapping)
    return model


def checkpoint_layers(description: GPT2) -> dict[str, str]:
    """Each checkpoint (``description.checkpoint_names()``) → the layer of the functional model whose output it
    is (each called once): the embeddings' sum, per decoder layer its attention and MLP blocks (before their
    residual sums) and its output, ``ln_f``."""
    layer_names = {"embeddings": "embeddings", "ln_f": "ln_f"}
    for i in range(description.config.layers):
        for suffix, layer in _CHECKPOINT_LAYERS.items():
            layer_names[f"h.{i}{suffix}"] = layer.format(i=i)
    return {name: layer_names[name] for name in description.checkpoint_names()}


def checkpoint_model(model: keras.Model, description: GPT2) -> keras.Model:
    """The functional model sharing ``model``'s layers and variables whose outputs are ``model``'s and every
    checkpoint by its name (fwbench.models.checkpoints)."""
    taps = {name: model.get_layer(layer).output for name, layer in checkpoint_layers(description).items()}
    return keras.Model(model.input, {**model.output, **taps}, name=f"{model.name}_checkpoints")


def training_model(model: keras.Model, description: GPT2) -> keras.Model:
    """The model train_on_batch trains: the same layers, the tied LM head's logits (batch, seq, vocab) as
    its one output."""
    return keras.Model(model.input, model.output["logits"], name=f"{model.name}_training")
