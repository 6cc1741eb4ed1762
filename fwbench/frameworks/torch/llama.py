"""The Llama layout in PyTorch: RMSNorm, rotary positions, SwiGLU, grouped-query attention, tied or untied head.

Inputs: input_ids, attention_mask, each (batch, seq) int32. Returns ``(last_hidden_state, logits)``: (batch, seq,
hidden) and (batch, seq, vocab). Phase generate: :func:`new_cache` and :func:`cached_forward` (a preallocated
key/value cache written in place at the call's positions). The canonical weights are nn.Linear's (out, in) already (Hugging Face's
``LlamaForCausalLM`` names). The rotary tables are computed in float32 from the positions at each call (no buffer
to load). ``taps``: the checkpoints (fwbench.models.checkpoints), recorded only when given a dict.
"""

from __future__ import annotations

from typing import cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fwbench.frameworks.torch.gpt2 import causal_allowed, zero_cache
from fwbench.frameworks.torch.weights import load_canonical
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


def rotary_tables(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each (S, head_dim) float32, for ``positions`` (S,) (fwbench.models.llama.rotary_tables)."""
    inverse = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim)
    angles = positions.to(torch.float32)[:, None] * inverse[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, heads, S, d) with rotary positions: x·cos + rotate_half(x)·sin."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class DecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig, index: int) -> None:
        super().__init__()
        c = config
        self.heads, self.kv_heads, self.head_dim = c.heads, c.kv_heads, c.head_dim
        self.checkpoints = layer_checkpoints(index)  # its attention, MLP and layer outputs
        self.input_layernorm = nn.RMSNorm(c.hidden, eps=c.rms_norm_eps)
        self.q_proj = nn.Linear(c.hidden, c.hidden, bias=False)
        self.k_proj = nn.Linear(c.hidden, c.kv_hidden, bias=False)
        self.v_proj = nn.Linear(c.hidden, c.kv_hidden, bias=False)
        self.o_proj = nn.Linear(c.hidden, c.hidden, bias=False)
        self.post_attention_layernorm = nn.RMSNorm(c.hidden, eps=c.rms_norm_eps)
        self.gate_proj = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.up_proj = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.down_proj = nn.Linear(c.intermediate, c.hidden, bias=False)

    def projected(
        self, a: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The normed input a (B, S, H) → q (B, heads, S, d), k and v (B, kv_heads, S, d), q and k rotated."""
        b, s, _ = a.shape

        def heads_of(t: torch.Tensor, count: int) -> torch.Tensor:  # (B, S, count·d) -> (B, count, S, d)
            return t.view(b, s, count, self.head_dim).transpose(1, 2)

        q = rotate(heads_of(self.q_proj(a), self.heads), cos, sin)
        k = rotate(heads_of(self.k_proj(a), self.kv_heads), cos, sin)
        return q, k, heads_of(self.v_proj(a), self.kv_heads)

    def rest(self, x: torch.Tensor, context: torch.Tensor, taps: Taps = None) -> torch.Tensor:
        """The layer after its attention: x (B, S, H) and the context (B, heads, S, d) → the layer's output."""
        b, s, h = x.shape
        attention_name, mlp_name, layer_name = self.checkpoints
        x = x + tap(taps, attention_name, self.o_proj(context.transpose(1, 2).reshape(b, s, h)))
        m = self.post_attention_layernorm(x)
        m = self.down_proj(F.silu(self.gate_proj(m)) * self.up_proj(m))
        return tap(taps, layer_name, x + tap(taps, mlp_name, m))

    def forward(
        self, x: torch.Tensor, allowed: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, taps: Taps = None
    ) -> torch.Tensor:
        """x (B, S, H), allowed (B, 1, S, S) bool, cos and sin (S, d) → (B, S, H)."""
        q, k, v = self.projected(self.input_layernorm(x), cos, sin)
        group = self.heads // self.kv_heads  # head h reads key/value head h // group
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return self.rest(x, F.scaled_dot_product_attention(q, k, v, attn_mask=allowed), taps)

    def cached(
        self, x: torch.Tensor, allowed: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
        cache: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:  # fmt: skip
        """x (B, S, H) at ``positions`` (S,): their keys and values written into ``cache`` (each (B, kv_heads,
        max_len, d)) in place, the queries attending over the whole cache where ``allowed`` (S, max_len)."""
        q, k, v = self.projected(self.input_layernorm(x), cos, sin)
        keys, values = cache
        keys.index_copy_(2, positions, k.to(keys.dtype))  # bf16: the policy's products, kept in the float32 cache
        values.index_copy_(2, positions, v.to(values.dtype))
        context = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed, enable_gqa=True)
        return self.rest(x, context)


class LlamaModule(nn.Module):
    def __init__(self, description: Llama) -> None:
        super().__init__()
        c = self.config = description.config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden)
        self.layers = nn.ModuleList(DecoderLayer(c, i) for i in range(c.layers))
        self.norm = nn.RMSNorm(c.hidden, eps=c.rms_norm_eps)
        self.lm_head = None if c.tied else nn.Linear(c.hidden, c.vocab_size, bias=False)

    def head_weight(self) -> torch.Tensor:
        """The LM head's (vocab, hidden) weight: the token embedding when tied."""
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, taps: Taps = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        seq = input_ids.shape[1]
        positions = torch.arange(seq, device=input_ids.device)
        cos, sin = rotary_tables(positions, self.config.head_dim, self.config.rope_theta)
        x = tap(taps, "embeddings", self.embed_tokens(input_ids))
        allowed = causal_allowed(attention_mask)
        for layer in self.layers:
            x = layer(x, allowed, cos, sin, taps)
        x = tap(taps, "norm", self.norm(x))
        return x, F.linear(x, self.head_weight())


