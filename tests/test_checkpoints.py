"""``--weights DIR``: a local Hugging Face checkpoint directory written by transformers' ``save_pretrained`` (GPT-2 and
the Llama layout, float32 and bfloat16 files) runs as the model named after the directory, its tokens the ones
transformers generates from it; a config fwbench cannot build is refused in one line."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers

from conftest import fwbench_here, run_args
from fwbench.models import MODELS, get_model
from fwbench.models.checkpoint import CHECKPOINTS_ENV
from fwbench.models.decoder import CausalDecoder
from fwbench.models.generation import prompt_ids
from fwbench.store import Store

PROMPT, NEW = 8, 5


@pytest.fixture
def registrations(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The models and $FWBENCH_CHECKPOINTS a test's in-process run registers, undone after it (setenv, not delenv:
    pytest restores only a variable it saw set)."""
    monkeypatch.setenv(CHECKPOINTS_ENV, "")
    before = set(MODELS)
    yield
    for name in set(MODELS) - before:
        del MODELS[name]


def gpt2_model() -> transformers.PreTrainedModel:
    config = transformers.GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=2,
                                     initializer_range=0.3)  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


def llama_model() -> transformers.PreTrainedModel:
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False, initializer_range=0.3,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


def written(
    folder: Path, make: Callable[[], transformers.PreTrainedModel], dtype: torch.dtype, shard: str = "5GB"
) -> Path:
    """``make()``'s model, seeded, written by ``save_pretrained`` in ``dtype`` (safetensors, shards of at most
    ``shard``) to ``folder``."""
    torch.manual_seed(0)
    model = make()
    model.to(dtype)  # type: ignore[arg-type]  # in place; transformers types .to without a dtype
    model.save_pretrained(folder, safe_serialization=True, max_shard_size=shard)
    return folder


def transformers_greedy(folder: Path, prompt: np.ndarray) -> np.ndarray:
    """transformers' own greedy generation (its key/value cache, float32) from the directory: (batch, NEW)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    ids = torch.from_numpy(prompt.astype(np.int64))
    greedy = transformers.GenerationConfig(
        max_new_tokens=NEW, do_sample=False, use_cache=True, eos_token_id=None, pad_token_id=0
    )
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=greedy)
    return np.asarray(out[:, PROMPT:].numpy())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("make", "dtype", "shard", "name"),
    [
        (gpt2_model, torch.float32, "5GB", "tiny-gpt2-hf"),
        (llama_model, torch.bfloat16, "100KB", "tiny-llama-hf-bf16"),  # sharded: model.safetensors.index.json
    ],
    ids=["gpt2-float32", "llama-bfloat16-sharded"],
)
def test_a_checkpoint_directory_generates_what_transformers_generates_from_it(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    registrations: None,
    make: Callable[[], transformers.PreTrainedModel],
    dtype: torch.dtype,
    shard: str,
    name: str,
) -> None:
    folder = written(tmp_path / name, make, dtype, shard)
    assert (folder / "model.safetensors.index.json").exists() == (shard != "5GB")
    db = tmp_path / "r.db"
    flags = ("--phase", "generate", "--weights", str(folder), "--runtimes", "torch:eager")  # no --models: the folder's
    code, out, err = fwbench_here(
        capsys, *run_args(*flags, "--batch-sizes", "2", "--prompt-lens", str(PROMPT), "--new-tokens", str(NEW), db=db)
    )
    assert code == 0, err
    with Store.open(db, readonly=True) as store:
        (row,) = store.results()
    assert row.model == name and row.status == "ok", row.reason  # ok: every token checked against float64
    description = get_model(name)
    assert isinstance(description, CausalDecoder)
    expected = transformers_greedy(folder, prompt_ids(description, 2, PROMPT, 0))
    np.testing.assert_array_equal(np.array(row.details["generation"]["tokens"]), expected)


def edited(folder: Path, **changes: Any) -> Path:
    """The checkpoint's config.json with ``changes`` (None: the key removed)."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(
    ("make", "changes", "message"),
    [
        (gpt2_model, {"model_type": "bert"}, "fwbench cannot build this model: model_type 'bert'"),
        (gpt2_model, {"n_inner": 100}, "n_inner 100 is not 4 × n_embd (256)"),
        (gpt2_model, {"n_embd": None}, "config.json has no n_embd"),
        (llama_model, {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling"),
        (llama_model, {"attention_bias": True}, "attention_bias is set"),
        (llama_model, {"num_key_value_heads": 3}, "4 attention heads are not divisible by 3 key/value heads"),
        (llama_model, {"intermediate_size": 128}, "do not fit"),  # the config's shapes against the weights'
    ],
    ids=["model-type", "n-inner", "missing-field", "rope-scaling", "bias", "kv-heads", "shapes"],
)
def test_a_checkpoint_fwbench_cannot_build_is_refused_in_one_line(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    registrations: None,
    make: Callable[[], transformers.PreTrainedModel],
    changes: dict[str, Any],
    message: str,
) -> None:
    folder = edited(written(tmp_path / "checkpoint", make, torch.float32), **changes)
    args = run_args("--phase", "generate", "--weights", str(folder), "--runtimes", "torch:eager", db=tmp_path / "r.db")
    code, _, err = fwbench_here(capsys, *args, "--prompt-lens", "8")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0 and len(lines) == 1 and message in lines[0], err


def test_a_directory_without_a_config_or_weights_or_named_after_another_model_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, registrations: None
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    no_weights = written(tmp_path / "no-weights", gpt2_model, torch.float32)
    (no_weights / "model.safetensors").unlink()
    taken = written(tmp_path / "gpt2-tiny", gpt2_model, torch.float32)  # fwbench's own gpt2-tiny has another shape
    for folder, message in (
        (empty, "cannot read config.json"),
        (no_weights, "has neither model.safetensors nor model.safetensors.index.json"),
        (taken, "the directory's name 'gpt2-tiny' is another model's"),
    ):
        args = run_args("--phase", "generate", "--weights", str(folder), "--runtimes", "torch:eager", db=tmp_path / "r")
        code, _, err = fwbench_here(capsys, *args, "--prompt-lens", "8")
        lines = [line for line in err.splitlines() if line.strip()]
        assert code != 0 and len(lines) == 1 and message in lines[0], (folder, err)
