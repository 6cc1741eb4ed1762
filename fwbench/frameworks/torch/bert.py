"""The BERT family in PyTorch (BERT with pooler, DistilBERT without): post-LN encoder, erf GELU.

Inputs: input_ids, attention_mask[, token_type_ids], each (batch, seq) int32.
Returns ``(last_hidden_state[, pooler_output])``: (batch, seq, hidden) and (batch, hidden).
Attention is ``F.scaled_dot_product_attention`` with a boolean key mask (True = attend).
``taps``: the checkpoints (fwbench.models.checkpoints), recorded only when given a dict.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fwbench.frameworks.torch.weights import load_canonical
from fwbench.models.bert import LAYER_ROLES, Bert
from fwbench.models.checkpoints import Taps, tap


class EncoderLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, intermediate: int, eps: float, checkpoints: tuple[str, ...]) -> None:
        super().__init__()
        self.heads = heads
        self.checkpoints = checkpoints  # the names of its attention, feed-forward and layer outputs
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))
        self.attention_out = nn.Linear(hidden, hidden)
        self.attention_norm = nn.LayerNorm(hidden, eps=eps)
        self.ffn_in = nn.Linear(hidden, intermediate)
        self.ffn_out = nn.Linear(intermediate, hidden)
        self.ffn_norm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor, taps: Taps = None) -> torch.Tensor:
        b, s, h = x.shape
        attention_name, ffn_name, layer_name = self.checkpoints

        def split(t: torch.Tensor) -> torch.Tensor:  # (B, S, H) -> (B, heads, S, H / heads)
            return t.view(b, s, self.heads, h // self.heads).transpose(1, 2)

        context = F.scaled_dot_product_attention(
            split(self.query(x)), split(self.key(x)), split(self.value(x)), attn_mask=allowed
        )
        x = tap(
            taps, attention_name, self.attention_norm(x + self.attention_out(context.transpose(1, 2).reshape(b, s, h)))
        )
        ffn = tap(taps, ffn_name, self.ffn_out(F.gelu(self.ffn_in(x))))
        return tap(taps, layer_name, self.ffn_norm(x + ffn))


class BertModule(nn.Module):
    def __init__(self, description: Bert) -> None:
        super().__init__()
        c = description.config
        self.with_token_types, self.with_pooler = description.has_token_types, description.has_pooler
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden)
        self.position_embeddings = nn.Embedding(c.max_positions, c.hidden)
        if self.with_token_types:
            self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden)
        self.embeddings_norm = nn.LayerNorm(c.hidden, eps=c.layer_norm_eps)
        self.layers = nn.ModuleList(
            EncoderLayer(c.hidden, c.heads, c.intermediate, c.layer_norm_eps, description.layer_checkpoints(i))
            for i in range(c.layers)
        )
        if self.with_pooler:
            self.pooler = nn.Linear(c.hidden, c.hidden)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        taps: Taps = None,
    ) -> tuple[torch.Tensor, ...]:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        if self.with_token_types:
            x = x + self.token_type_embeddings(token_type_ids)
        x = tap(taps, "embeddings", self.embeddings_norm(x))
        allowed = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, S)
        for layer in self.layers:
            x = layer(x, allowed, taps)
        if self.with_pooler:
            return x, tap(taps, "pooler", torch.tanh(self.pooler(x[:, 0])))
        return (x,)


def build_model(description: Bert, weights: dict[str, np.ndarray], device: str) -> BertModule:
    """The encoder with the canonical weights: each role's canonical name mapped onto this module."""
    module = BertModule(description)
    mapping = {
        description.param("word_embeddings"): "word_embeddings.weight",
        description.param("position_embeddings"): "position_embeddings.weight",
    }
    if description.has_token_types:
        mapping[description.param("token_type_embeddings")] = "token_type_embeddings.weight"
    for kind in ("weight", "bias"):
        mapping[description.param("embeddings_norm", kind=kind)] = f"embeddings_norm.{kind}"
        if description.has_pooler:
            mapping[description.param("pooler", kind=kind)] = f"pooler.{kind}"
        for i in range(description.config.layers):
            for role in LAYER_ROLES:
                mapping[description.param(role, i, kind)] = f"layers.{i}.{role}.{kind}"
    load_canonical(module, weights, mapping)
    return module.to(device).eval()


def training_logits(module: BertModule, *inputs: torch.Tensor) -> torch.Tensor:
    """Masked-LM logits from the tied word embeddings, last_hidden_state @ word_embeddings.T (no decoder
    bias): (batch, seq, vocab)."""
    return F.linear(module(*inputs)[0], module.word_embeddings.weight)
