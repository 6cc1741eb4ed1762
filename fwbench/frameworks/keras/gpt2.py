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

    def projected(self, x):  # type: ignore[no-untyped-def]
        """x (B, S, H) → q, k, v, each (B, S, heads, H / heads)."""
        b, s = ops.shape(x)[0], ops.shape(x)[1]
        return tuple(
            ops.reshape(t, (b, s, self.heads, self.hidden // self.heads))
            for t in ops.split(self.c_attn(self.ln_1(x)), 3, axis=-1)
        )

    def cached_call(self, x, allowed, keys, values, start):  # type: ignore[no-untyped-def]
        """x (B, S, H) at positions start .. start + S - 1, allowed (1, 1, S, max_len) bool, the cache's keys and
        values (B, max_len, heads, H / heads) → (x after the layer, the keys and values with this call's written)."""
        q, k, v = self.projected(x)
        keys, values = write_cache(keys, values, k, v, start)
        context = ops.dot_product_attention(q, ops.cast(keys, q.dtype), ops.cast(values, q.dtype), mask=allowed)
        b, s = ops.shape(x)[0], ops.shape(x)[1]
        x = ops.add(x, self.attn_proj(ops.reshape(context, (b, s, self.hidden))))
        return ops.add(x, self.mlp_proj(ops.gelu(self.c_fc(self.ln_2(x)), approximate=True))), keys, values

    def call(self, x, allowed, checkpoints=False):  # type: ignore[no-untyped-def]
        """x (B, S, H), allowed (B, 1, S, S) bool → (B, S, H); with ``checkpoints``, a dict of the layer's ``attn``
        and ``mlp`` (each block's output before its residual sum) and ``layer`` (the output) instead."""
        b, s = ops.shape(x)[0], ops.shape(x)[1]
        q, k, v = self.projected(x)
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


def write_cache(keys: Any, values: Any, k: Any, v: Any, start: Any) -> tuple[Any, Any]:
    """The cache's keys and values (B, max_len, heads, d) with ``k`` and ``v`` (B, S, heads, d) written at positions
    start .. start + S - 1 by ``ops.slice_update`` (a new tensor: Keras' ops are functional; jax, given the cache
    donated, updates it in place). bf16: the policy's products kept in the float32 cache."""
    at = (0, start, 0, 0)
    return (
        ops.slice_update(keys, at, ops.cast(k, keys.dtype)),
        ops.slice_update(values, at, ops.cast(v, values.dtype)),
    )


def cache_allowed(positions: Any, max_len: int) -> Any:
    """(1, 1, S, max_len) bool: the query at ``positions[i]`` may see the cache's keys at positions ≤ it."""
    return (ops.arange(max_len, dtype="int32")[None, :] <= positions[:, None])[None, None]


def call_positions(input_ids: Any, start: Any) -> Any:
    """(S,) int32: the positions start .. start + S - 1 of input_ids (B, S)."""
    return ops.add(ops.arange(ops.shape(input_ids)[1], dtype="int32"), ops.cast(start, "int32"))


def zero_cache(layers: int, shape: tuple[int, ...]) -> list[tuple[Any, Any]]:
    """Per layer (keys, values), each float32 zeros of ``shape`` (every decoder's cache), on the device in scope."""
    return [(ops.zeros(shape, "float32"), ops.zeros(shape, "float32")) for _ in range(layers)]


def new_cache(model: keras.Model, batch: int, max_len: int) -> list[tuple[Any, Any]]:
    """Per layer (keys, values), each (batch, max_len, heads, hidden / heads) float32 zeros."""
    layer = model.get_layer("layers_0")
    count = sum(1 for layer_ in model.layers if isinstance(layer_, DecoderLayer))
    return zero_cache(count, (batch, max_len, layer.heads, layer.hidden // layer.heads))


def cached_forward(model: keras.Model, input_ids: Any, start: Any, cache: list[tuple[Any, Any]]) -> tuple[Any, Any]:
    """input_ids (B, S) at positions start .. start + S - 1 through the built model's own layers (called as Keras
    calls them, under the dtype policy) with the cache (:func:`new_cache`) → (the last position's logits (B, vocab),
    the cache with their keys and values)."""
    positions = call_positions(input_ids, start)
    allowed = cache_allowed(positions, ops.shape(cache[0][0])[1])
    wte = model.get_layer("wte")
    x = ops.add(wte(input_ids), ops.take(model.get_layer("wpe").embeddings, positions, axis=0))
    updated = []
    for i, (keys, values) in enumerate(cache):
        x, keys, values = model.get_layer(f"layers_{i}").cached_call(x, allowed, keys, values, start)
        updated.append((keys, values))
    x = model.get_layer("ln_f")(x[:, -1:])
    return wte(x, reverse=True)[:, 0], updated


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
