"""The BERT family in Keras (BERT with pooler, DistilBERT without): post-LN encoder, erf GELU.

Inputs: input_ids, attention_mask[, token_type_ids], each (batch, seq) int32, passed as a dict.
Returns ``{"last_hidden_state"[, "pooler_output"]}``: (batch, seq, hidden) and (batch, hidden).
A functional model; each encoder layer is a keras Layer of Dense / LayerNormalization sublayers,
attention is ``keras.ops.dot_product_attention`` with a boolean key mask (True = attend). Embeddings, layer
norms and the encoder layers' residual stream are float32 under every policy (``precision``), Dense layers
follow the global one.
Canonical linear weights are (out, in); Dense kernels are (in, out), transposed once when loading.
``checkpoint_model`` (fwbench diff): the same layers called once more in a second functional graph that also returns
every checkpoint (fwbench.models.checkpoints), each encoder layer asked for its attention, feed-forward and layer
outputs; the timed model's graph is not touched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
from keras import layers, ops

from fwbench.frameworks.keras import precision
from fwbench.frameworks.keras.weights import OVERWRITTEN, keras_device, load_canonical
from fwbench.models.bert import LAYER_CHECKPOINT_KINDS, LAYER_ROLES, Bert
from fwbench.models.checkpoints import Taps, tap
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


class EncoderLayer(layers.Layer):
    def __init__(self, hidden: int, heads: int, intermediate: int, eps: float, **kwargs: object) -> None:
        super().__init__(dtype=precision.FLOAT32, **kwargs)  # the residual stream; its Dense layers: the policy's
        self.heads, self.hidden, self.intermediate = heads, hidden, intermediate
        self.query, self.key, self.value = (dense(hidden, n) for n in ("query", "key", "value"))
        self.attention_out = dense(hidden, "attention_out")
        self.attention_norm = precision.layer_norm(eps, "attention_norm")
        self.ffn_in = dense(intermediate, "ffn_in")
        self.ffn_out = dense(hidden, "ffn_out")
        self.ffn_norm = precision.layer_norm(eps, "ffn_norm")

    def build(self, x_shape, allowed_shape):  # type: ignore[no-untyped-def]
        hidden, intermediate = (None, None, self.hidden), (None, None, self.intermediate)
        for layer in (
            self.query,
            self.key,
            self.value,
            self.attention_out,
            self.attention_norm,
            self.ffn_in,
            self.ffn_norm,
        ):
            layer.build(hidden)
        self.ffn_out.build(intermediate)

    def call(self, x, allowed, checkpoints=False):  # type: ignore[no-untyped-def]
        """x (B, S, H), allowed (B, 1, 1, S) bool → (B, S, H); with ``checkpoints``, a dict of the layer's
        ``attention`` (after its residual LayerNorm), ``ffn`` (the feed-forward output, before its residual) and
        ``layer`` (the output) instead."""
        b, s = ops.shape(x)[0], ops.shape(x)[1]

        def split(t):  # type: ignore[no-untyped-def]  # (B, S, H) -> (B, S, heads, H / heads)
            return ops.reshape(t, (b, s, self.heads, self.hidden // self.heads))

        context = ops.dot_product_attention(
            split(self.query(x)), split(self.key(x)), split(self.value(x)), mask=allowed
        )
        # ops.add: float32 residual + bfloat16 Dense output promotes to float32 on every backend (TF's + would not)
        x = self.attention_norm(ops.add(x, self.attention_out(ops.reshape(context, (b, s, self.hidden)))))
        if not checkpoints:
            return self.ffn_norm(ops.add(x, self.ffn_out(ops.gelu(self.ffn_in(x), approximate=False))))
        ffn = self.ffn_out(ops.gelu(self.ffn_in(x), approximate=False))
        return {"attention": x, "ffn": ffn, "layer": self.ffn_norm(ops.add(x, ffn))}


class WithCheckpoints(layers.Layer):
    """A built encoder or decoder layer ``inner`` called for its checkpoints (``call(x, allowed, checkpoints=True)``,
    a dict), in the checkpoint graph: a fresh layer over the same sublayers and variables, because Keras connects only
    the first output of a layer called again with another output structure than its first call's."""

    def __init__(self, inner: layers.Layer, **kwargs: object) -> None:
        super().__init__(dtype=inner.dtype_policy, name=f"{inner.name}_checkpoints", **kwargs)
        self.inner = inner

    def build(self, x_shape, allowed_shape):  # type: ignore[no-untyped-def]
        pass  # the inner layer is built

    def call(self, x, allowed):  # type: ignore[no-untyped-def]
        return self.inner.call(x, allowed, checkpoints=True)


