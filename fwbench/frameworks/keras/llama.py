"""The Llama layout in Keras: RMSNorm, rotary positions, SwiGLU, grouped-query attention, tied or untied head.

Inputs: input_ids, attention_mask, each (batch, seq) int32, passed as a dict. Returns ``{"last_hidden_state",
"logits"}``: (batch, seq, hidden) and (batch, seq, vocab). A functional model; each decoder layer is a keras Layer of
``RMSNormalization`` and bias-free Dense sublayers, attention ``keras.ops.dot_product_attention`` with a boolean mask
(True = attend). A tied head is the token embedding (a ``ReversibleEmbedding``) called in reverse, an untied one a
bias-free Dense ``lm_head``. Canonical nn.Linear (out, in) weights are transposed once into Dense kernels when loading.
``checkpoint_model`` (fwbench diff): the same layers called once more in a second functional graph that also returns
every checkpoint (fwbench.models.checkpoints); the timed graph is not touched.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
from keras import layers, ops

from fwbench.frameworks.keras import precision
from fwbench.frameworks.keras.bert import Make, call_layer, graph_checkpoint_model, graph_model
from fwbench.frameworks.keras.gpt2 import (
    CausalMask,
    cache_allowed,
    call_positions,
    tied_embedding,
    write_cache,
    zero_cache,
)
from fwbench.frameworks.keras.weights import OVERWRITTEN, keras_device, load_canonical
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
from fwbench.models.weightmap import Transform, transpose


def projection(units: int, name: str) -> layers.Dense:
    return layers.Dense(units, use_bias=False, kernel_initializer=OVERWRITTEN, name=name)


def rotate(x: Any, cos: Any, sin: Any) -> Any:
    """x (B, S, heads, d) with rotary positions (tables (S, 1, d)): x·cos + rotate_half(x)·sin, in x's dtype."""
    half = x.shape[-1] // 2
    cos, sin = ops.cast(cos, x.dtype), ops.cast(sin, x.dtype)
    return x * cos + ops.concatenate([-x[..., half:], x[..., :half]], axis=-1) * sin


