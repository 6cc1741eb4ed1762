"""ResNet in TensorFlow (eager and tf.function) and JAX (jax.jit): parity of resnet-tiny with the
float64 reference, weight-map errors, every canonical tensor used once, and one worker cell each (the worker cells,
and resnet50 in all three modes, are the matrix's: ``make test-matrix``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

from fwbench.frameworks.jax import resnet as jax_resnet
from fwbench.frameworks.tensorflow import resnet as tf_resnet
from fwbench.models import get_model
from fwbench.models.resnet import ResNet
from fwbench.runner.manager import run_worker
from fwbench.spec import Case, Settings


def resnet(name: str) -> ResNet:
    """The registered ResNet description ``name``."""
    description = get_model(name)
    assert isinstance(description, ResNet)
    return description


TINY = resnet("resnet-tiny")
TOLERANCE = 1e-5
BUILDERS: dict[str, Callable[..., Any]] = {"tensorflow": tf_resnet.build_model, "jax": jax_resnet.build_model}


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def weights() -> dict[str, np.ndarray]:
    return TINY.canonical_weights(0)


@pytest.fixture(scope="module")
def case(weights: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The parity inputs (NCHW) and the float64 reference logits."""
    inputs = TINY.make_inputs(*TINY.parity_shape(), 0)
    return inputs["pixel_values"], TINY.reference_forward(weights, inputs)["logits"]


def run_tf(weights: dict[str, np.ndarray], pixel_values: np.ndarray, mode: str = "eager") -> np.ndarray:
    module = tf_resnet.build_model(TINY, weights, "cpu")
    x = tf.constant(pixel_values)
    call = module.__call__
    if mode == "function":  # what tensorflow:function does: one signature with this cell's fixed shape
        call = tf.function(call, input_signature=[tf.TensorSpec(x.shape, x.dtype)])
    outputs = call(x)
    assert isinstance(outputs, tuple) and len(outputs) == 1 and outputs[0].dtype == tf.float32
    return outputs[0].numpy()


def run_jax(weights: dict[str, np.ndarray], pixel_values: np.ndarray) -> np.ndarray:
    model = jax_resnet.build_model(TINY, weights, "cpu")
    outputs = jax.jit(model.apply)(model.params, jnp.asarray(pixel_values))
    assert isinstance(outputs, tuple) and len(outputs) == 1 and outputs[0].dtype == jnp.float32
    return np.asarray(outputs[0])


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_tensorflow_matches_the_float64_reference(
    weights: dict[str, np.ndarray], case: tuple[np.ndarray, np.ndarray], mode: str
) -> None:
    pixel_values, reference = case
    logits = run_tf(weights, pixel_values, mode)
    assert logits.shape == reference.shape == (2, 10)
    assert rel_l2(logits, reference) < TOLERANCE


def test_jax_matches_the_float64_reference(weights: dict[str, np.ndarray], case: tuple[np.ndarray, np.ndarray]) -> None:
    pixel_values, reference = case
    logits = run_jax(weights, pixel_values)
    assert logits.shape == reference.shape == (2, 10)
    assert rel_l2(logits, reference) < TOLERANCE


def test_the_tolerance_sees_a_wrong_running_statistic(
    weights: dict[str, np.ndarray], case: tuple[np.ndarray, np.ndarray]
) -> None:
    """Every tensor matters: one reversed running mean moves both frameworks' logits past the tolerance."""
    pixel_values, reference = case
    swapped = {**weights, "layer3.0.bn2.running_mean": weights["layer3.0.bn2.running_mean"][::-1].copy()}
    assert rel_l2(run_tf(swapped, pixel_values), reference) > 10 * TOLERANCE
    assert rel_l2(run_jax(swapped, pixel_values), reference) > 10 * TOLERANCE