def call_layer(layer: layers.Layer, x: Any, allowed: Any, taps: Taps, names: dict[str, str]) -> Any:
    """``layer(x, allowed)`` (an encoder or decoder layer) in a functional graph; with ``taps`` (the checkpoint
    graph), called through :class:`WithCheckpoints` instead, each part it returns tapped under ``names[part]``, and
    its ``layer`` part returned."""
    if taps is None:
        return layer(x, allowed)
    parts = WithCheckpoints(layer)(x, allowed)
    for part, name in names.items():
        tap(taps, name, parts[part])
    return parts["layer"]


Make = Callable[[str, Callable[[str], layers.Layer]], layers.Layer]  # (layer name, its constructor) -> the layer
# (description, make, taps) -> (inputs, outputs) of a model's functional graph: bert_graph, gpt2.gpt2_graph
Graph = Callable[[Any, Make, Taps], tuple[dict[str, Any], dict[str, Any]]]


def graph_model(graph: Graph, description: Any) -> keras.Model:
    """The model ``graph`` builds for ``description``, every layer new."""
    inputs, outputs = graph(description, lambda name, new: new(name), None)
    return keras.Model(inputs, outputs, name=description.name)


def graph_checkpoint_model(graph: Graph, model: keras.Model, description: Any) -> keras.Model:
    """``graph`` built again over ``model``'s own layers (the same variables), its outputs ``model``'s and every
    checkpoint of ``description.checkpoint_names()`` by name."""
    taps: dict[str, Any] = {}
    inputs, outputs = graph(description, lambda name, new: model.get_layer(name), taps)
    return keras.Model(inputs, {**outputs, **taps}, name=f"{model.name}_checkpoints")


def bert_model(description: Bert) -> keras.Model:
    return graph_model(bert_graph, description)


def checkpoint_model(model: keras.Model, description: Bert) -> keras.Model:
    """A model over ``model``'s own layers whose outputs are its outputs and every checkpoint by name."""
    return graph_checkpoint_model(bert_graph, model, description)


def bert_graph(description: Bert, make: Make, taps: Taps = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(inputs, outputs) of the functional graph, each layer from ``make`` (new, or the built model's); ``taps``:
    also record every checkpoint."""
    c = description.config
    names = (
        ("input_ids", "attention_mask", "token_type_ids")
        if description.has_token_types
        else ("input_ids", "attention_mask")
    )
    inputs = {name: keras.Input((None,), dtype="int32", name=name) for name in names}
    input_ids = inputs["input_ids"]
    x = make("word_embeddings", lambda name: embedding(c.vocab_size, c.hidden, name))(input_ids)
    x = x + make(
        "position_embeddings",
        lambda name: PositionEmbedding(
            c.max_positions, c.hidden, embeddings_initializer=OVERWRITTEN, name=name, dtype=precision.FLOAT32
        ),
    )(input_ids)
    if description.has_token_types:
        types = make("token_type_embeddings", lambda name: embedding(c.type_vocab_size, c.hidden, name))
        x = x + types(inputs["token_type_ids"])
    x = make("embeddings_norm", lambda name: precision.layer_norm(c.layer_norm_eps, name))(x)
    tap(taps, "embeddings", x)
    allowed = ops.cast(inputs["attention_mask"], "bool")[:, None, None, :]  # (B, 1, 1, S)
    for i in range(c.layers):
        layer = make(
            f"layers_{i}", lambda name: EncoderLayer(c.hidden, c.heads, c.intermediate, c.layer_norm_eps, name=name)
        )
        x = call_layer(layer, x, allowed, taps, dict(zip(LAYER_CHECKPOINT_KINDS, description.layer_checkpoints(i))))
    outputs = {"last_hidden_state": x}
    if description.has_pooler:
        pooler = make("pooler", lambda name: dense(c.hidden, name, activation="tanh"))(x[:, 0])
        outputs["pooler_output"] = tap(taps, "pooler", pooler)
    return inputs, outputs


_DENSE_NAMES = {"weight": "kernel", "bias": "bias"}  # Dense
_NORM_NAMES = {"weight": "gamma", "bias": "beta"}  # LayerNormalization


def build_model(description: Bert, weights: dict[str, np.ndarray], device: str) -> keras.Model:
    """The encoder with the canonical weights: each role's canonical name mapped onto a variable path."""
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
            for role in _LINEAR_ROLES:
                mapping[description.param(role, i, kind)] = f"layers_{i}/{role}/{_DENSE_NAMES[kind]}"
            for role in _NORM_ROLES:
                mapping[description.param(role, i, kind)] = f"layers_{i}/{role}/{_NORM_NAMES[kind]}"
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


def training_model(model: keras.Model, description: Bert) -> keras.Model:
    """The model train_on_batch trains: the same layers up to last_hidden_state, then masked-LM logits from
    the tied word embeddings (batch, seq, vocab) as its one output; the pooler is not on that path."""
    logits = TiedLogits(model.get_layer("word_embeddings"), name="mlm_logits")(model.output["last_hidden_state"])
    return keras.Model(model.input, logits, name=f"{model.name}_training")