class DecoderLayer(layers.Layer):
    def __init__(self, config: LlamaConfig, **kwargs: object) -> None:
        super().__init__(dtype=precision.FLOAT32, **kwargs)  # the residual stream; its Dense layers: the policy's
        c = self.config = config
        self.input_layernorm = precision.rms_norm(c.rms_norm_eps, "input_layernorm")
        self.q_proj = projection(c.hidden, "q_proj")
        self.k_proj = projection(c.kv_hidden, "k_proj")
        self.v_proj = projection(c.kv_hidden, "v_proj")
        self.o_proj = projection(c.hidden, "o_proj")
        self.post_attention_layernorm = precision.rms_norm(c.rms_norm_eps, "post_attention_layernorm")
        self.gate_proj = projection(c.intermediate, "gate_proj")
        self.up_proj = projection(c.intermediate, "up_proj")
        self.down_proj = projection(c.hidden, "down_proj")

    def build(self, x_shape, allowed_shape):  # type: ignore[no-untyped-def]
        hidden = (None, None, self.config.hidden)
        for layer in (self.input_layernorm, self.q_proj, self.k_proj, self.v_proj, self.o_proj):
            layer.build(hidden)
        for layer in (self.post_attention_layernorm, self.gate_proj, self.up_proj):
            layer.build(hidden)
        self.down_proj.build((None, None, self.config.intermediate))

    def rotary_tables(self, positions: Any) -> tuple[Any, Any]:
        """(cos, sin), each (S, 1, d) float32 for ``positions`` (S,) (fwbench.models.llama.rotary_tables)."""
        c = self.config
        # keras ops only, made on the device in scope: on the torch backend Keras' symbolic call runs the layer on
        # the meta device, and any op that fails there makes it run the layer for real (83-token inputs) instead
        exponents = ops.arange(0, c.head_dim, 2, dtype="float32") / float(-c.head_dim)
        inverse = ops.power(ops.convert_to_tensor(c.rope_theta, "float32"), exponents)
        angles = ops.cast(positions, "float32")[:, None] * inverse[None, :]
        angles = ops.concatenate([angles, angles], axis=-1)[:, None, :]
        return ops.cos(angles), ops.sin(angles)

    def projected(self, x, positions):  # type: ignore[no-untyped-def]
        """x (B, S, H) at ``positions`` (S,) → q (B, S, heads, d), k and v (B, S, kv_heads, d), q and k rotated."""
        c = self.config
        b, s = ops.shape(x)[0], ops.shape(x)[1]
        cos, sin = self.rotary_tables(positions)
        a = self.input_layernorm(x)
        q = rotate(ops.reshape(self.q_proj(a), (b, s, c.heads, c.head_dim)), cos, sin)
        k = rotate(ops.reshape(self.k_proj(a), (b, s, c.kv_heads, c.head_dim)), cos, sin)
        return q, k, ops.reshape(self.v_proj(a), (b, s, c.kv_heads, c.head_dim))

    def after_attention(self, x, context):  # type: ignore[no-untyped-def]
        """x (B, S, H) and the attention's context (B, S, heads, d) → (attn, mlp, the layer's output)."""
        b, s = ops.shape(x)[0], ops.shape(x)[1]
        attn = self.o_proj(ops.reshape(context, (b, s, self.config.hidden)))
        # ops.add: float32 residual + bfloat16 Dense output promotes to float32 on every backend (TF's + would not)
        x = ops.add(x, attn)
        m = self.post_attention_layernorm(x)
        mlp = self.down_proj(ops.multiply(ops.silu(self.gate_proj(m)), self.up_proj(m)))
        return attn, mlp, ops.add(x, mlp)

    def cached_call(self, x, allowed, keys, values, start):  # type: ignore[no-untyped-def]
        """x (B, S, H) at positions start .. start + S - 1, allowed (1, 1, S, max_len) bool, the cache's keys and
        values (B, max_len, kv_heads, d) → (x after the layer, the keys and values with this call's written)."""
        q, k, v = self.projected(x, call_positions(x, start))
        keys, values = write_cache(keys, values, k, v, start)
        context = ops.dot_product_attention(q, ops.cast(keys, q.dtype), ops.cast(values, q.dtype), mask=allowed)
        return self.after_attention(x, context)[2], keys, values

    def call(self, x, allowed, checkpoints=False):  # type: ignore[no-untyped-def]
        """x (B, S, H), allowed (B, 1, S, S) bool → (B, S, H); with ``checkpoints``, a dict of the layer's ``attn``
        and ``mlp`` (each block's output before its residual sum) and ``layer`` (the output) instead."""
        q, k, v = self.projected(x, ops.arange(ops.shape(x)[1]))
        # grouped-query attention as Keras does it on every backend: query head h reads key/value head
        # h // (heads / kv_heads), the pairing np.repeat gives (an ops.repeat here fails Keras' symbolic call on the
        # torch backend, which then builds the model by running it on real tensors)
        attn, mlp, out = self.after_attention(x, ops.dot_product_attention(q, k, v, mask=allowed))
        return {"attn": attn, "mlp": mlp, "layer": out} if checkpoints else out


def llama_model(description: Llama) -> keras.Model:
    return graph_model(llama_graph, description)


def checkpoint_model(model: keras.Model, description: Llama) -> keras.Model:
    """A model over ``model``'s own layers whose outputs are its outputs and every checkpoint by name."""
    return graph_checkpoint_model(llama_graph, model, description)


