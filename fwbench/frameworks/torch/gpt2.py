"""GPT-2 in PyTorch: causal pre-LN decoder, tanh GELU, LM head tied to the token embedding.

Inputs: input_ids, attention_mask, each (batch, seq) int32. Returns ``(last_hidden_state, logits)``:
(batch, seq, hidden) and (batch, seq, vocab). Phase generate: :func:`new_cache` and :func:`cached_forward`.
Canonical Conv1D weights (in, out) are transposed once into nn.Linear's (out, in) when loading. ``taps``: the
checkpoints (fwbench.models.checkpoints), recorded only when given a dict.
"""

from __future__ import annotations

from typing import cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fwbench.frameworks.torch.weights import load_canonical
from fwbench.models.checkpoints import Taps, tap
from fwbench.models.gpt2 import GPT2, LAYER_SUFFIXES
from fwbench.models.weightmap import Transform, transpose


def causal_allowed(attention_mask: torch.Tensor) -> torch.Tensor:
    """attention_mask (B, S), 1 = real token → (B, 1, S, S) bool: query i may see key j ≤ i if it is real."""
    seq = attention_mask.shape[1]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=attention_mask.device).tril()
    return causal[None, None] & attention_mask.bool()[:, None, None, :]


class DecoderLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, intermediate: int, eps: float, name: str) -> None:
        super().__init__()
        self.heads = heads
        self.checkpoints = (f"{name}.attn", f"{name}.mlp", name)  # its attention, MLP and layer outputs
        self.ln_1 = nn.LayerNorm(hidden, eps=eps)
        self.c_attn = nn.Linear(hidden, 3 * hidden)
        self.attn_proj = nn.Linear(hidden, hidden)
        self.ln_2 = nn.LayerNorm(hidden, eps=eps)
        self.c_fc = nn.Linear(hidden, intermediate)
        self.mlp_proj = nn.Linear(intermediate, hidden)

    def projected(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x (B, S, H) → q, k, v, each (B, heads, S, H / heads)."""
        b, s, h = x.shape
        return tuple(
            t.view(b, s, self.heads, h // self.heads).transpose(1, 2)
            for t in self.c_attn(self.ln_1(x)).split(h, dim=-1)
        )

    def forward(self, x: torch.Tensor, allowed: torch.Tensor, taps: Taps = None) -> torch.Tensor:
        q, k, v = self.projected(x)
        return self.rest(x, F.scaled_dot_product_attention(q, k, v, attn_mask=allowed), taps)

    def cached(
        self, x: torch.Tensor, allowed: torch.Tensor, positions: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        """x (B, S, H) at ``positions`` (S,): their keys and values written into ``cache`` (each (B, heads, max_len,
        H / heads)) in place, the queries attending over the whole cache where ``allowed`` (S, max_len)."""
        q, k, v = self.projected(x)
        keys, values = cache
        keys.index_copy_(2, positions, k.to(keys.dtype))  # bf16: the policy's products, kept in the float32 cache
        values.index_copy_(2, positions, v.to(values.dtype))
        return self.rest(x, F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed))

    def rest(self, x: torch.Tensor, context: torch.Tensor, taps: Taps = None) -> torch.Tensor:
        """The layer after its attention: x (B, S, H) and the context (B, heads, S, H / heads) → its output."""
        b, s, h = x.shape
        attention_name, mlp_name, layer_name = self.checkpoints
        x = x + tap(taps, attention_name, self.attn_proj(context.transpose(1, 2).reshape(b, s, h)))
        return tap(
            taps,
            layer_name,
            x + tap(taps, mlp_name, self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))),
        )


class GPT2Module(nn.Module):
    def __init__(self, description: GPT2) -> None:
        super().__init__()
        c = self.config = description.config
        self.wte = nn.Embedding(c.vocab_size, c.hidden)
        self.wpe = nn.Embedding(c.max_positions, c.hidden)
        self.layers = nn.ModuleList(
            DecoderLayer(c.hidden, c.heads, c.intermediate, c.layer_norm_eps, f"h.{i}") for i in range(c.layers)
        )
        self.ln_f = nn.LayerNorm(c.hidden, eps=c.layer_norm_eps)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, taps: Taps = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        seq = input_ids.shape[1]
        positions = torch.arange(seq, device=input_ids.device)
        x = tap(taps, "embeddings", self.wte(input_ids) + self.wpe(positions))
        allowed = causal_allowed(attention_mask)
        for layer in self.layers:
            x = layer(x, allowed, taps)
        x = tap(taps, "ln_f", self.ln_f(x))
        return x, F.linear(x, self.wte.weight)


def zero_cache(layers: int, shape: tuple[int, ...], device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer (keys, values), each float32 zeros of ``shape`` on ``device`` (every decoder's cache)."""
    return [(torch.zeros(shape, device=device), torch.zeros(shape, device=device)) for _ in range(layers)]


def new_cache(module: GPT2Module, batch: int, max_len: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer (keys, values), each (batch, heads, max_len, hidden / heads) float32 zeros, on the module's device."""
    c = module.config
    return zero_cache(c.layers, (batch, c.heads, max_len, c.hidden // c.heads), module.wte.weight.device)


def cached_forward(
    module: GPT2Module, input_ids: torch.Tensor, start: torch.Tensor, cache: list[tuple[torch.Tensor, torch.Tensor]]
) -> torch.Tensor:
    """input_ids (B, S) at positions start .. start + S - 1 (``start`` a 0-d int64 tensor, so one compiled program
    serves every step): their keys and values written into ``cache`` (:func:`new_cache`), each position attending to
    the cached ones up to itself. Returns the last position's logits (B, vocab)."""
    positions = start + torch.arange(input_ids.shape[1], device=input_ids.device)
    allowed = torch.arange(cache[0][0].shape[2], device=input_ids.device)[None, :] <= positions[:, None]
    x = module.wte(input_ids) + module.wpe(positions)
    for layer, layer_cache in zip(module.layers, cache, strict=True):
        x = cast(DecoderLayer, layer).cached(x, allowed, positions, layer_cache)
    return F.linear(module.ln_f(x[:, -1]), module.wte.weight)


# canonical suffix -> this module's parameter suffix; Conv1D weights are transposed.
_SUFFIXES = {
    "ln_1.weight": "ln_1.weight",
    "ln_1.bias": "ln_1.bias",
    "attn.c_attn.weight": "c_attn.weight",
    "attn.c_attn.bias": "c_attn.bias",
    "attn.c_proj.weight": "attn_proj.weight",
    "attn.c_proj.bias": "attn_proj.bias",
    "ln_2.weight": "ln_2.weight",
    "ln_2.bias": "ln_2.bias",
    "mlp.c_fc.weight": "c_fc.weight",
    "mlp.c_fc.bias": "c_fc.bias",
    "mlp.c_proj.weight": "mlp_proj.weight",
    "mlp.c_proj.bias": "mlp_proj.bias",
}
assert set(_SUFFIXES) == set(LAYER_SUFFIXES)


def build_model(description: GPT2, weights: dict[str, np.ndarray], device: str) -> GPT2Module:
    """GPT-2 with the canonical weights (Conv1D (in, out) → nn.Linear (out, in))."""
    module = GPT2Module(description)
    mapping = {
        "wte.weight": "wte.weight",
        "wpe.weight": "wpe.weight",
        "ln_f.weight": "ln_f.weight",
        "ln_f.bias": "ln_f.bias",
    }
    transforms: dict[str, Transform] = {}
    for i in range(description.config.layers):
        for canonical, own in _SUFFIXES.items():
            mapping[f"h.{i}.{canonical}"] = f"layers.{i}.{own}"
            if (
                canonical.endswith("c_attn.weight")
                or canonical.endswith("c_proj.weight")
                or canonical.endswith("c_fc.weight")
            ):
                transforms[f"h.{i}.{canonical}"] = transpose  # Conv1D (in, out) -> nn.Linear (out, in)
    load_canonical(module, weights, mapping, transforms)
    return module.to(device).eval()


def training_logits(module: GPT2Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The tied LM head's logits the causal LM loss is taken of: (batch, seq, vocab)."""
    return module(input_ids, attention_mask)[1]
