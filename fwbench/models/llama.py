"""The Llama layout (Llama, Qwen, Mistral, SmolLM): a causal decoder with RMSNorm, rotary positions, a SwiGLU
feed-forward and grouped-query attention, and a tied or untied LM head.

Parameter names and layouts are Hugging Face transformers' ``LlamaForCausalLM`` state dict (nn.Linear (out, in)
weights, no biases), so a checkpoint written by ``save_pretrained`` loads by name. Rotary positions follow its
``rotate_half`` convention: the first and second halves of each head's dimensions are the pairs rotated, by the
angle position · θ^(−2i/d). Key/value heads are shared by ``heads / kv_heads`` query heads each (head h reads key
head h // (heads / kv_heads)). Inputs: input_ids, attention_mask, each (batch, seq) int32; positions are 0..seq-1.
Outputs: ``last_hidden_state`` (batch, seq, hidden) after the final norm and ``logits`` (batch, seq, vocab).
Training: causal LM cross-entropy of ``logits``, position t against input_ids[t + 1] (text.next_token_targets).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fwbench.models.base import ParamSpec, normal_weights
from fwbench.models.checkpoints import Taps, tap
from fwbench.models.decoder import CausalDecoder
from fwbench.models.text import softmax
from fwbench.spec import SpecError


@dataclass(frozen=True)
class LlamaConfig:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab_size: int
    max_positions: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tied: bool = True  # the LM head is the token embedding

    def __post_init__(self) -> None:
        if self.hidden % self.heads:
            raise SpecError(f"hidden size {self.hidden} is not divisible by {self.heads} heads")
        if self.heads % self.kv_heads:
            raise SpecError(f"{self.heads} attention heads are not divisible by {self.kv_heads} key/value heads")
        if self.head_dim % 2:
            raise SpecError(f"rotary positions need an even head size, not {self.head_dim}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_hidden(self) -> int:
        """The width of the key and value projections: kv_heads · head_dim."""
        return self.kv_heads * self.head_dim


# Per-layer tensors: suffix -> shape as a function of the config; nn.Linear (out, in) layout.
_LAYER_TENSORS = {
    "input_layernorm.weight": lambda c: (c.hidden,),
    "self_attn.q_proj.weight": lambda c: (c.hidden, c.hidden),
    "self_attn.k_proj.weight": lambda c: (c.kv_hidden, c.hidden),
    "self_attn.v_proj.weight": lambda c: (c.kv_hidden, c.hidden),
    "self_attn.o_proj.weight": lambda c: (c.hidden, c.hidden),
    "post_attention_layernorm.weight": lambda c: (c.hidden,),
    "mlp.gate_proj.weight": lambda c: (c.intermediate, c.hidden),
    "mlp.up_proj.weight": lambda c: (c.intermediate, c.hidden),
    "mlp.down_proj.weight": lambda c: (c.hidden, c.intermediate),
}
LAYER_SUFFIXES = tuple(_LAYER_TENSORS)
EMBEDDING, FINAL_NORM, LM_HEAD = "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"


def layer_prefix(layer: int) -> str:
    """The canonical names' prefix of decoder layer ``layer``."""
    return f"model.layers.{layer}."