def llama_graph(description: Llama, make: Make, taps: Taps = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(inputs, outputs) of the functional graph, each layer from ``make`` (new, or the built model's); ``taps``:
    also record every checkpoint."""
    c = description.config
    inputs = {name: keras.Input((None,), dtype="int32", name=name) for name in ("input_ids", "attention_mask")}
    embed = make("embed_tokens", lambda name: tied_embedding(c.vocab_size, c.hidden, name))
    x = tap(taps, "embeddings", embed(inputs["input_ids"]))
    allowed = make("causal_mask", lambda name: CausalMask(name=name))(inputs["attention_mask"])  # (B, 1, S, S)
    for i in range(c.layers):
        layer = make(f"layers_{i}", lambda name: DecoderLayer(c, name=name))
        x = call_layer(layer, x, allowed, taps, dict(zip(("attn", "mlp", "layer"), layer_checkpoints(i), strict=True)))
    x = tap(taps, "norm", make("norm", lambda name: precision.rms_norm(c.rms_norm_eps, name))(x))
    logits = embed(x, reverse=True) if c.tied else make("lm_head", lambda name: projection(c.vocab_size, name))(x)
    return inputs, {"last_hidden_state": x, "logits": logits}


def new_cache(model: keras.Model, batch: int, max_len: int) -> list[tuple[Any, Any]]:
    """Per layer (keys, values), each (batch, max_len, kv_heads, head_dim) float32 zeros."""
    c: LlamaConfig = model.get_layer("layers_0").config
    return zero_cache(c.layers, (batch, max_len, c.kv_heads, c.head_dim))


def cached_forward(model: keras.Model, input_ids: Any, start: Any, cache: list[tuple[Any, Any]]) -> tuple[Any, Any]:
    """input_ids (B, S) at positions start .. start + S - 1 through the built model's own layers (called as Keras
    calls them, under the dtype policy) with the cache (:func:`new_cache`) → (the last position's logits (B, vocab),
    the cache with their keys and values)."""
    allowed = cache_allowed(call_positions(input_ids, start), ops.shape(cache[0][0])[1])
    embed = model.get_layer("embed_tokens")
    x = embed(input_ids)
    updated = []
    for i, (keys, values) in enumerate(cache):
        x, keys, values = model.get_layer(f"layers_{i}").cached_call(x, allowed, keys, values, start)
        updated.append((keys, values))
    x = model.get_layer("norm")(x[:, -1:])
    logits = embed(x, reverse=True) if model.get_layer("layers_0").config.tied else model.get_layer("lm_head")(x)
    return logits[:, 0], updated


# canonical suffix -> this model's variable path within a layer.
_SUFFIXES = {
    "input_layernorm.weight": "input_layernorm/scale",
    "self_attn.q_proj.weight": "q_proj/kernel",
    "self_attn.k_proj.weight": "k_proj/kernel",
    "self_attn.v_proj.weight": "v_proj/kernel",
    "self_attn.o_proj.weight": "o_proj/kernel",
    "post_attention_layernorm.weight": "post_attention_layernorm/scale",
    "mlp.gate_proj.weight": "gate_proj/kernel",
    "mlp.up_proj.weight": "up_proj/kernel",
    "mlp.down_proj.weight": "down_proj/kernel",
}
assert set(_SUFFIXES) == set(LAYER_SUFFIXES)


def build_model(description: Llama, weights: dict[str, np.ndarray], device: str) -> keras.Model:
    """The decoder with the canonical weights (nn.Linear (out, in) → Dense (in, out) kernels)."""
    with keras.device(keras_device(device)):
        model = llama_model(description)
    mapping = {EMBEDDING: "embed_tokens/embeddings", FINAL_NORM: "norm/scale"}
    if not description.config.tied:
        mapping[LM_HEAD] = "lm_head/kernel"
    for i in range(description.config.layers):
        for canonical, own in _SUFFIXES.items():
            mapping[layer_prefix(i) + canonical] = f"layers_{i}/{own}"
    transforms: dict[str, Transform] = {name: transpose for name, path in mapping.items() if path.endswith("/kernel")}
    load_canonical(model, weights, mapping, transforms)
    return model


def training_model(model: keras.Model, description: Llama) -> keras.Model:
    """The model train_on_batch trains: the same layers, the LM head's logits (batch, seq, vocab) as its one
    output."""
    return keras.Model(model.input, model.output["logits"], name=f"{model.name}_training")
