"""GPT-2 in Keras: causal pre-LN decoder, tanh GELU, LM head tied to the token embedding.

Inputs: input_ids, attention_mask, each (batch, seq) int32, passed as a dict. Returns
``{"last_hidden_state", "logits"}``: (batch, seq, hidden) and (batch, seq, vocab). A functional model;
the token embedding is a ``keras.layers.ReversibleEmbedding``, called in reverse for the tied LM head
(``logits = h @ wte.T``). Canonical Conv1D weights are (in, out), which is already the Dense kernel
layout: no transpose when loading. ``checkpoint_model`` (fwbench diff): the same layers called once more in a second
functional graph that also returns every checkpoint (fwbench.models.checkpoints); the timed graph is not touched.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
from keras import layers, ops

from fwbench.frameworks.keras import precision
from fwbench.frameworks.keras.bert import (
    Make,
    PositionEmbedding,
    call_layer,
    dense,
    graph_checkpoint_model,
    graph_model,
)
from fwbench.frameworks.keras.weights import OVERWRITTEN, keras_device, load_canonical
from fwbench.models.checkpoints import Taps, tap
from fwbench.models.gpt2 import GPT2, LAYER_SUFFIXES


class DecoderLayer(layers.Layer):
    def __init__(self, hidden: int, heads: int, intermediate: int, eps: float, **kwargs: object) -> None:
        super().__init__(dtype=precision.FLOAT32, **kwargs)  # the residual stream; its Dense layers: the policy's
        self.heads, self.hidden, self.intermediate = heads, hidden, intermediate
        self.ln_1 = precision.layer_norm(eps, "ln_1")
        self.c_attn = dense(3 * hidden, "c_attn")
        self.attn_proj = dense(hidden, "attn_proj")
        self.ln_2 = precision.layer_norm(eps, "ln_2")
        self.c_fc = dense(intermediate, "c_fc")
        self.mlp_proj = dense(hidden, "mlp_proj")

    def build(self, x_shape, allowed_shape):  # type: ignore[no-untyped-def]
        for layer in (self.ln_1, self.c_attn, self.attn_proj, self.ln_2, self.c_fc):
            layer.build((None, None, self.hidden))
        self.mlp_proj.build((None, None, self.intermediate))

    def call(self, x, allowed, checkpoints=False):  # type: ignore[no-untyped-def]
        """x (B, S, H), allowed (B, 1, S, S) bool → (B, S, H); with ``checkpoints``, a dict of the layer's ``attn``
        and ``mlp`` (each block's output before its residual sum) and ``layer`` (the output) instead."""
        b, s = ops.shape(x)[0], ops.shape(x)[1]
        q, k, v = (
            ops.reshape(t, (b, s, self.heads, self.hidden // self.heads))  # (B, S, heads, H / heads)
            for t in ops.split(self.c_attn(self.ln_1(x)), 3, axis=-1)
        )
        context = ops.dot_product_attention(q, k, v, mask=allowed)
        # ops.add: float32 residual + bfloat16 Dense output promotes to float32 on every backend (TF's + would not)
        if not checkpoints:
            x = ops.add(x, self.attn_proj(ops.reshape(context, (b, s, self.hidden))))
            return ops.add(x, self.mlp_proj(ops.gelu(self.c_fc(self.ln_2(x)), approximate=True)))
        attn = self.attn_proj(ops.reshape(context, (b, s, self.hidden)))
        x = ops.add(x, attn)
        mlp = self.mlp_proj(ops.gelu(self.c_fc(self.ln_2(x)), approximate=True))
        return {"attn": attn, "mlp": mlp, "layer": ops.add(x, mlp)}


class CausalMask(layers.Layer):
    """attention_mask (B, S) int, 1 = real token → (B, 1, S, S) bool: query i may see key j ≤ i if it is real."""

    def call(self, attention_mask):  # type: ignore[no-untyped-def]
        seq = ops.shape(attention_mask)[1]
        causal = ops.tril(ops.ones((seq, seq), dtype="bool"))
        return ops.logical_and(causal[None, None], ops.cast(attention_mask, "bool")[:, None, None, :])


def tied_embedding(vocab_size: int, hidden: int, name: str) -> layers.ReversibleEmbedding:
    """A token embedding also called in reverse as the tied LM head (``logits = h @ table.T``): the lookup in float32,
    the head in the policy's compute dtype (``reverse_dtype``; Keras' default, None, leaves the float32 table uncast,
    so under mixed_bfloat16 the largest matmul of the model ran in float32)."""
    return layers.ReversibleEmbedding(
        vocab_size,
        hidden,
        tie_weights=True,
        embeddings_initializer=OVERWRITTEN,
        reverse_dtype=keras.config.dtype_policy().compute_dtype,
        name=name,
        dtype=precision.FLOAT32,
    )


def gpt2_model(description: GPT2) -> keras.Model:
    return graph_model(gpt2_graph, description)


def checkpoint_model(model: keras.Model, description: GPT2) -> keras.Model:
    """A model over ``model``'s own layers whose outputs are its outputs and every checkpoint by name."""
    return graph_checkpoint_model(gpt2_graph, model, description)


def gpt2_graph(description: GPT2, make: Make, taps: Taps = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(inputs, outputs) of the functional graph, each layer from ``make`` (new, or the built model's); ``taps``:
    also record every checkpoint."""
    c = description.config
    inputs = {name: keras.Input((None,), dtype="int32", name=name) for name in ("input_ids", "attention_mask")}
    wte = make("wte", lambda name: tied_embedding(c.vocab_size, c.hidden, name))
    wpe = make(
        "wpe",
        lambda name: PositionEmbedding(
            c.max_positions, c.hidden, embeddings_initializer=OVERWRITTEN, name=name, dtype=precision.FLOAT32
        ),
    )
    x = tap(taps, "embeddings", wte(inputs["input_ids"]) + wpe(inputs["input_ids"]))
    allowed = make("causal_mask", lambda name: CausalMask(name=name))(inputs["attention_mask"])  # (B, 1, S, S)
    for i in range(c.layers):
        layer = make(
            f"layers_{i}", lambda name: DecoderLayer(c.hidden, c.heads, c.intermediate, c.layer_norm_eps, name=name)
        )
        x = call_layer(layer, x, allowed, taps, {"attn": f"h.{i}.attn", "mlp": f"h.{i}.mlp", "layer": f"h.{i}"})
    x = tap(taps, "ln_f", make("ln_f", lambda name: precision.layer_norm(c.layer_norm_eps, name))(x))
    return inputs, {"last_hidden_state": x, "logits": wte(x, reverse=True)}


# canonical suffix -> this model's variable path within a layer; Conv1D weights keep their (in, out) layout.
_SUFFIXES = {
    "ln_1.weight": "ln_1/gamma",
    "ln_1.bias": "ln_1/beta",
    "attn.c_attn.weight": "c_attn/kernel",
    "attn.c_attn.bias": "c_attn/bias",
    "attn.c_proj.weight": "attn_proj/kernel",
    "attn.c_proj.bias": "attn_proj/bias",
    "ln_2.weight": "ln_2/gamma",
    "ln_2.bias": "ln_2/beta",
    "mlp.c_fc.weight": "c_fc/kernel",
    "mlp.c_fc.bias": "c_fc/bias",
    "mlp.c_proj.weight": "mlp_proj/kernel",
    "mlp.c_proj.bias": "mlp_proj/bias",
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
            mapping[f"h.{i}.{canonical}"] = f"layers_{i}/{own}"
    load_canonical(model, weights, mapping)
    return model


def training_model(model: keras.Model, description: GPT2) -> keras.Model:
    """The model train_on_batch trains: the same layers, the tied LM head's logits (batch, seq, vocab) as
    its one output."""
    return keras.Model(model.input, model.output["logits"], name=f"{model.name}_training")
