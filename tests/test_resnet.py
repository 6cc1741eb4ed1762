"""ResNet descriptions (resnet-tiny, resnet50) and their PyTorch implementation: torchvision's names
and counts, FLOPs, canonical weights, parity with the float64 reference, weight-map errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fwbench.frameworks.torch import resnet as torch_resnet
from fwbench.models.resnet import RESNET50, RESNET_TINY, ResNet, ResNetConfig, conv2d_nhwc, max_pool_nhwc
from fwbench.spec import SpecError


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b))


def run_torch(description: ResNet, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray]) -> np.ndarray:
    module = torch_resnet.build_model(description, weights, "cpu")
    with torch.inference_mode():
        (logits,) = module(torch.from_numpy(inputs["pixel_values"]))
    return logits.numpy()


def test_resnet50_schema_is_torchvisions() -> None:
    schema = {p.name: p.shape for p in RESNET50.param_schema()}
    assert schema["conv1.weight"] == (64, 3, 7, 7)
    assert schema["bn1.running_var"] == (64,)
    assert schema["layer1.0.conv1.weight"] == (64, 64, 1, 1)
    assert schema["layer1.0.downsample.0.weight"] == (256, 64, 1, 1)
    assert schema["layer1.2.conv3.weight"] == (256, 64, 1, 1)
    assert schema["layer2.0.conv1.weight"] == (128, 256, 1, 1)
    assert schema["layer2.0.conv2.weight"] == (128, 128, 3, 3)
    assert schema["layer3.5.bn3.running_mean"] == (1024,)
    assert schema["layer4.0.downsample.1.weight"] == (2048,)
    assert schema["layer4.2.conv3.weight"] == (2048, 512, 1, 1)
    assert schema["fc.weight"] == (1000, 2048) and schema["fc.bias"] == (1000,)
    assert not any("num_batches_tracked" in n for n in schema)
    downsamples = sorted(n for n in schema if "downsample.0" in n)
    assert downsamples == [f"layer{k}.0.downsample.0.weight" for k in range(1, 5)]
    assert "layer1.3.conv1.weight" not in schema and "layer3.5.conv1.weight" in schema
    # torchvision's resnet50 state dict: 161 parameters + 2 x 53 BN running statistics
    assert len(schema) == 161 + 2 * 53
    learnable = sum(int(np.prod(s)) for n, s in schema.items() if not n.endswith(("running_mean", "running_var")))
    assert learnable == RESNET50.parameter_count() == 25_557_032


def test_resnet_tiny_schema() -> None:
    schema = {p.name: p.shape for p in RESNET_TINY.param_schema()}
    assert schema["conv1.weight"] == (16, 3, 7, 7)
    assert schema["layer1.0.conv3.weight"] == (64, 16, 1, 1)
    assert schema["layer1.0.downsample.0.weight"] == (64, 16, 1, 1)
    assert schema["layer2.0.conv2.weight"] == (32, 32, 3, 3)
    assert schema["layer4.0.downsample.0.weight"] == (512, 256, 1, 1)
    assert schema["fc.weight"] == (10, 512)
    assert len(schema) == 5 + 4 * (3 * 5 + 5) + 2
    assert RESNET_TINY.make_inputs(3, None, 0)["pixel_values"].shape == (3, 3, 64, 64)
    assert RESNET_TINY.make_inputs(3, None, 0)["pixel_values"].dtype == np.float32
    assert RESNET_TINY.parity_shape() == (2, None) and not RESNET_TINY.has_sequence
    assert RESNET_TINY.output_names == RESNET50.output_names == ("logits",)


def test_v15_strides_and_sizes() -> None:
    blocks = RESNET50.blocks
    assert [b.convs[1].stride for b in blocks] == [1, 1, 1, 2, 1, 1, 1, 2, 1, 1, 1, 1, 1, 2, 1, 1]
    assert all(b.convs[0].stride == b.convs[2].stride == 1 for b in blocks)  # stride on conv2, not conv1
    assert [b.downsample.stride for b in blocks if b.downsample] == [1, 2, 2, 2]
    assert RESNET50.stem.out_size == 112 and blocks[0].convs[0].in_size == 56 and blocks[-1].convs[2].out_size == 7
    assert [b.convs[2].out_size for b in RESNET_TINY.blocks] == [16, 8, 4, 2]


def test_flops() -> None:
    # torchvision: resnet50 is ~4.09 GMACs at 224x224 -> ~8.18 GFLOP
    assert abs(RESNET50.forward_flops(1, None) - 8.2e9) / 8.2e9 < 0.02
    assert RESNET50.forward_flops(4, None) == 4 * RESNET50.forward_flops(1, None)
    assert RESNET50.training_forward_flops(2, None) == RESNET50.forward_flops(2, None)
    # resnet-tiny by hand, out_h·out_w·out_c·in_c·k² per conv: stem, layer1..4 (conv1-3, downsample), fc
    stem = 32 * 32 * 16 * 3 * 49
    layer1 = 16 * 16 * (16 * 16 + 16 * 16 * 9 + 64 * 16 + 64 * 16)
    later = 3 * (16 * 16 * 32 * 64 + 8 * 8 * (32 * 32 * 9 + 128 * 32 + 128 * 64))  # layer2..4 cost the same
    assert RESNET_TINY.forward_flops(1, None) == 2 * (stem + layer1 + later + 512 * 10)
    wider = ResNet("w", ResNetConfig(blocks=(1, 1, 1, 1), width=32, image_size=64, num_classes=10))
    assert wider.forward_flops(1, None) > 3 * RESNET_TINY.forward_flops(1, None)  # counted from the config


def test_config_validation() -> None:
    with pytest.raises(SpecError):
        ResNetConfig(blocks=(1, 0, 1, 1))
    with pytest.raises(SpecError):
        ResNetConfig(width=0)


def test_weights_are_seeded_per_tensor_and_non_zero() -> None:
    a, b = RESNET_TINY.canonical_weights(0), RESNET_TINY.canonical_weights(0)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert all(v.dtype == np.float32 for v in a.values())
    assert not np.array_equal(a["fc.weight"], RESNET_TINY.canonical_weights(1)["fc.weight"])
    assert all(np.abs(v).min() > 0 for n, v in a.items() if "running_var" in n or n.endswith("bn1.weight"))
    assert all(np.abs(v).max() > 0 for v in a.values())
    assert 0.5 <= a["layer1.0.bn1.running_var"].min() and a["layer1.0.bn1.running_var"].max() <= 1.5
    RESNET_TINY.check_weights(a)


def test_numpy_conv_and_pool_match_torch() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 9, 11))
    w = rng.standard_normal((4, 5, 3, 3))
    ours = conv2d_nhwc(x.transpose(0, 2, 3, 1), w, stride=2, padding=1).transpose(0, 3, 1, 2)
    expected = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), stride=2, padding=1).numpy()
    np.testing.assert_allclose(ours, expected, rtol=1e-10, atol=1e-10)
    pooled = max_pool_nhwc(x.transpose(0, 2, 3, 1), 3, 2, 1).transpose(0, 3, 1, 2)
    expected = torch.nn.functional.max_pool2d(torch.from_numpy(x), 3, 2, 1).numpy()
    np.testing.assert_array_equal(pooled, expected)


def test_torch_matches_the_float64_reference() -> None:
    weights = RESNET_TINY.canonical_weights(0)
    batch, seq = RESNET_TINY.parity_shape()
    inputs = RESNET_TINY.make_inputs(batch, seq, 0)
    reference = RESNET_TINY.reference_forward(weights, inputs)["logits"]
    assert reference.shape == (2, 10)
    assert rel_l2(run_torch(RESNET_TINY, weights, inputs), reference) < 1e-5
    # every tensor matters: a swapped running statistic changes the logits beyond the tolerance
    swapped = dict(weights)
    swapped["layer3.0.bn2.running_mean"] = weights["layer3.0.bn2.running_mean"][::-1].copy()
    assert rel_l2(run_torch(RESNET_TINY, swapped, inputs), reference) > 1e-4


@pytest.mark.slow
def test_resnet50_matches_the_reference_and_keeps_its_scale() -> None:
    weights = RESNET50.canonical_weights(0)
    inputs = RESNET50.make_inputs(*RESNET50.parity_shape(), 0)
    reference = RESNET50.reference_forward(weights, inputs)["logits"]
    assert reference.shape == (2, 1000)
    assert 1e-2 < reference.std() < 1e2  # neither blown up nor vanished through 50 layers
    assert rel_l2(reference[0], reference[1]) > 1e-3  # the output still depends on the input
    assert rel_l2(run_torch(RESNET50, weights, inputs), reference) < 1e-5


def test_weight_map_errors_are_clear() -> None:
    d = RESNET_TINY
    weights = d.canonical_weights(0)
    name = "layer2.0.downsample.1.running_var"
    missing = {k: v for k, v in weights.items() if k != name}
    with pytest.raises(ValueError, match=rf"missing \['{name}'\]"):
        d.check_weights(missing)
    with pytest.raises(ValueError, match=rf"tensors missing \['{name}'\]"):
        torch_resnet.build_model(d, missing, "cpu")
    with pytest.raises(ValueError, match=r"unexpected \['extra.weight'\]"):
        d.check_weights({**weights, "extra.weight": np.zeros(2, np.float32)})
    with pytest.raises(ValueError, match=r"tensors unused \['extra.weight'\]"):
        torch_resnet.build_model(d, {**weights, "extra.weight": np.zeros(2, np.float32)}, "cpu")
    wrong = dict(weights)
    wrong["layer1.0.conv2.weight"] = np.zeros((16, 16, 1, 1), np.float32)
    with pytest.raises(ValueError, match=r"layer1.0.conv2.weight.*shape \(16, 16, 1, 1\)"):
        d.check_weights(wrong)
    with pytest.raises(ValueError, match=r"layer1.0.conv2.weight.*shape \(16, 16, 1, 1\)"):
        torch_resnet.build_model(d, wrong, "cpu")


def test_every_parameter_and_buffer_is_loaded() -> None:
    weights = RESNET_TINY.canonical_weights(0)
    module = torch_resnet.build_model(RESNET_TINY, weights, "cpu")
    assert not module.training
    state = {k: v for k, v in module.state_dict().items() if not k.endswith("num_batches_tracked")}
    assert set(state) == set(weights)  # the torch module's names are torchvision's
    assert all(np.array_equal(state[k].numpy(), weights[k]) for k in weights)
    assert sum(p.numel() for p in module.parameters()) == RESNET_TINY.parameter_count()