def layer_checkpoints(layer: int) -> tuple[str, str, str]:
    """The checkpoints of decoder layer ``layer``: its attention and MLP outputs (each before its residual sum)
    and its output."""
    return f"layers.{layer}.attn", f"layers.{layer}.mlp", f"layers.{layer}"


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x / √(mean(x²) + eps) · weight over the last axis."""
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight


def rotary_tables(positions: np.ndarray, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin), each (len(positions), head_dim) float64: angle position · θ^(−2i/d) for i < d/2, repeated
    for the second half (``rotate_half``'s pairing)."""
    inverse = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = positions.astype(np.float64)[:, None] * inverse[None, :]
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles), np.sin(angles)


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotary positions applied to x (..., S, d) with tables (S, d): x·cos + rotate_half(x)·sin."""
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


class Llama(CausalDecoder):
    arch = "llama"
    config: LlamaConfig

    def param_schema(self) -> list[ParamSpec]:
        c = self.config
        specs = [ParamSpec(EMBEDDING, (c.vocab_size, c.hidden))]
        for layer in range(c.layers):
            specs += [ParamSpec(layer_prefix(layer) + suffix, shape(c)) for suffix, shape in _LAYER_TENSORS.items()]
        specs.append(ParamSpec(FINAL_NORM, (c.hidden,)))
        if not c.tied:
            specs.append(ParamSpec(LM_HEAD, (c.vocab_size, c.hidden)))
        return specs

    def gathered_tables(self) -> tuple[str, ...]:
        return (EMBEDDING,)

    def cache_width(self) -> int:
        return self.config.kv_hidden

    def head_name(self) -> str:
        """The canonical tensor the LM head multiplies by (vocab, hidden): the embedding when tied."""
        return EMBEDDING if self.config.tied else LM_HEAD

    def canonical_weights(self, seed: int = 0) -> dict[str, np.ndarray]:
        """N(0, 0.02) everywhere, the RMSNorm scales around 1 (the final norm's too)."""
        weights = normal_weights(self.param_schema(), seed)
        weights[FINAL_NORM] = weights[FINAL_NORM] + np.float32(1.0)
        return weights

    def attention_flops(self, batch_size: int, seq_len: int | None) -> int:
        """Attention's scores and context matmuls: 4·S²·H per layer and sample."""
        s = seq_len or 1
        return batch_size * self.config.layers * 4 * s * s * self.config.hidden

    def forward_flops(self, batch_size: int, seq_len: int | None) -> int:
        """Matmul FLOPs: per layer 4·S·H² (query, output) + 4·S·H·Hkv (key, value) + 6·S·H·I (gate, up, down) +
        4·S²·H (scores, context), plus the LM head 2·S·H·V."""
        c, s = self.config, seq_len or 1
        per_layer = 4 * s * c.hidden**2 + 4 * s * c.hidden * c.kv_hidden + 6 * s * c.hidden * c.intermediate
        per_layer += 4 * s * s * c.hidden
        return batch_size * (c.layers * per_layer + 2 * s * c.hidden * c.vocab_size)

    def checkpoint_names(self) -> tuple[str, ...]:
        """``embeddings``, per layer ``layers.{i}.attn`` and ``layers.{i}.mlp`` (each block's output before its
        residual sum) and ``layers.{i}`` (the layer's output), then ``norm`` (the last hidden state)."""
        layers = [name for i in range(self.config.layers) for name in layer_checkpoints(i)]
        return ("embeddings", *layers, "norm")

    def reference_hidden(
        self, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray], taps: Taps = None
    ) -> np.ndarray:
        """The float64 last hidden state (batch, seq, hidden), after the final norm."""
        c = self.config
        w = {name: value.astype(np.float64) for name, value in weights.items()}
        ids = inputs["input_ids"]
        b, s = ids.shape
        x = tap(taps, "embeddings", w[EMBEDDING][ids])
        cos, sin = rotary_tables(np.arange(s), c.head_dim, c.rope_theta)
        allowed = np.tril(np.ones((s, s), dtype=bool))[None] & inputs["attention_mask"].astype(bool)[:, None, :]
        group = c.heads // c.kv_heads

        def heads_of(t: np.ndarray, count: int) -> np.ndarray:  # (B, S, count·d) -> (B, count, S, d)
            return t.reshape(b, s, count, c.head_dim).transpose(0, 2, 1, 3)

        for layer in range(c.layers):
            p = layer_prefix(layer)
            a = rms_norm(x, w[p + "input_layernorm.weight"], c.rms_norm_eps)
            q = rotate(heads_of(a @ w[p + "self_attn.q_proj.weight"].T, c.heads), cos, sin)
            k = rotate(heads_of(a @ w[p + "self_attn.k_proj.weight"].T, c.kv_heads), cos, sin)
            v = heads_of(a @ w[p + "self_attn.v_proj.weight"].T, c.kv_heads)
            k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # head h reads key head h // group
            scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(c.head_dim)
            context = softmax(np.where(allowed[:, None], scores, -np.inf)) @ v  # (B, heads, S, d)
            a = context.transpose(0, 2, 1, 3).reshape(b, s, c.hidden) @ w[p + "self_attn.o_proj.weight"].T
            attention_name, mlp_name, layer_name = layer_checkpoints(layer)
            x = x + tap(taps, attention_name, a)
            m = rms_norm(x, w[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
            m = silu(m @ w[p + "mlp.gate_proj.weight"].T) * (m @ w[p + "mlp.up_proj.weight"].T)
            m = m @ w[p + "mlp.down_proj.weight"].T
            x = tap(taps, layer_name, x + tap(taps, mlp_name, m))
        return tap(taps, "norm", rms_norm(x, w[FINAL_NORM], c.rms_norm_eps))


# Tests and quick runs: untied head, grouped-query attention (2 query heads per key/value head).
LLAMA_TINY = Llama(
    "llama-tiny",
    LlamaConfig(layers=2, hidden=128, heads=4, kv_heads=2, intermediate=352, vocab_size=2048, max_positions=512,
                tied=False),
)  # fmt: skip
# SmolLM2-135M's shape (HuggingFaceTB/SmolLM2-135M's config.json).
SMOLLM_135M = Llama(
    "smollm-135m",
    LlamaConfig(layers=30, hidden=576, heads=9, kv_heads=3, intermediate=1536, vocab_size=49152, max_positions=8192,
                rope_theta=100000.0, tied=True),
)  # fmt: skip
