"""Shared pieces of the text models: seeded token inputs and float64 numpy building blocks.

Inputs are ``input_ids`` (batch, seq) int32 in [0, vocab), ``attention_mask`` (batch, seq) int32
with the last row's tail padded (a quarter of it, at least one real token kept), and for BERT
``token_type_ids`` (batch, seq) int32: 0 for the first half of each row, 1 for the second.
"""

from __future__ import annotations

import numpy as np

from fwbench.models.base import tensor_rng


def token_inputs(batch_size: int, seq_len: int, vocab_size: int, seed: int, token_types: bool) -> dict[str, np.ndarray]:
    rng = tensor_rng(seed, f"inputs/text/{batch_size}x{seq_len}")
    input_ids = rng.integers(0, vocab_size, size=(batch_size, seq_len), dtype=np.int64).astype(np.int32)
    mask = np.ones((batch_size, seq_len), dtype=np.int32)
    padded = seq_len // 4
    if padded:
        mask[-1, seq_len - padded :] = 0
    inputs = {"input_ids": input_ids, "attention_mask": mask}
    if token_types:
        types = np.zeros((batch_size, seq_len), dtype=np.int32)
        types[:, seq_len // 2 :] = 1
        inputs["token_type_ids"] = types
    return inputs


MLM_FRACTION = 0.15  # share of the real positions a BERT training target counts, as in BERT's pre-training


def next_token_targets(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Causal LM targets: position t predicts input_ids[t + 1]; counted where token t + 1 is real (the
    mask pads only a row's tail, so token t is real too). The last position never counts (label 0).
    labels (B, S) int32, label_weights (B, S) float32."""
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    labels = np.zeros_like(ids)
    weights = np.zeros(ids.shape, dtype=np.float32)
    labels[:, :-1] = ids[:, 1:]
    weights[:, :-1] = mask[:, 1:]
    return {"labels": labels, "label_weights": weights}


def masked_lm_targets(inputs: dict[str, np.ndarray], vocab_size: int, seed: int) -> dict[str, np.ndarray]:
    """Masked-LM style targets: a seeded ~15% of each row's real positions (at least one) count, each
    with a seeded target token id in [0, vocab); the inputs themselves are left as they are (no [MASK]
    substitution: the step's cost is the same). labels (B, S) int32 (0 where not counted),
    label_weights (B, S) float32 (1 where counted)."""
    mask = inputs["attention_mask"].astype(bool)
    b, s = mask.shape
    rng = tensor_rng(seed, f"targets/mlm/{b}x{s}")
    chosen = (rng.random((b, s)) < MLM_FRACTION) & mask
    for row in np.flatnonzero(~chosen.any(axis=1)):  # every row counts at least one real position
        chosen[row, rng.choice(np.flatnonzero(mask[row]))] = True
    labels = np.where(chosen, rng.integers(0, vocab_size, size=(b, s), dtype=np.int64), 0).astype(np.int32)
    return {"labels": labels, "label_weights": chosen.astype(np.float32)}


def transformer_layer_flops(seq_len: int, hidden: int, intermediate: int) -> int:
    """Matmul FLOPs of one encoder/decoder layer for one sequence: 8·S·H² (Q, K, V, output
    projections) + 4·S·H·I (feed-forward) + 4·S²·H (attention scores and context)."""
    return 8 * seq_len * hidden**2 + 4 * seq_len * hidden * intermediate + 4 * seq_len * seq_len * hidden


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def gelu_erf(x: np.ndarray) -> np.ndarray:
    from scipy import special  # here: every CLI command imports the model descriptions, few compute a reference

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
