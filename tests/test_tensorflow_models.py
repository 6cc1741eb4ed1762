"""The TensorFlow implementations (tf.Module + tf ops): parity with the float64 references, eager and
under tf.function, weight-map errors, and one cell end to end through a worker (the matrix's, ``make test-matrix``:
``make test`` runs tensorflow:function's worker in tests/test_diff.py (resnet-tiny, the MLP's training step) and
tests/test_training.py)."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import tensorflow as tf

from fwbench.models import get_model
from fwbench.models.base import ModelDescription
from fwbench.models.bert import Bert, BertConfig
from fwbench.runner.manager import run_worker
from fwbench.spec import Case, Settings
from model_checks import reference_outputs

DISTIL_TINY = Bert("distilbert-tiny", BertConfig(layers=2, hidden=128, heads=2, intermediate=512, distil=True))
TEXT = [get_model("bert-tiny"), DISTIL_TINY, get_model("gpt2-tiny")]  # the GELU models
DESCRIPTIONS = [get_model("mlp"), *TEXT, get_model("llama-tiny")]


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b))


def build(description: ModelDescription, weights: dict[str, np.ndarray]) -> tf.Module:
    return importlib.import_module(f"fwbench.frameworks.tensorflow.{description.arch}").build_model(
        description, weights, "cpu"
    )


def by_name(description: ModelDescription) -> str:
    return description.name


@pytest.fixture(scope="module", params=DESCRIPTIONS, ids=by_name)
def built(request: pytest.FixtureRequest) -> tuple[ModelDescription, dict[str, np.ndarray], tf.Module]:
    description = request.param
    weights = description.canonical_weights(0)
    return description, weights, build(description, weights)


def check_outputs(
    description: ModelDescription, outputs: tuple[tf.Tensor, ...], expected: dict[str, np.ndarray]
) -> None:
    assert isinstance(outputs, tuple) and len(outputs) == len(description.output_names)
    for name, output in zip(description.output_names, outputs):
        assert output.dtype == tf.float32 and tuple(output.shape) == expected[name].shape, name
        assert rel_l2(output.numpy(), expected[name]) < 1e-5, name


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_outputs_match_the_reference(
    built: tuple[ModelDescription, dict[str, np.ndarray], tf.Module], mode: str
) -> None:
    description, weights, module = built
    arrays = description.make_inputs(*description.parity_shape(), seed=0)
    inputs = [tf.constant(a) for a in arrays.values()]
    call = module.__call__
    if mode == "function":  # what tensorflow:function does: one signature with this cell's fixed shapes
        call = tf.function(call, input_signature=[tf.TensorSpec(t.shape, t.dtype) for t in inputs])
    check_outputs(description, call(*inputs), reference_outputs(description, weights, arrays))


@pytest.mark.parametrize("description", [get_model(n) for n in ("bert-tiny", "gpt2-tiny", "llama-tiny")], ids=by_name)
def test_shapes_are_not_hard_coded(description: ModelDescription) -> None:
    """One trace with unknown batch and sequence sizes serves two different shapes."""
    weights = description.canonical_weights(0)
    module = build(description, weights)
    count = len(description.make_inputs(1, 4, 0))
    call = tf.function(module.__call__, input_signature=[tf.TensorSpec([None, None], tf.int32)] * count)
    for batch_size, seq_len in ((2, 16), (3, 7)):
        arrays = description.make_inputs(batch_size, seq_len, 0)
        check_outputs(
            description,
            call(*(tf.constant(a) for a in arrays.values())),
            reference_outputs(description, weights, arrays),
        )
    assert call.experimental_get_tracing_count() == 1


@pytest.mark.parametrize("description", [get_model(n) for n in ("bert-tiny", "gpt2-tiny", "llama-tiny")], ids=by_name)
def test_masked_keys_are_ignored(description: ModelDescription) -> None:
    """Tokens whose attention_mask is 0 (here in the middle of a row) change no other position's output."""
    weights = description.canonical_weights(0)
    module = build(description, weights)
    arrays = description.make_inputs(2, 8, 0)
    arrays["attention_mask"][:] = 1
    arrays["attention_mask"][:, 2:4] = 0
    changed = {k: v.copy() for k, v in arrays.items()}
    changed["input_ids"][:, 2:4] = (changed["input_ids"][:, 2:4] + 1) % 100
    outputs = module(*(tf.constant(v) for v in arrays.values()))
    check_outputs(description, outputs, reference_outputs(description, weights, arrays))
    a = outputs[0].numpy()
    b = module(*(tf.constant(v) for v in changed.values()))[0].numpy()
    others = [0, 1, 4, 5, 6, 7]
    np.testing.assert_allclose(a[:, others], b[:, others], rtol=1e-5, atol=1e-5)
    assert not np.allclose(a[:, 2:4], b[:, 2:4])


