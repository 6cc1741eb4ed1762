"""GPT-2: causal pre-LN transformer decoder, tanh GELU, LayerNorm eps 1e-5, tied LM head.

Parameter names and layouts are Hugging Face transformers' ``GPT2Model`` state dict. Its linear
layers are ``Conv1D``: weights are (in, out), unlike BERT's (out, in); ``attn.c_attn`` packs Q, K, V
along the output axis. The LM head is the token embedding, transposed (``logits = h @ wte.T``).
Inputs: input_ids, attention_mask, each (batch, seq) int32; positions are 0..seq-1.
Outputs: ``last_hidden_state`` (batch, seq, hidden) and ``logits`` (batch, seq, vocab).
Training: causal LM cross-entropy of ``logits``, position t against input_ids[t + 1] (text.next_token_targets).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fwbench.models.base import ParamSpec, normal_weights
from fwbench.models.checkpoints import Taps, tap
from fwbench.models.decoder import CausalDecoder
from fwbench.models.text import attention, gelu_tanh, layer_norm, transformer_layer_flops
from fwbench.spec import SpecError


@dataclass(frozen=True)
class GPT2Config:
    layers: int
    hidden: int
    heads: int
    vocab_size: int = 50257
    max_positions: int = 1024
    layer_norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        if self.hidden % self.heads:
            raise SpecError(f"hidden size {self.hidden} is not divisible by {self.heads} heads")

    @property
    def intermediate(self) -> int:
        return 4 * self.hidden


# Per-layer tensors: suffix -> shape as a function of (hidden, intermediate); Conv1D (in, out) layout.
_LAYER_TENSORS = {
    "ln_1.weight": lambda h, i: (h,),
    "ln_1.bias": lambda h, i: (h,),
    "attn.c_attn.weight": lambda h, i: (h, 3 * h),
    "attn.c_attn.bias": lambda h, i: (3 * h,),
    "attn.c_proj.weight": lambda h, i: (h, h),
    "attn.c_proj.bias": lambda h, i: (h,),
    "ln_2.weight": lambda h, i: (h,),
    "ln_2.bias": lambda h, i: (h,),
    "mlp.c_fc.weight": lambda h, i: (h, i),
    "mlp.c_fc.bias": lambda h, i: (i,),
    "mlp.c_proj.weight": lambda h, i: (i, h),
    "mlp.c_proj.bias": lambda h, i: (h,),
}
LAYER_SUFFIXES = tuple(_LAYER_TENSORS)


class GPT2(CausalDecoder):
    arch = "gpt2"
    config: GPT2Config

    def gathered_tables(self) -> tuple[str, ...]:
        return ("wte.weight", "wpe.weight")

    def cache_width(self) -> int:
        return self.config.hidden

    def head_name(self) -> str:
        """The tied LM head: the token embedding."""
        return "wte.weight"

    def param_schema(self) -> list[ParamSpec]:
        c = self.config
        specs = [
            ParamSpec("wte.weight", (c.vocab_size, c.hidden)),
            ParamSpec("wpe.weight", (c.max_positions, c.hidden)),
        ]
        for layer in range(c.layers):
            specs += [
                ParamSpec(f"h.{layer}.{suffix}", shape(c.hidden, c.intermediate))
                for suffix, shape in _LAYER_TENSORS.items()
            ]
        specs += [ParamSpec("ln_f.weight", (c.hidden,)), ParamSpec("ln_f.bias", (c.hidden,))]
        return specs

    def canonical_weights(self, seed: int = 0) -> dict[str, np.ndarray]:
        return normal_weights(self.param_schema(), seed)

    def attention_flops(self, batch_size: int, seq_len: int | None) -> int:
        """Attention's scores and context matmuls: 4·S²·H per layer and sample."""
        s = seq_len or 1
        return batch_size * self.config.layers * 4 * s * s * self.config.hidden

    def forward_flops(self, batch_size: int, seq_len: int | None) -> int:
        """Matmul FLOPs: per layer 8·S·H² + 4·S·H·I + 4·S²·H, plus the LM head 2·S·H·V (inference and training
        both run it)."""
        c, s = self.config, seq_len or 1
        per_layer = transformer_layer_flops(s, c.hidden, c.intermediate)
        return batch_size * (c.layers * per_layer + 2 * s * c.hidden * c.vocab_size)

    def checkpoint_names(self) -> tuple[str, ...]:
        """``embeddings`` (tokens + positions), per layer ``h.{i}.attn`` and ``h.{i}.mlp`` (each block's output
        before its residual sum) and ``h.{i}`` (the layer's output), then ``ln_f`` (the last hidden state)."""
        layers = [f"h.{i}{part}" for i in range(self.config.layers) for part in (".attn", ".mlp", "")]
        return ("embeddings", *layers, "ln_f")

    def reference_hidden(
        self, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray], taps: Taps = None
    ) -> np.ndarray:
        """The float64 last hidden state (batch, seq, hidden), after ln_f."""
        c = self.config
        w = {name: value.astype(np.float64) for name, value in weights.items()}
        ids = inputs["input_ids"]
        seq = ids.shape[1]
        x = tap(taps, "embeddings", w["wte.weight"][ids] + w["wpe.weight"][np.arange(seq)])
        causal = np.tril(np.ones((seq, seq), dtype=bool))
        allowed = causal[None] & inputs["attention_mask"].astype(bool)[:, None, :]  # (B, S, S)
        for layer in range(c.layers):
            p = f"h.{layer}."
            a = layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"], c.layer_norm_eps)
            q, k, v = np.split(a @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"], 3, axis=-1)
            a = attention(q, k, v, c.heads, allowed) @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
            x = x + tap(taps, f"h.{layer}.attn", a)
            m = layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"], c.layer_norm_eps)
            m = gelu_tanh(m @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
            x = tap(
                taps,
                f"h.{layer}",
                x + tap(taps, f"h.{layer}.mlp", m @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]),
            )
        return tap(taps, "ln_f", layer_norm(x, w["ln_f.weight"], w["ln_f.bias"], c.layer_norm_eps))


GPT2_TINY = GPT2("gpt2-tiny", GPT2Config(layers=2, hidden=128, heads=2))
GPT2_SMALL = GPT2("gpt2", GPT2Config(layers=12, hidden=768, heads=12))
