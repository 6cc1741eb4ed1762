"""Shared pieces of the text models: seeded token inputs and float64 numpy building blocks.

Inputs are ``input_ids`` (batch, seq) int32 in [0, vocab), ``attention_mask`` (batch, seq) int32
with the last row's tail padded (a quarter of it, at least one real token kept), and for BERT
``token_type_ids`` (batch, seq) int32: 0 for the first half of each row, 1 for the second.
"""

from __future__ import annotations

import numpy as np
from scipy import special

from fwbench.models.base import tensor_rng


def token_inputs(batch_size: int, seq_len: int, vocab_size: int, seed: int, token_types: bool) -> dict[str, np.ndarray]:
    rng = tensor_rng(seed, f"inputs/text/{batch_size}x{seq_len}")
    input_ids = rng.integers(0, vocab_size, size=(batch_size, seq_len), dtype=np.int64).astype(np.int32)
    mask = np.ones((batch_size, seq_len), dtype=np.int32)
    padded = seq_len // 4
    if padded:
        mask[-1, seq_len - padded:] = 0
    inputs = {"input_ids": input_ids, "attention_mask": mask}
    if token_types:
        types = np.zeros((batch_size, seq_len), dtype=np.int32)
        types[:, seq_len // 2:] = 1
        inputs["token_type_ids"] = types
    return inputs


def transformer_layer_flops(seq_len: int, hidden: int, intermediate: int) -> int:
    """Matmul FLOPs of one encoder/decoder layer for one sequence: 8·S·H² (Q, K, V, output
    projections) + 4·S·H·I (feed-forward) + 4·S²·H (attention scores and context)."""
    return 8 * seq_len * hidden**2 + 4 * seq_len * hidden * intermediate + 4 * seq_len * seq_len * hidden


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def gelu_erf(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + special.erf(x / np.sqrt(2.0)))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(-1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(-1, keepdims=True)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, heads: int, allowed: np.ndarray) -> np.ndarray:
    """Multi-head attention; q, k, v (B, S, H); ``allowed`` (B, 1 or S, S) bool → (B, S, H)."""
    b, s, h = q.shape
    d = h // heads

    def split(t: np.ndarray) -> np.ndarray:
        return t.reshape(b, s, heads, d).transpose(0, 2, 1, 3)

    scores = split(q) @ split(k).transpose(0, 1, 3, 2) / np.sqrt(d)
    scores = np.where(allowed[:, None], scores, -np.inf)
    context = softmax(scores) @ split(v)
    return context.transpose(0, 2, 1, 3).reshape(b, s, h)


def linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """``x @ weight.T + bias`` for a torch-layout (out, in) weight, in float64."""
    return x @ weight.astype(np.float64).T + bias
