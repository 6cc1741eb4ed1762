"""torch's Llama model file (fwbench/frameworks/torch/llama.py) with a defect in its cache: a decode step (one
position) writes its key and value at position + 1 while its query attends up to its own position."""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F

from fwbench.frameworks.torch.llama import (
    DecoderLayer,
    LlamaModule,
    build_model,
    new_cache,
    rotary_tables,
    training_logits,
)

__all__ = ["build_model", "cached_forward", "new_cache", "training_logits"]


def cached_forward(
    module: LlamaModule, input_ids: torch.Tensor, start: torch.Tensor, cache: list[tuple[torch.Tensor, torch.Tensor]]
) -> torch.Tensor:
    c = module.config
    positions = start + torch.arange(input_ids.shape[1], device=input_ids.device)
    written = positions + 1 if input_ids.shape[1] == 1 else positions  # the defect: one position late
    cos, sin = rotary_tables(positions, c.head_dim, c.rope_theta)
    allowed = torch.arange(cache[0][0].shape[2], device=input_ids.device)[None, :] <= positions[:, None]
    x = module.embed_tokens(input_ids)
    for layer, layer_cache in zip(module.layers, cache, strict=True):
        x = cast(DecoderLayer, layer).cached(x, allowed, cos, sin, written, layer_cache)
    return F.linear(module.norm(x[:, -1]), module.head_weight())