@pytest.mark.parametrize("description", TEXT, ids=by_name)
def test_tensorflow_uses_the_right_gelu(description: ModelDescription) -> None:
    from model_checks import GELU_TOLERANCE, amplified_weights, gelu_swap_error

    weights = amplified_weights(description)
    arrays = description.make_inputs(*description.parity_shape(), 0)
    assert gelu_swap_error(description, weights, arrays) > 4 * GELU_TOLERANCE  # the check below can see a swap
    reference = reference_outputs(description, weights, arrays)
    outputs = build(description, weights)(*(tf.constant(a) for a in arrays.values()))
    for name, output in zip(description.output_names, outputs):
        assert rel_l2(output.numpy(), reference[name]) < GELU_TOLERANCE, name


def a_layer_tensor(description: ModelDescription) -> str:
    """A tensor of the last layer (for BERT, one of the three fused into the QKV kernel)."""
    if description.arch == "bert":
        assert isinstance(description, Bert)
        return description.param("key", description.config.layers - 1)
    if description.arch == "gpt2":
        return "h.1.attn.c_attn.weight"
    if description.arch == "llama":
        return "model.layers.1.self_attn.k_proj.weight"
    return list(description.canonical_weights(0))[-2]  # the MLP's last weight


@pytest.mark.parametrize("description", DESCRIPTIONS[1:], ids=by_name)
def test_a_missing_tensor_is_named(description: ModelDescription) -> None:
    weights = description.canonical_weights(0)
    for name in (next(iter(weights)), a_layer_tensor(description)):
        with pytest.raises(ValueError, match=rf"tensor {name} missing"):
            build(description, {k: v for k, v in weights.items() if k != name})


@pytest.mark.parametrize("description", DESCRIPTIONS, ids=by_name)
def test_an_unused_tensor_is_named(description: ModelDescription) -> None:
    weights = {**description.canonical_weights(0), "extra.weight": np.zeros(2, np.float32)}
    with pytest.raises(ValueError, match=r"tensors unused \['extra.weight'\]"):
        build(description, weights)


@pytest.mark.parametrize("description", DESCRIPTIONS, ids=by_name)
def test_a_wrong_shape_is_named(description: ModelDescription) -> None:
    weights = description.canonical_weights(0)
    for name in (next(iter(weights)), a_layer_tensor(description)):
        with pytest.raises(ValueError, match=rf"{name}: shape \(3, 3\)"):
            build(description, {**weights, name: np.zeros((3, 3), np.float32)})


@pytest.mark.matrix
def test_bert_in_a_worker_passes_parity() -> None:
    outcome = run_worker(
        Case("bert-tiny", "tensorflow:function", batch_size=2, seq_len=16), Settings(threads=1, max_time_s=0.3)
    )
    assert outcome.status == "ok", outcome.reason
    assert outcome.details["parity"]["ok"] is True
    assert outcome.samples and outcome.fields["median_s"] > 0