def test_every_tensor_is_mapped_once(weights: dict[str, np.ndarray]) -> None:
    """Each conv keeps a kernel and its BN's (scale, shift); fc a kernel and a bias; nothing else."""
    expected = 3 * len(TINY.convs) + 2
    module = tf_resnet.build_model(TINY, weights, "cpu")
    assert len(module.trainable_variables) == expected
    leaves = jax.tree.leaves(jax_resnet.build_model(TINY, weights, "cpu").params)
    assert len(leaves) == expected
    convs = sum(int(np.prod(weights[f"{v.name}.weight"].shape)) for v in TINY.convs)
    kernels = convs + weights["fc.weight"].size
    assert sum(leaf.size for leaf in leaves) == kernels + 2 * sum(v.out_channels for v in TINY.convs) + 10
    stem = jax_resnet.build_model(TINY, weights, "cpu").params["conv1"]["kernel"]
    np.testing.assert_array_equal(np.asarray(stem), weights["conv1.weight"].transpose(2, 3, 1, 0))  # HWIO


@pytest.mark.parametrize("framework", ["tensorflow", "jax"])
def test_weight_map_errors_are_clear(weights: dict[str, np.ndarray], framework: str) -> None:
    build = BUILDERS[framework]
    for name in ("conv1.weight", "layer2.0.downsample.1.running_var", "fc.bias"):
        with pytest.raises(ValueError, match=rf"tensor {name} missing"):
            build(TINY, {k: v for k, v in weights.items() if k != name}, "cpu")
    with pytest.raises(ValueError, match=r"tensors unused \['extra.weight'\]"):
        build(TINY, {**weights, "extra.weight": np.zeros(2, np.float32)}, "cpu")
    for name in ("conv1.weight", "layer4.0.conv2.weight", "layer1.0.bn3.running_mean", "fc.weight"):
        with pytest.raises(ValueError, match=rf"{name}: shape \(3, 3\)"):
            build(TINY, {**weights, name: np.zeros((3, 3), np.float32)}, "cpu")
    # a conv weight with its in/out axes swapped (4-D, the right rank) is named too
    swapped = weights["layer1.0.conv3.weight"].transpose(1, 0, 2, 3).copy()
    with pytest.raises(ValueError, match=r"layer1\.0\.conv3\.weight: shape"):
        build(TINY, {**weights, "layer1.0.conv3.weight": swapped}, "cpu")


@pytest.mark.matrix  # make test diffs resnet-tiny in TensorFlow and JAX workers (test_diff), checking their outputs
@pytest.mark.parametrize("runtime", ["tensorflow:function", "jax:jit"])
def test_resnet_in_a_worker_passes_parity(runtime: str) -> None:
    outcome = run_worker(Case("resnet-tiny", runtime, batch_size=2), Settings(threads=1, max_time_s=0.3))
    assert outcome.status == "ok", outcome.reason
    assert outcome.details["parity"]["ok"] is True
    assert outcome.details["layout"].startswith("NHWC inside the call")
    assert outcome.samples and outcome.fields["median_s"] > 0


@pytest.mark.slow
@pytest.mark.matrix  # make test: resnet-tiny in all three modes, above
def test_resnet50_matches_the_float64_reference() -> None:
    """The full-size layout (16 blocks, 224x224, stride-2 convs on odd and even sizes) in all three modes."""
    description = resnet("resnet50")
    weights = description.canonical_weights(0)
    inputs = description.make_inputs(*description.parity_shape(), 0)
    reference = description.reference_forward(weights, inputs)["logits"]
    x = inputs["pixel_values"]
    module = tf_resnet.build_model(description, weights, "cpu")
    function = tf.function(module.__call__, input_signature=[tf.TensorSpec(x.shape, tf.float32)])
    model = jax_resnet.build_model(description, weights, "cpu")
    outputs = {
        "eager": module(tf.constant(x))[0].numpy(),
        "function": function(tf.constant(x))[0].numpy(),
        "jit": np.asarray(jax.jit(model.apply)(model.params, jnp.asarray(x))[0]),
    }
    for mode, logits in outputs.items():
        assert logits.shape == reference.shape == (2, 1000), mode
        assert rel_l2(logits, reference) < TOLERANCE, mode