def new_cache(module: LlamaModule, batch: int, max_len: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer (keys, values), each (batch, kv_heads, max_len, head_dim) float32 zeros, on the module's device."""
    c = module.config
    return zero_cache(c.layers, (batch, c.kv_heads, max_len, c.head_dim), module.embed_tokens.weight.device)


def cached_forward(
    module: LlamaModule, input_ids: torch.Tensor, start: torch.Tensor, cache: list[tuple[torch.Tensor, torch.Tensor]]
) -> torch.Tensor:
    """input_ids (B, S) at positions start .. start + S - 1 (``start`` a 0-d int64 tensor, so one compiled program
    serves every step): their keys and values written into ``cache`` (:func:`new_cache`), each position attending to
    the cached ones up to itself. Returns the last position's logits (B, vocab)."""
    c = module.config
    positions = start + torch.arange(input_ids.shape[1], device=input_ids.device)
    cos, sin = rotary_tables(positions, c.head_dim, c.rope_theta)
    allowed = torch.arange(cache[0][0].shape[2], device=input_ids.device)[None, :] <= positions[:, None]
    x = module.embed_tokens(input_ids)
    for layer, layer_cache in zip(module.layers, cache, strict=True):
        x = cast(DecoderLayer, layer).cached(x, allowed, cos, sin, positions, layer_cache)
    return F.linear(module.norm(x[:, -1]), module.head_weight())


# canonical suffix -> this module's parameter suffix (nn.Linear layouts already).
_SUFFIXES = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attn.q_proj.weight": "q_proj.weight",
    "self_attn.k_proj.weight": "k_proj.weight",
    "self_attn.v_proj.weight": "v_proj.weight",
    "self_attn.o_proj.weight": "o_proj.weight",
    "post_attention_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.gate_proj.weight": "gate_proj.weight",
    "mlp.up_proj.weight": "up_proj.weight",
    "mlp.down_proj.weight": "down_proj.weight",
}
assert set(_SUFFIXES) == set(LAYER_SUFFIXES)


def build_model(description: Llama, weights: dict[str, np.ndarray], device: str) -> LlamaModule:
    """The decoder with the canonical weights (Hugging Face names, nn.Linear layouts)."""
    module = LlamaModule(description)
    mapping = {EMBEDDING: "embed_tokens.weight", FINAL_NORM: "norm.weight"}
    if not description.config.tied:
        mapping[LM_HEAD] = "lm_head.weight"
    for i in range(description.config.layers):
        for canonical, own in _SUFFIXES.items():
            mapping[layer_prefix(i) + canonical] = f"layers.{i}.{own}"
    load_canonical(module, weights, mapping)
    return module.to(device).eval()


def training_logits(module: LlamaModule, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The LM head's logits the causal LM loss is taken of: (batch, seq, vocab)."""
    return module(input_ids, attention_mask)[1]
