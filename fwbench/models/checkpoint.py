"""A local Hugging Face checkpoint directory as a model (``--weights DIR``): its ``config.json`` read into a GPT-2 or
Llama-layout description named after the directory, its safetensors weights by their Hugging Face names into the
canonical ones. No hub, no transformers: json and safetensors only. A config fwbench cannot build is refused in one
line naming the field (:class:`fwbench.spec.SpecError`).

A run registers the directory in its own process (:func:`register_checkpoint`) and names it in
``$FWBENCH_CHECKPOINTS`` (os.pathsep-separated), so each worker it starts registers the same model before it looks
the name up (:func:`register_named_checkpoints`, called with the plugins).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError, deserialize

from fwbench.models.base import ModelDescription
from fwbench.models.decoder import CausalDecoder
from fwbench.models.gpt2 import GPT2, GPT2Config
from fwbench.models.llama import Llama, LlamaConfig
from fwbench.spec import SpecError

CHECKPOINTS_ENV = "FWBENCH_CHECKPOINTS"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"  # a checkpoint sharded over several safetensors files
LLAMA_TYPES = ("llama", "mistral")  # the Llama layout without biases; Qwen2's q/k/v biases are not in it
# Buffers some checkpoints carry beside the parameters (GPT-2's causal mask, Llama's rotary frequencies): not weights.
BUFFER_SUFFIXES = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")


def is_checkpoint_dir(path: Path) -> bool:
    """A directory (``--weights DIR``), as against a safetensors file."""
    return path.is_dir()


def read_config(folder: Path) -> dict[str, Any]:
    """The directory's config.json; SpecError when it is missing or not a JSON object."""
    path = folder / CONFIG_FILE
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SpecError(f"--weights {folder}: cannot read {CONFIG_FILE}: {exc}") from None
    if not isinstance(config, dict):
        raise SpecError(f"--weights {folder}: {CONFIG_FILE} is not a JSON object")
    return config


def _field(config: dict[str, Any], folder: Path, *names: str, default: Any = None) -> Any:
    """The first of ``names`` the config has (Hugging Face spells one setting several ways), else ``default``;
    SpecError when there is no default."""
    for name in names:
        if config.get(name) is not None:
            return config[name]
    if default is None:
        raise SpecError(f"--weights {folder}: {CONFIG_FILE} has no {names[0]}")
    return default


def _refuse(folder: Path, why: str) -> SpecError:
    return SpecError(f"--weights {folder}: fwbench cannot build this model: {why}")


def gpt2_config(config: dict[str, Any], folder: Path) -> GPT2Config:
    """GPT2LMHeadModel's config as fwbench's GPT-2 (tanh GELU, 4 × hidden feed-forward, tied head)."""
    hidden, layers = int(_field(config, folder, "n_embd")), int(_field(config, folder, "n_layer"))
    inner = config.get("n_inner")
    if inner is not None and int(inner) != 4 * hidden:
        raise _refuse(folder, f"n_inner {inner} is not 4 × n_embd ({4 * hidden})")
    activation = config.get("activation_function", "gelu_new")
    if activation not in ("gelu_new", "gelu_pytorch_tanh"):
        raise _refuse(folder, f"activation_function {activation!r} (fwbench's GPT-2 uses the tanh GELU, gelu_new)")
    for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention"):
        if config.get(flag):
            raise _refuse(folder, f"{flag} is set")
    if config.get("scale_attn_weights") is False:
        raise _refuse(folder, "scale_attn_weights is false")
    return GPT2Config(
        layers=layers,
        hidden=hidden,
        heads=int(_field(config, folder, "n_head")),
        vocab_size=int(_field(config, folder, "vocab_size")),
        max_positions=int(_field(config, folder, "n_positions", "n_ctx")),
        layer_norm_eps=float(_field(config, folder, "layer_norm_epsilon", default=1e-5)),
    )


