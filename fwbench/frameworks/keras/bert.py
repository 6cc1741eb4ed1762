"""The BERT family in Keras (BERT with pooler, DistilBERT without): post-LN encoder, erf GELU.

Inputs: input_ids, attention_mask[, token_type_ids], each (batch, seq) int32, passed as a dict.
Returns ``{"last_hidden_state"[, "pooler_output"]}``: (batch, seq, hidden) and (batch, hidden).
A functional model; each encoder layer is an attention block (a keras Layer of Dense / LayerNormalization
sublayers, ending with the attention's residual LayerNorm), a feed-forward block (its Dense layers, before the
residual), then the residual sum and the ffn LayerNorm in the functional graph, so that each checkpoint
(fwbench.models.checkpoints) is the output of a layer called once: ``checkpoint_model`` adds them as outputs.
Attention is ``keras.ops.dot_product_attention`` with a boolean key mask (True = attend). Embeddings, layer
norms and the encoder layers' residual stream are float32 under every policy (``precision``), Dense layers
follow the global one.
Canonical linear weights are (out, in); Dense kernels are (in, out), transposed once when loading.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import KerasTensor, layers, ops

from fwbench.frameworks.keras import precision
from fwbench.frameworks.keras.weights import OVERWRITTEN, keras_device, load_canonical
from fwbench.models.bert import LAYER_ROLES, Bert, BertConfig
from fwbench.models.weightmap import Transform, transpose

_LINEAR_ROLES = ("query", "key", "value", "attention_out", "ffn_in", "ffn_out")
_NORM_ROLES = ("attention_norm", "ffn_norm")
assert set(_LINEAR_ROLES + _NORM_ROLES) == set(LAYER_ROLES)


def dense(units: int, name: str, activation: str | None = None) -> layers.Dense:
    return layers.Dense(units, activation=activation, kernel_initializer=OVERWRITTEN, name=name)


def embedding(rows: int, width: int, name: str) -> layers.Embedding:
    return layers.Embedding(rows, width, embeddings_initializer=OVERWRITTEN, name=name, dtype=precision.FLOAT32)


class PositionEmbedding(layers.Embedding):
    """Learned absolute positions: the embeddings of 0..seq-1 for token ids (batch, seq) → (seq, hidden)."""

    def call(self, token_ids):  # type: ignore[no-untyped-def]
        return super().call(ops.arange(ops.shape(token_ids)[1], dtype="int32"))

    def compute_output_shape(self, input_shape):  # type: ignore[no-untyped-def]
        return (input_shape[1], self.output_dim)


class SelfAttention(layers.Layer):
    """An encoder layer's attention block, post-LN: x (B, S, H), allowed (B, 1, 1, S) bool →
    attention_norm(x + attention_out(attention(x))) (B, S, H), float32 (the residual stream)."""

    def __init__(self, hidden: int, heads: int, eps: float, **kwargs: object) -> None:
        super().__init__(dtype=precision.FLOAT32, **kwargs)  # the residual stream; its Dense layers: the policy's
        self.heads, self.hidden = heads, hidden
        self.query, self.key, self.value = (dense(hidden, n) for n in ("query", "key", "value"))
        self.attention_out = dense(hidden, "attention_out")
        self.attention_norm = precision.layer_norm(eps, "attention_norm")

    def build(self, x_shape, allowed_shape):  # type: ignore[no-untyped-def]
        for layer in (self.query, self.key, self.value, self.attention_out, self.attention_norm):
            layer.build((None, None, self.hidden))

    def call(self, x, allowed):  # type: ignore[no-untyped-def]
        b, s = ops.shape(x)[0], ops.shape(x)[1]

        def split(t):  # type: ignore[no-untyped-def]  # (B, S, H) -> (B, S, heads, H / heads)
            return ops.reshape(t, (b, s, self.heads, self.hidden // self.heads))

        context = ops.dot_product_attention(
            split(self.query(x)), split(self.key(x)), split(self.value(x)), mask=allowed
        )
        # ops.add: float32 residual + bfloat16 Dense output promotes to float32 on every backend (TF's + would not)
        return self.attention_norm(ops.add(x, self.attention_out(ops.reshape(context, (b, s, self.hidden)))))


class FeedForward(layers.Layer):
    """An encoder layer's feed-forward block before its residual: x (B, S, H) → ffn_out(gelu_erf(ffn_in(x)))
    (B, S, H), in the Dense layers' (the policy's) dtype; a float32 layer, so its input stays float32 until
    ffn_in casts it."""

    def __init__(self, hidden: int, intermediate: int, **kwargs: object) -> None:
        super().__init__(dtype=precision.FLOAT32, **kwargs)
        self.hidden, self.intermediate = hidden, intermediate
        self.ffn_in = dense(intermediate, "ffn_in")
        self.ffn_out = dense(hidden, "ffn_out")

    def build(self, x_shape):  # type: ignore[no-untyped-def]
        self.ffn_in.build((None, None, self.hidden))
        self.ffn_out.build((None, None, self.intermediate))

    def call(self, x):  # type: ignore[no-untyped-def]
        return self.ffn_out(ops.gelu(self.ffn_in(x), approximate=False))


# checkpoint kind (Bert.checkpoint) -> the layer of encoder layer i whose output it is
_CHECKPOINT_LAYERS = {"attention": "layers_{i}_attention", "ffn": "layers_{i}_ffn", "layer": "layers_{i}_ffn_norm"}
# role -> the path of the layer of encoder layer i that holds its variables
_ROLE_PATHS = {
    **{role: f"layers_{{i}}_attention/{role}" for role in ("query", "key", "value", "attention_out", "attention_norm")},
    **{role: f"layers_{{i}}_ffn/{role}" for role in ("ffn_in", "ffn_out")},
    "ffn_norm": "layers_{i}_ffn_norm",  # a layer of the functional graph itself
}
assert set(_ROLE_PATHS) == set(LAYER_ROLES)


def encoder_layer(x: KerasTensor, allowed: KerasTensor, c: BertConfig, i: int) -> KerasTensor:
    """Encoder layer ``i`` on the functional graph's x (B, S, H): its attention block, feed-forward block,
    then the residual sum and ``ffn_norm``, each a layer named after the layer (``layers_{i}_...``, _CHECKPOINT_LAYERS)
    whose output is one of its checkpoints."""
    names = {kind: name.format(i=i) for kind, name in _CHECKPOINT_LAYERS.items()}
    x = SelfAttention(c.hidden, c.heads, c.layer_norm_eps, name=names["attention"])(x, allowed)
    ffn = FeedForward(c.hidden, c.intermediate, name=names["ffn"])(x)
    # ops.add: float32 residual + bfloat16 Dense output promotes to float32 on every backend (TF's + would not)
    return precision.layer_norm(c.layer_norm_eps, names["layer"])(ops.add(x, ffn))


def bert_model(description: Bert) -> keras.Model:
    c = description.config
    names = (
        ("input_ids", "attention_mask", "token_type_ids")
        if description.has_token_types
        else ("input_ids", "attention_mask")
    )
    inputs = {name: keras.Input((None,), dtype="int32", name=name) for name in names}
    input_ids = inputs["input_ids"]
    x = embedding(c.vocab_size, c.hidden, "word_embeddings")(input_ids)
    x = x + PositionEmbedding(
        c.max_positions,
        c.hidden,
        embeddings_initializer=OVERWRITTEN,
        name="position_embeddings",
        dtype=precision.FLOAT32,
    )(input_ids)
    if description.has_token_types:
        x = x + embedding(c.type_vocab_size, c.hidden, "token_type_embeddings")(inputs["token_type_ids"])
    x = precision.layer_norm(c.layer_norm_eps, "embeddings_norm")(x)
    allowed = ops.cast(inputs["attention_mask"], "bool")[:, None, None, :]  # (B, 1, 1, S)
    for i in range(c.layers):
        x = encoder_layer(x, allowed, c, i)
    outputs = {"last_hidden_state": x}
    if description.has_pooler:
        outputs["pooler_output"] = dense(c.hidden, "pooler", activation="tanh")(x[:, 0])
    return keras.Model(inputs, outputs, name=description.name)


_DENSE_NAMES = {"weight": "kernel", "bias": "bias"}  # Dense
_NORM_NAMES = {"weight": "gamma", "bias": "beta"}  # LayerNormalization


def build_model(description: Bert, weights: dict[str, np.ndarray], device: str) -> keras.Model:
    """The encoder with the canonical weights: each role's canonical name mapped onto a variable path
    (``layers_{i}_attention/query/kernel``, ``layers_{i}_ffn_norm/gamma``, …)."""
    with keras.device(keras_device(device)):
        model = bert_model(description)
    mapping = {
        description.param("word_embeddings"): "word_embeddings/embeddings",
        description.param("position_embeddings"): "position_embeddings/embeddings",
    }
    if description.has_token_types:
        mapping[description.param("token_type_embeddings")] = "token_type_embeddings/embeddings"
    for kind in ("weight", "bias"):
        mapping[description.param("embeddings_norm", kind=kind)] = f"embeddings_norm/{_NORM_NAMES[kind]}"
        if description.has_pooler:
            mapping[description.param("pooler", kind=kind)] = f"pooler/{_DENSE_NAMES[kind]}"
        for i in range(description.config.layers):
            for role, path in _ROLE_PATHS.items():
                variable = (_DENSE_NAMES if role in _LINEAR_ROLES else _NORM_NAMES)[kind]
                mapping[description.param(role, i, kind)] = f"{path.format(i=i)}/{variable}"
    transforms: dict[str, Transform] = {name: transpose for name, path in mapping.items() if path.endswith("/kernel")}
    load_canonical(model, weights, mapping, transforms)
    return model


class TiedLogits(layers.Layer):
    """hidden (B, S, H) @ embeddings.T → logits (B, S, V), the embedding table read from ``embedding`` (no
    decoder bias); the layer has no variables of its own."""

    def __init__(self, embedding: layers.Embedding, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self._table = embedding  # underscore: not tracked, so the embedding's variables are listed once

    def call(self, hidden):  # type: ignore[no-untyped-def]
        return ops.matmul(hidden, ops.transpose(self._table.embeddings))


def checkpoint_layers(description: Bert) -> dict[str, str]:
    """Each checkpoint (``description.checkpoint_names()``) → the layer of the functional model whose output it
    is (each called once): the embeddings' LayerNorm, per encoder layer its attention block (after the attention
    LayerNorm), its feed-forward block (the output projection, before the residual) and its ffn_norm, the
    pooler."""
    layer_names = {"embeddings": "embeddings_norm", "pooler": "pooler"}
    for i in range(description.config.layers):
        for kind, layer in _CHECKPOINT_LAYERS.items():
            layer_names[description.checkpoint(kind, i)] = layer.format(i=i)
    return {name: layer_names[name] for name in description.checkpoint_names()}


def checkpoint_model(model: keras.Model, description: Bert) -> keras.Model:
    """The functional model sharing ``model``'s layers and variables whose outputs are ``model``'s and every
    checkpoint by its name (fwbench.models.checkpoints)."""
    taps = {name: model.get_layer(layer).output for name, layer in checkpoint_layers(description).items()}
    return keras.Model(model.input, {**model.output, **taps}, name=f"{model.name}_checkpoints")


def training_model(model: keras.Model, description: Bert) -> keras.Model:
    """The model train_on_batch trains: the same layers up to last_hidden_state, then masked-LM logits from
    the tied word embeddings (batch, seq, vocab) as its one output; the pooler is not on that path."""
    logits = TiedLogits(model.get_layer("word_embeddings"), name="mlm_logits")(model.output["last_hidden_state"])
    return keras.Model(model.input, logits, name=f"{model.name}_training")
