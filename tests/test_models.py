"""Model descriptions and their PyTorch implementations: schemas, references, weight-map errors,
and oracles nobody here wrote (Hugging Face transformers, test environment only)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import numpy as np
import pytest
import torch
import transformers

from fwbench.frameworks.torch import bert as torch_bert
from fwbench.frameworks.torch import gpt2 as torch_gpt2
from fwbench.frameworks.torch import llama as torch_llama
from fwbench.frameworks.torch import mlp as torch_mlp
from fwbench.models import MODELS, get_model
from fwbench.models.base import ModelDescription
from fwbench.models.bert import Bert, BertConfig
from fwbench.models.gpt2 import GPT2
from fwbench.models.llama import Llama
from hf_oracles import hf_gpt2, hf_llama, load_state
from model_checks import reference_outputs

DISTIL_TINY = Bert("distilbert-tiny", BertConfig(layers=2, hidden=128, heads=2, intermediate=512, distil=True))
TORCH_BUILDERS: dict[str, Callable[..., torch.nn.Module]] = {
    "mlp": torch_mlp.build_model,
    "bert": torch_bert.build_model,
    "gpt2": torch_gpt2.build_model,
    "llama": torch_llama.build_model,
}
Module = TypeVar("Module", bound=torch.nn.Module)


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b))


def run_torch(
    description: ModelDescription, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    module = TORCH_BUILDERS[description.arch](description, weights, "cpu")
    with torch.inference_mode():
        outputs = module(*(torch.from_numpy(v) for v in inputs.values()))
    return dict(zip(description.output_names, (o.numpy() for o in outputs)))


def test_registry_and_hf_names() -> None:
    assert {
        "mlp",
        "bert-tiny",
        "bert-base",
        "distilbert-base",
        "gpt2-tiny",
        "gpt2",
        "llama-tiny",
        "smollm-135m",
        "resnet-tiny",
        "resnet50",
        "gemm",
    } == set(MODELS)
    names = {p.name: p.shape for p in get_model("bert-base").param_schema()}
    assert names["encoder.layer.11.attention.self.query.weight"] == (768, 768)
    assert names["encoder.layer.0.intermediate.dense.weight"] == (3072, 768)
    assert names["pooler.dense.bias"] == (768,)
    assert sum(int(np.prod(s)) for s in names.values()) == 109_482_240  # bert-base-uncased's BertModel
    distil = {p.name for p in get_model("distilbert-base").param_schema()}
    assert "transformer.layer.5.ffn.lin1.weight" in distil and not any("token_type" in n for n in distil)
    gpt2 = {p.name: p.shape for p in get_model("gpt2").param_schema()}
    assert gpt2["h.0.attn.c_attn.weight"] == (768, 2304)  # Conv1D (in, out)
    assert sum(int(np.prod(s)) for s in gpt2.values()) == 124_439_808  # GPT-2 small
    smollm = {p.name: p.shape for p in get_model("smollm-135m").param_schema()}
    assert smollm["model.layers.29.self_attn.k_proj.weight"] == (192, 576)  # 3 key/value heads of 64
    assert smollm["model.layers.0.mlp.gate_proj.weight"] == (1536, 576) and "lm_head.weight" not in smollm  # tied
    assert sum(int(np.prod(s)) for s in smollm.values()) == 134_515_008  # SmolLM2-135M
    assert "lm_head.weight" in {p.name for p in get_model("llama-tiny").param_schema()}  # untied


def test_weights_are_seeded_per_tensor_and_every_tensor_matters() -> None:
    d = get_model("bert-tiny")
    a, b = d.canonical_weights(0), d.canonical_weights(0)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["pooler.dense.weight"], d.canonical_weights(1)["pooler.dense.weight"])
    assert all(np.abs(v).max() > 0 for v in a.values())  # no all-zero bias hiding a mapping error
    assert np.allclose(a["embeddings.LayerNorm.weight"].mean(), 1.0, atol=0.01)


def test_text_inputs_pad_part_of_a_row() -> None:
    inputs = get_model("bert-tiny").make_inputs(3, 16, 0)
    assert inputs["attention_mask"][:2].all() and inputs["attention_mask"][2].sum() == 12
    assert inputs["token_type_ids"][:, :8].sum() == 0 and inputs["token_type_ids"][:, 8:].all()
    assert "token_type_ids" not in get_model("gpt2-tiny").make_inputs(1, 8, 0)


@pytest.mark.parametrize(
    "description",
    [get_model("mlp"), get_model("bert-tiny"), DISTIL_TINY, get_model("gpt2-tiny"), get_model("llama-tiny")],
    ids=lambda d: d.name,
)
def test_torch_matches_the_float64_reference(description: ModelDescription) -> None:
    weights = description.canonical_weights(0)
    batch, seq = description.parity_shape()
    inputs = description.make_inputs(batch, seq, 0)
    reference = reference_outputs(description, weights, inputs)
    outputs = run_torch(description, weights, inputs)
    for name in description.output_names:
        assert rel_l2(outputs[name], reference[name]) < 1e-5, name


def _hf_inputs(inputs: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(v.astype(np.int64)) for k, v in inputs.items()}


def _load_hf(model: Module, weights: dict[str, np.ndarray], prefix: str = "") -> Module:
    load_state(model, weights, prefix)
    return model.eval()


def test_oracle_bert_is_transformers_bertmodel() -> None:
    d = get_model("bert-tiny")
    assert isinstance(d, Bert)
    c = d.config
    hf = _load_hf(
        transformers.BertModel(
            transformers.BertConfig(
                vocab_size=c.vocab_size,
                hidden_size=c.hidden,
                num_hidden_layers=c.layers,
                num_attention_heads=c.heads,
                intermediate_size=c.intermediate,
                max_position_embeddings=c.max_positions,
            )
        ),
        d.canonical_weights(0),
    )
    inputs = d.make_inputs(3, 24, 0)
    with torch.no_grad():
        expected = hf(**_hf_inputs(inputs))
    ours = run_torch(d, d.canonical_weights(0), inputs)
    assert rel_l2(ours["last_hidden_state"], expected.last_hidden_state.numpy()) < 1e-5
    assert rel_l2(ours["pooler_output"], expected.pooler_output.numpy()) < 1e-5


def test_oracle_distilbert_is_transformers_distilbertmodel() -> None:
    c = DISTIL_TINY.config
    hf = _load_hf(
        transformers.DistilBertModel(
            transformers.DistilBertConfig(
                vocab_size=c.vocab_size, dim=c.hidden, n_layers=c.layers, n_heads=c.heads, hidden_dim=c.intermediate
            )
        ),
        DISTIL_TINY.canonical_weights(0),
    )
    inputs = DISTIL_TINY.make_inputs(3, 24, 0)
    with torch.no_grad():
        expected = hf(**_hf_inputs(inputs)).last_hidden_state.numpy()
    assert (
        rel_l2(run_torch(DISTIL_TINY, DISTIL_TINY.canonical_weights(0), inputs)["last_hidden_state"], expected) < 1e-5
    )


def test_oracle_gpt2_is_transformers_gpt2lmheadmodel() -> None:
    d = get_model("gpt2-tiny")
    assert isinstance(d, GPT2)
    hf = hf_gpt2(d, d.canonical_weights(0))
    inputs = d.make_inputs(3, 24, 0)
    with torch.no_grad():
        expected = hf(**_hf_inputs(inputs), output_hidden_states=True)
    ours = run_torch(d, d.canonical_weights(0), inputs)
    assert rel_l2(ours["last_hidden_state"], expected.hidden_states[-1].numpy()) < 1e-5
    assert rel_l2(ours["logits"], expected.logits.numpy()) < 1e-5


@pytest.mark.parametrize(("tied", "kv_heads"), [(False, 2), (True, 1)], ids=["untied-gqa", "tied-mqa"])
def test_oracle_llama_is_transformers_llamaforcausallm(tied: bool, kv_heads: int) -> None:
    """The float64 reference and torch's model against transformers' LlamaForCausalLM loaded by the same names:
    llama-tiny (untied head, two query heads per key/value head) and a tied variant with one key/value head and
    another rotary base. Padded positions are left out: Hugging Face fills a fully masked row differently."""
    from dataclasses import replace

    tiny = get_model("llama-tiny")
    assert isinstance(tiny, Llama)
    d = tiny if not tied else Llama("llama-tied", replace(tiny.config, tied=True, kv_heads=kv_heads, rope_theta=1e5))
    weights = d.canonical_weights(0)
    hf = hf_llama(d, weights)
    inputs = d.make_inputs(3, 24, 0)
    with torch.no_grad():
        expected = hf(**_hf_inputs(inputs), output_hidden_states=True)
    real = inputs["attention_mask"].astype(bool)
    reference = reference_outputs(d, weights, inputs)
    ours = run_torch(d, weights, inputs)
    for got in (reference, ours):
        assert rel_l2(got["last_hidden_state"][real], expected.hidden_states[-1].numpy()[real]) < 1e-5
        assert rel_l2(got["logits"][real], expected.logits.numpy()[real]) < 1e-5


@pytest.mark.parametrize(
    "description",
    [get_model("mlp"), get_model("bert-tiny"), get_model("gpt2-tiny"), get_model("llama-tiny")],
    ids=lambda d: d.name,
)
def test_weight_map_errors_are_clear(description: ModelDescription) -> None:
    weights = description.canonical_weights(0)
    first = next(iter(weights))
    missing = {k: v for k, v in weights.items() if k != first}
    with pytest.raises(ValueError, match=rf"missing \['{first}'\]"):
        description.check_weights(missing)
    with pytest.raises(ValueError, match=r"tensors unused \['extra.weight'\]"):
        TORCH_BUILDERS[description.arch](description, {**weights, "extra.weight": np.zeros(2, np.float32)}, "cpu")
    wrong = dict(weights)
    wrong[first] = np.zeros((3, 3), np.float32)
    with pytest.raises(ValueError, match=rf"{first}.*shape \(3, 3\)"):
        description.check_weights(wrong)
    with pytest.raises(ValueError, match=rf"{first}.*shape \(3, 3\)"):
        TORCH_BUILDERS[description.arch](description, wrong, "cpu")


def test_flops() -> None:
    smollm = get_model("smollm-135m")  # 4·S·H² + 4·S·H·Hkv + 6·S·H·I + 4·S²·H per layer, and the head
    per_layer = 4 * 128 * 576**2 + 4 * 128 * 576 * 192 + 6 * 128 * 576 * 1536 + 4 * 128**2 * 576
    assert smollm.forward_flops(2, 128) == 2 * (30 * per_layer + 2 * 128 * 576 * 49152)
    gpt2 = get_model("gpt2")
    # 2·params·tokens for the matmuls (embeddings excluded), plus attention and the LM head
    assert (
        gpt2.forward_flops(1, 128)
        == 12 * (8 * 128 * 768**2 + 4 * 128 * 768 * 3072 + 4 * 128**2 * 768) + 2 * 128 * 768 * 50257
    )
    assert gpt2.training_forward_flops(8, 128) == 8 * gpt2.forward_flops(1, 128)  # it trains through its LM head
    bert = get_model("bert-base")
    encoder = 12 * (8 * 128 * 768**2 + 4 * 128 * 768 * 3072 + 4 * 128**2 * 768)
    assert bert.forward_flops(1, 128) == encoder + 2 * 768**2  # + the pooler
    assert bert.training_forward_flops(1, 128) == encoder + 2 * 128 * 768 * 30522  # + the tied MLM logits, no pooler


@pytest.mark.parametrize(
    "description", [get_model("bert-tiny"), DISTIL_TINY, get_model("gpt2-tiny")], ids=lambda d: d.name
)
def test_torch_uses_the_right_gelu(description: ModelDescription) -> None:
    from model_checks import GELU_TOLERANCE, amplified_weights, gelu_swap_error

    weights = amplified_weights(description)
    inputs = description.make_inputs(*description.parity_shape(), 0)
    assert gelu_swap_error(description, weights, inputs) > 4 * GELU_TOLERANCE  # the check below can see a swap
    reference = reference_outputs(description, weights, inputs)
    outputs = run_torch(description, weights, inputs)
    for name in description.output_names:
        assert rel_l2(outputs[name], reference[name]) < GELU_TOLERANCE, name


def test_a_missing_implementation_is_reported_without_importing_anything() -> None:
    from fwbench.frameworks import get_runtime, missing_implementation

    assert missing_implementation(get_runtime("torch:eager"), "bert") is None
    assert missing_implementation(get_runtime("jax:jit"), "nosucharch") == "no jax implementation of nosucharch yet"


def test_the_registry_states_each_runtimes_capabilities() -> None:
    """Native runtimes, pip extras, dtypes and start-up/compile estimates come from the registry, so the
    planner can skip impossible cells and the install hint names the right extras."""
    from fwbench.frameworks import dtype_unsupported, get_runtime, native_runtime, native_runtimes, runtimes

    assert native_runtimes() == ("torch:eager", "tensorflow:function", "jax:jit")
    assert native_runtime("keras") is None and native_runtime("jax") == "jax:jit"
    assert get_runtime("torch:lightning").install_hint == "pip install 'fwbench[torch,lightning]'"
    assert get_runtime("keras:jax").install_hint == "pip install 'fwbench[keras,jax]'"
    assert get_runtime("tensorflow:xla").install_hint == "pip install 'fwbench[tensorflow]'"
    eager = get_runtime("torch:eager")
    assert dtype_unsupported(eager, "bf16") is None
    assert dtype_unsupported(eager, "int8") == "torch:eager cannot compute in int8 (it computes in fp32, bf16)"
    compile_s = {name: info.compile_s for name, info in runtimes().items() if info.framework != "fake"}
    assert compile_s["torch:compile"] > compile_s["tensorflow:xla"] > compile_s["jax:jit"] > compile_s["torch:eager"]
    assert get_runtime("tensorflow:eager").startup_s > get_runtime("torch:eager").startup_s


def test_a_backend_is_refused_a_dtype_its_registry_record_does_not_list() -> None:
    """The registry record is the one place a runtime's dtypes are decided: create_backend refuses any other before
    the backend module (and its framework) is imported."""
    from fwbench.frameworks import create_backend
    from fwbench.frameworks.base import UnsupportedDtype
    from fwbench.spec import Settings

    with pytest.raises(UnsupportedDtype, match=r"^openvino:torch cannot compute in bf16 \(it computes in fp32\)$"):
        create_backend("openvino:torch", "cpu", Settings(), dtype="bf16")


def test_the_frozen_tensors_are_the_descriptions_found_through_the_weight_map() -> None:
    """torch: the parameters a description's frozen canonical tensors were loaded into (no name prefixes
    kept per framework)."""
    from fwbench.frameworks.torch import bert
    from fwbench.frameworks.torch.weights import variable_names

    description = get_model("bert-tiny")
    assert isinstance(description, Bert)
    module = bert.build_model(description, description.canonical_weights(0), "cpu")
    assert variable_names(module, description.frozen_in_training()) == {"pooler.weight", "pooler.bias"}
    with pytest.raises(ValueError, match="not in its weight map"):
        variable_names(module, ("no.such.tensor",))
