"""ResNet v1.5 (bottleneck blocks) in JAX: lax.conv_general_dilated / lax.reduce_window / matmul.

Input ``pixel_values``: (batch, 3, H, W) float32, NCHW → ``(logits,)`` with logits (batch, classes).
Layout: NHWC internally, NCHW at the boundary. XLA:CPU's convolutions want channels-last, so the
first op of ``apply`` transposes the input NCHW → NHWC (inside the timed call, so every framework
is fed the same NCHW tensor), and each conv kernel is transposed once, when loading, from the
canonical (out, in, kh, kw) to HWIO (kh, kw, in, out); ``fc`` kernel is (in, out), transposed once
when loading. Padding is explicit and symmetric, as torch's (``"SAME"`` pads a stride-2 conv or
pool asymmetrically); the max-pool's padding is -inf (the ``reduce_window`` initial value).
A pure function over a parameter pytree whose keys follow torchvision (``conv1``, ``layers[i]`` =
``layer{k}.{j}``, ``conv{n}``, ``downsample``, ``fc``), each conv holding the BN after it; strides
and paddings are static, read from the description's ``Conv`` records, never from the pytree.
Batch norm in inference form, ``(x - running_mean)·(weight / √(running_var + eps)) + bias``, is
computed as ``x·scale + shift`` with ``scale`` and ``shift`` precomputed (float32) when loading from
the four canonical tensors, each used once (torch's eval BN is one fused op as well).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fwbench.frameworks.jax.weights import CanonicalParams, hwio, transpose
from fwbench.models.resnet import BN_SUFFIXES, Block, Conv, ResNet

LAYOUT = "NHWC inside the call (NCHW input transposed as its first op)"

Params = dict[str, Any]

DIMENSION_NUMBERS = ("NHWC", "HWIO", "NHWC")  # input, kernel, output


def dense(p: Params, x: jax.Array) -> jax.Array:
    """(..., in) @ kernel (in, out) + bias (out,) → (..., out)."""
    return x @ p["kernel"] + p["bias"]


def conv_bn(p: Params, x: jax.Array, v: Conv) -> jax.Array:
    """A bias-free conv (HWIO kernel, explicit symmetric padding), then inference BN: (B, H, W, in) →
    (B, H / stride, W / stride, out)."""
    y = lax.conv_general_dilated(x, p["kernel"], window_strides=(v.stride, v.stride),
                                 padding=((v.padding, v.padding), (v.padding, v.padding)),
                                 dimension_numbers=DIMENSION_NUMBERS)
    return y * p["scale"] + p["shift"]


def max_pool(x: jax.Array, kernel: int = 3, stride: int = 2, padding: int = 1) -> jax.Array:
    """torch's MaxPool2d(3, 2, 1) on NHWC; padding never wins (-inf)."""
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, kernel, kernel, 1), (1, stride, stride, 1),
                             ((0, 0), (padding, padding), (padding, padding), (0, 0)))


def bottleneck(p: Params, x: jax.Array, block: Block) -> jax.Array:
    """1x1 → 3x3 (stride here, v1.5) → 1x1 (4x channels), BN after each; ReLU after the sum."""
    first, second, third = block.convs
    shortcut = x if block.downsample is None else conv_bn(p["downsample"], x, block.downsample)
    h = jax.nn.relu(conv_bn(p["conv1"], x, first))
    h = jax.nn.relu(conv_bn(p["conv2"], h, second))
    h = conv_bn(p["conv3"], h, third)
    return jax.nn.relu(h + shortcut)


@dataclass(frozen=True, eq=False)
class ResNetModel:
    """Static structure (the stem and blocks of the description), the parameter pytree, and the forward
    function. ``apply`` reads weights only from its ``params`` argument, so under ``jax.jit`` they are
    program inputs, not constants."""

    stem: Conv
    blocks: tuple[Block, ...]
    params: Params

    def apply(self, params: Params, pixel_values: jax.Array) -> tuple[jax.Array]:
        x = jnp.transpose(pixel_values, (0, 2, 3, 1))  # NCHW -> NHWC, inside the timed call
        x = max_pool(jax.nn.relu(conv_bn(params["conv1"], x, self.stem)))  # (B, H/4, W/4, width)
        for p, block in zip(params["layers"], self.blocks, strict=True):
            x = bottleneck(p, x, block)
        return (dense(params["fc"], jnp.mean(x, axis=(1, 2))),)  # (B, classes)


def build_model(description: ResNet, weights: dict[str, np.ndarray], device: str) -> ResNetModel:
    """The ResNet with the canonical weights (torchvision names, each taken once), its arrays on ``device``."""
    c = description.config
    canonical = CanonicalParams(weights, device)

    def conv_params(v: Conv) -> Params:
        """The conv's HWIO kernel and its BN folded into (scale, shift), computed once here."""
        weight, bias, mean, var = (canonical.take(f"{v.bn}.{s}", (v.out_channels,)) for s in BN_SUFFIXES)
        scale = weight / jnp.sqrt(var + c.bn_eps)
        return {"kernel": canonical.take(f"{v.name}.weight", (v.kernel, v.kernel, v.in_channels, v.out_channels),
                                         hwio),
                "scale": scale, "shift": bias - mean * scale}

    def block_params(block: Block) -> Params:
        p = {f"conv{n}": conv_params(v) for n, v in enumerate(block.convs, start=1)}
        if block.downsample is not None:
            p["downsample"] = conv_params(block.downsample)
        return p

    blocks = tuple(description.blocks)
    params: Params = {
        "conv1": conv_params(description.stem),  # conv1 + bn1
        "layers": [block_params(b) for b in blocks],  # layer1.0, ..., layerN.{last}, in torchvision's order
        "fc": {"kernel": canonical.take("fc.weight", (c.features, c.num_classes), transpose),
               "bias": canonical.take("fc.bias", (c.num_classes,))},
    }
    canonical.check_all_used()
    return ResNetModel(description.stem, blocks, params)
