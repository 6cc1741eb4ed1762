"""The BERT family in JAX (BERT with pooler, DistilBERT without): post-LN encoder, erf GELU.

Inputs: input_ids, attention_mask[, token_type_ids], each (batch, seq) int32.
Returns ``(last_hidden_state[, pooler_output])``: (batch, seq, hidden) and (batch, hidden).
Pure functions over a parameter pytree; attention is ``jax.nn.dot_product_attention`` with a
boolean key mask (True = attend); matmuls, attention and layer norms through ``precision`` (the
--dtype policy). Canonical linear weights are (out, in); kernels here are
(in, out), transposed once when loading. ``taps``: the checkpoints (fwbench.models.checkpoints), recorded
only when given a dict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fwbench.frameworks.jax import precision
from fwbench.frameworks.jax.weights import CanonicalParams
from fwbench.models.bert import LAYER_ROLES, Bert, BertConfig
from fwbench.models.checkpoints import Taps, tap
from fwbench.models.weightmap import transpose

Params = dict[str, Any]

_LINEAR_ROLES = ("query", "key", "value", "attention_out", "ffn_in", "ffn_out")
_NORM_ROLES = ("attention_norm", "ffn_norm")
assert set(_LINEAR_ROLES + _NORM_ROLES) == set(LAYER_ROLES)


def dense(p: Params, x: jax.Array) -> jax.Array:
    """(..., in) @ kernel (in, out) + bias (out,) → (..., out), under the precision policy."""
    return precision.dense(x, p["kernel"], p["bias"])


def layer_norm(p: Params, x: jax.Array, eps: float) -> jax.Array:
    """LayerNorm over the last axis (two-pass biased variance, like torch and the float64 reference), in
    float32 under every policy."""
    return precision.layer_norm(x, p["scale"], p["bias"], eps)


def encoder_layer(
    p: Params,
    x: jax.Array,
    allowed: jax.Array,
    heads: int,
    eps: float,
    names: tuple[str, str, str] = ("", "", ""),
    taps: Taps = None,
) -> jax.Array:
    """x (B, S, H), allowed (B, 1, 1, S) bool → (B, S, H). ``names``: its attention, feed-forward and layer
    outputs' checkpoint names, recorded in ``taps`` when it is a dict."""
    b, s, h = x.shape
    attention_name, ffn_name, layer_name = names

    def split(t: jax.Array) -> jax.Array:  # (B, S, H) -> (B, S, heads, H / heads)
        return t.reshape(b, s, heads, h // heads)

    context = precision.attention(
        split(dense(p["query"], x)), split(dense(p["key"], x)), split(dense(p["value"], x)), allowed
    )
    x = tap(
        taps,
        attention_name,
        layer_norm(p["attention_norm"], x + dense(p["attention_out"], context.reshape(b, s, h)), eps),
    )
    ffn = tap(taps, ffn_name, dense(p["ffn_out"], jax.nn.gelu(dense(p["ffn_in"], x), approximate=False)))
    return tap(taps, layer_name, layer_norm(p["ffn_norm"], x + ffn, eps))


@dataclass(frozen=True, eq=False)
class BertModule:
    """Static hyperparameters, the parameter pytree, and the forward function. ``apply`` reads weights
    only from its ``params`` argument, so under ``jax.jit`` they are program inputs, not constants."""

    config: BertConfig
    with_token_types: bool
    with_pooler: bool
    params: Params
    checkpoints: tuple[tuple[str, str, str], ...]  # per layer: its attention, feed-forward and layer outputs' names

    def apply(
        self,
        params: Params,
        input_ids: jax.Array,
        attention_mask: jax.Array,
        token_type_ids: jax.Array | None = None,
        *,
        taps: Taps = None,
    ) -> tuple[jax.Array, ...]:
        c = self.config
        seq = input_ids.shape[1]
        x = params["word_embeddings"][input_ids] + params["position_embeddings"][:seq]
        if self.with_token_types:
            x = x + params["token_type_embeddings"][token_type_ids]
        x = tap(taps, "embeddings", layer_norm(params["embeddings_norm"], x, c.layer_norm_eps))
        allowed = attention_mask.astype(jnp.bool_)[:, None, None, :]  # (B, 1, 1, S)
        for layer, names in zip(params["layers"], self.checkpoints, strict=True):
            x = encoder_layer(layer, x, allowed, c.heads, c.layer_norm_eps, names, taps)
        if self.with_pooler:
            return x, tap(taps, "pooler", jnp.tanh(dense(params["pooler"], x[:, 0])))
        return (x,)


def build_model(description: Bert, weights: dict[str, np.ndarray], device: str) -> BertModule:
    """The encoder with the canonical weights: each role's canonical name mapped into the pytree."""
    c = description.config
    h = c.hidden
    canonical = CanonicalParams(weights, device)

    def linear(role: str, fan_in: int, fan_out: int, layer: int | None = None) -> Params:
        return {
            "kernel": canonical.take(description.param(role, layer), (fan_in, fan_out), transpose),
            "bias": canonical.take(description.param(role, layer, "bias"), (fan_out,)),
        }

    def norm(role: str, layer: int | None = None) -> Params:
        return {
            "scale": canonical.take(description.param(role, layer), (h,)),
            "bias": canonical.take(description.param(role, layer, "bias"), (h,)),
        }

    params: Params = {
        "word_embeddings": canonical.take(description.param("word_embeddings"), (c.vocab_size, h)),
        "position_embeddings": canonical.take(description.param("position_embeddings"), (c.max_positions, h)),
    }
    if description.has_token_types:
        params["token_type_embeddings"] = canonical.take(
            description.param("token_type_embeddings"), (c.type_vocab_size, h)
        )
    params["embeddings_norm"] = norm("embeddings_norm")
    sizes = {
        "query": (h, h),
        "key": (h, h),
        "value": (h, h),
        "attention_out": (h, h),
        "ffn_in": (h, c.intermediate),
        "ffn_out": (c.intermediate, h),
    }  # (in, out)
    params["layers"] = [
        {
            **{role: linear(role, *sizes[role], i) for role in _LINEAR_ROLES},
            **{role: norm(role, i) for role in _NORM_ROLES},
        }
        for i in range(c.layers)
    ]
    if description.has_pooler:
        params["pooler"] = linear("pooler", h, h)
    canonical.check_all_used()
    checkpoints = tuple(description.layer_checkpoints(i) for i in range(c.layers))
    return BertModule(c, description.has_token_types, description.has_pooler, params, checkpoints)


def training_logits(model: BertModule, params: Params, *inputs: jax.Array) -> jax.Array:
    """Masked-LM logits from the tied word embeddings, last_hidden_state @ word_embeddings.T (no decoder
    bias): (batch, seq, vocab)."""
    return precision.matmul(model.apply(params, *inputs)[0], params["word_embeddings"].T)
