"""Hugging Face transformers' decoders (test environment only) loaded with our canonical weights by their own names:
the oracles nobody here wrote, for the model tests and the generation tests."""

from __future__ import annotations

import numpy as np
import torch
import transformers

from fwbench.models.decoder import CausalDecoder
from fwbench.models.gpt2 import GPT2
from fwbench.models.llama import Llama


def load_state(model: torch.nn.Module, weights: dict[str, np.ndarray], prefix: str = "") -> None:
    """``weights`` into ``model`` by name (``prefix`` added); every weight used, only a tied LM head left out."""
    missing, unexpected = model.load_state_dict(
        {prefix + k: torch.from_numpy(v) for k, v in weights.items()}, strict=False
    )
    assert not unexpected and not [m for m in missing if not m.endswith("lm_head.weight")], (missing, unexpected)


def hf_gpt2(description: GPT2, weights: dict[str, np.ndarray]) -> transformers.GPT2LMHeadModel:
    """transformers' GPT2LMHeadModel of ``description``'s shape with ``weights`` (LM head tied), in eval mode."""
    c = description.config
    model = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            vocab_size=c.vocab_size, n_positions=c.max_positions, n_embd=c.hidden, n_layer=c.layers, n_head=c.heads
        )
    )
    load_state(model, weights, prefix="transformer.")
    model.tie_weights()
    return model.eval()


def hf_llama(description: Llama, weights: dict[str, np.ndarray]) -> transformers.LlamaForCausalLM:
    """transformers' LlamaForCausalLM of ``description``'s shape with ``weights`` (tied or not), in eval mode."""
    c = description.config
    config = transformers.LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden, intermediate_size=c.intermediate, num_hidden_layers=c.layers,
        num_attention_heads=c.heads, num_key_value_heads=c.kv_heads, max_position_embeddings=c.max_positions,
        rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta, tie_word_embeddings=c.tied,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=False)
    assert not unexpected and missing == (["lm_head.weight"] if c.tied else []), (missing, unexpected)
    model.tie_weights()
    return model.eval()


def hf_causal_lm(description: CausalDecoder, weights: dict[str, np.ndarray]) -> transformers.PreTrainedModel:
    """The transformers model of a GPT-2 or Llama-layout description."""
    if isinstance(description, GPT2):
        return hf_gpt2(description, weights)
    assert isinstance(description, Llama), description.name
    return hf_llama(description, weights)