def llama_config(config: dict[str, Any], folder: Path) -> LlamaConfig:
    """LlamaForCausalLM's (or Mistral's) config as fwbench's Llama layout: SiLU, no biases, no rotary scaling."""
    hidden, heads = int(_field(config, folder, "hidden_size")), int(_field(config, folder, "num_attention_heads"))
    if config.get("hidden_act", "silu") != "silu":
        raise _refuse(folder, f"hidden_act {config['hidden_act']!r} (the Llama layout's SwiGLU uses silu)")
    for flag in ("attention_bias", "mlp_bias"):
        if config.get(flag):
            raise _refuse(folder, f"{flag} is set (the Llama layout has no biases)")
    if config.get("rope_scaling"):
        raise _refuse(folder, f"rope_scaling {config['rope_scaling']} (plain rotary positions only)")
    head_dim = config.get("head_dim")
    if head_dim is not None and int(head_dim) != hidden // heads:
        raise _refuse(folder, f"head_dim {head_dim} is not hidden_size / num_attention_heads ({hidden // heads})")
    window, positions = config.get("sliding_window"), int(_field(config, folder, "max_position_embeddings"))
    if window is not None and int(window) < positions:
        raise _refuse(folder, f"sliding_window {window} (full attention only)")
    try:
        return LlamaConfig(
            layers=int(_field(config, folder, "num_hidden_layers")),
            hidden=hidden,
            heads=heads,
            kv_heads=int(_field(config, folder, "num_key_value_heads", default=heads)),
            intermediate=int(_field(config, folder, "intermediate_size")),
            vocab_size=int(_field(config, folder, "vocab_size")),
            max_positions=positions,
            rms_norm_eps=float(_field(config, folder, "rms_norm_eps", default=1e-6)),
            rope_theta=float(_field(config, folder, "rope_theta", default=10000.0)),
            tied=bool(config.get("tie_word_embeddings", False)),
        )
    except SpecError as exc:
        raise _refuse(folder, str(exc)) from None


def describe_checkpoint(folder: Path) -> CausalDecoder:
    """The description of the checkpoint in ``folder``, named after the directory; SpecError (one line) for a model
    type or setting fwbench cannot build."""
    config = read_config(folder)
    model_type = config.get("model_type")
    name = folder.resolve().name
    if model_type == "gpt2":
        return GPT2(name, gpt2_config(config, folder))
    if model_type in LLAMA_TYPES:
        return Llama(name, llama_config(config, folder))
    known = ", ".join(("gpt2", *LLAMA_TYPES))
    raise _refuse(folder, f"model_type {model_type!r} (fwbench builds {known})")


def checkpoint_files(folder: Path) -> list[Path]:
    """The safetensors files of the checkpoint: model.safetensors, or the shards its index names."""
    single, index = folder / WEIGHTS_FILE, folder / INDEX_FILE
    if single.exists():
        return [single]
    if index.exists():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"cannot read {index}: {exc}") from None
        return [folder / shard for shard in shards]
    raise ValueError(f"{folder} has neither {WEIGHTS_FILE} nor {INDEX_FILE}")


FLOAT_TYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16}


def read_float32(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file as float32, by name: F64, F32, F16 and BF16 (how most checkpoints are
    published; numpy has no bfloat16, so its 16 bits are widened to a float32's upper half, exactly)."""
    try:
        views = deserialize(path.read_bytes())
    except (OSError, SafetensorError) as exc:
        raise ValueError(f"cannot read weights {path}: {exc}") from None
    tensors = {}
    for name, view in views:
        dtype, shape, data = view["dtype"], view["shape"], view["data"]
        if dtype == "BF16":
            widened = np.frombuffer(data, dtype=np.uint16).astype(np.uint32) << 16
            tensors[name] = widened.view(np.float32).reshape(shape)
        elif dtype in FLOAT_TYPES:
            tensors[name] = np.frombuffer(data, dtype=FLOAT_TYPES[dtype]).reshape(shape).astype(np.float32)
        else:
            raise ValueError(f"weights {path}: tensor {name} is {dtype}, not a float type")
    return tensors


def canonical_name(description: ModelDescription, name: str) -> str:
    """A Hugging Face tensor name as the description's canonical one (GPT2LMHeadModel's ``transformer.`` prefix
    dropped; LlamaForCausalLM's names are the canonical ones)."""
    return name.removeprefix("transformer.") if isinstance(description, GPT2) else name


def load_checkpoint_weights(description: ModelDescription, folder: Path) -> dict[str, np.ndarray]:
    """Float32 canonical weights from the checkpoint's safetensors (any float dtype), buffers dropped, a tied LM head
    saved beside its embedding dropped; ValueError naming the directory on any mismatch with the schema."""
    weights: dict[str, np.ndarray] = {}
    for path in checkpoint_files(folder):
        for name, value in read_float32(path).items():
            if not name.endswith(BUFFER_SUFFIXES):
                weights[canonical_name(description, name)] = value
    schema = {spec.name for spec in description.param_schema()}
    if "lm_head.weight" in weights and "lm_head.weight" not in schema:  # a tied head written out as well
        weights.pop("lm_head.weight")
    try:
        description.check_weights(weights)
    except ValueError as exc:
        raise ValueError(f"weights in {folder} do not fit {description.name}: {exc}") from None
    return weights


def named_checkpoints() -> list[Path]:
    """The checkpoint directories ``$FWBENCH_CHECKPOINTS`` names."""
    return [Path(p) for p in os.environ.get(CHECKPOINTS_ENV, "").split(os.pathsep) if p]
