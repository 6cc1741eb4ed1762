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

Phase training needs the four BN tensors themselves, so the model also keeps them, unfolded
(``training_variables``): trained parameters (each conv's ``kernel`` — the same arrays as the inference
pytree's — and its BN's ``weight`` and ``bias``, and ``fc``) and the BN running statistics (``mean``,
``var``) as a separate pytree of state that ``training_logits_and_stats`` takes and returns updated: every
BN normalises with its batch's mean and biased variance over (N, H, W), and the new running statistics
are ``(1 − m)·running + m·batch`` (m = BN_MOMENTUM, torch's 0.1; the unbiased batch variance for the
variance; no gradient flows into them). The backend's jitted step threads that state through (returned
and fed back, donated like the parameters).
``taps``: the checkpoints (fwbench.models.checkpoints), recorded as computed (image ones NHWC) only when given a
dict; the backend hands them on NCHW.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fwbench.frameworks.jax import precision
from fwbench.frameworks.jax.weights import CanonicalParams
from fwbench.models.checkpoints import Taps, tap
from fwbench.models.resnet import BN_MOMENTUM, BN_SUFFIXES, Block, Conv, ResNet
from fwbench.models.weightmap import hwio, transpose

LAYOUT = "NHWC inside the call (NCHW input transposed as its first op)"

Params = dict[str, Any]

DIMENSION_NUMBERS = ("NHWC", "HWIO", "NHWC")  # input, kernel, output


def dense(p: Params, x: jax.Array) -> jax.Array:
    """(..., in) @ kernel (in, out) + bias (out,) → (..., out), under the precision policy."""
    return precision.dense(x, p["kernel"], p["bias"])


def conv(kernel: jax.Array, x: jax.Array, v: Conv) -> jax.Array:
    """A bias-free conv (HWIO kernel, explicit symmetric padding): (B, H, W, in) → (B, H / stride, W / stride,
    out), under the precision policy."""
    return precision.conv(
        x,
        kernel,
        window_strides=(v.stride, v.stride),
        padding=((v.padding, v.padding), (v.padding, v.padding)),
        dimension_numbers=DIMENSION_NUMBERS,
    )


def conv_bn(p: Params, x: jax.Array, v: Conv) -> jax.Array:
    """The conv, then inference BN (folded into scale and shift), computed in float32 and handed on in the
    conv's dtype (bfloat16 under bf16, as torch's mixed-dtype batch norm)."""
    y = conv(p["kernel"], x, v)
    with precision.batch_norm_scope():
        return precision.like(precision.in_float32(y) * p["scale"] + p["shift"], y)


ConvBN = Callable[[Params, jax.Array, Conv], jax.Array]  # (one conv's parameters, input, its Conv) -> output


def max_pool(x: jax.Array, kernel: int = 3, stride: int = 2, padding: int = 1) -> jax.Array:
    """torch's MaxPool2d(3, 2, 1) on NHWC; padding never wins (-inf)."""
    return lax.reduce_window(
        x,
        -jnp.inf,
        lax.max,
        (1, kernel, kernel, 1),
        (1, stride, stride, 1),
        ((0, 0), (padding, padding), (padding, padding), (0, 0)),
    )


def bottleneck(p: Params, x: jax.Array, block: Block, conv_bn: ConvBN = conv_bn) -> jax.Array:
    """1x1 → 3x3 (stride here, v1.5) → 1x1 (4x channels), BN after each; ReLU after the sum."""
    first, second, third = block.convs
    shortcut = x if block.downsample is None else conv_bn(p["downsample"], x, block.downsample)
    h = jax.nn.relu(conv_bn(p["conv1"], x, first))
    h = jax.nn.relu(conv_bn(p["conv2"], h, second))
    h = conv_bn(p["conv3"], h, third)
    return jax.nn.relu(h + shortcut)


def forward(
    params: Params,
    pixel_values: jax.Array,
    stem: Conv,
    blocks: tuple[Block, ...],
    conv_bn: ConvBN = conv_bn,
    taps: Taps = None,
) -> jax.Array:
    """NCHW pixels → logits (B, classes), each conv + BN computed by ``conv_bn`` (inference or training form);
    the checkpoints recorded in ``taps`` when it is a dict (each block under its prefix)."""
    x = jnp.transpose(pixel_values, (0, 2, 3, 1))  # NCHW -> NHWC, inside the timed call
    x = tap(taps, "stem", max_pool(jax.nn.relu(conv_bn(params["conv1"], x, stem))))  # (B, H/4, W/4, width)
    for p, block in zip(params["layers"], blocks, strict=True):
        x = tap(taps, block.prefix, bottleneck(p, x, block, conv_bn))
    pooled = tap(taps, "avgpool", jnp.mean(x, axis=(1, 2)))
    return tap(taps, "fc", dense(params["fc"], pooled))  # (B, classes)


@dataclass(frozen=True, eq=False)
class ResNetModule:
    """Static structure (the stem and blocks of the description), the parameter pytree, and the forward
    function. ``apply`` reads weights only from its ``params`` argument, so under ``jax.jit`` they are
    program inputs, not constants."""

    stem: Conv
    blocks: tuple[Block, ...]
    params: Params
    eps: float
    bn: dict[str, Params]  # per conv name: its BN's unfolded weight, bias, mean, var (phase training)

    def apply(self, params: Params, pixel_values: jax.Array, taps: Taps = None) -> tuple[jax.Array]:
        return (forward(params, pixel_values, self.stem, self.blocks, taps=taps),)


def build_model(description: ResNet, weights: dict[str, np.ndarray], device: str) -> ResNetModule:
    """The ResNet with the canonical weights (torchvision names, each taken once), its arrays on ``device``."""
    c = description.config
    canonical = CanonicalParams(weights, device)

    bn: dict[str, Params] = {}

    def conv_params(v: Conv) -> Params:
        """The conv's HWIO kernel and its BN folded into (scale, shift), computed once here."""
        weight, bias, mean, var = (canonical.take(f"{v.bn}.{s}", (v.out_channels,)) for s in BN_SUFFIXES)
        bn[v.name] = {"weight": weight, "bias": bias, "mean": mean, "var": var}
        scale = weight / jnp.sqrt(var + c.bn_eps)
        return {
            "kernel": canonical.take(f"{v.name}.weight", (v.kernel, v.kernel, v.in_channels, v.out_channels), hwio),
            "scale": scale,
            "shift": bias - mean * scale,
        }

    def block_params(block: Block) -> Params:
        p = {f"conv{n}": conv_params(v) for n, v in enumerate(block.convs, start=1)}
        if block.downsample is not None:
            p["downsample"] = conv_params(block.downsample)
        return p

    blocks = tuple(description.blocks)
    params: Params = {
        "conv1": conv_params(description.stem),  # conv1 + bn1
        "layers": [block_params(b) for b in blocks],  # layer1.0, ..., layerN.{last}, in torchvision's order
        "fc": {
            "kernel": canonical.take("fc.weight", (c.features, c.num_classes), transpose),
            "bias": canonical.take("fc.bias", (c.num_classes,)),
        },
    }
    canonical.check_all_used()
    return ResNetModule(description.stem, blocks, params, c.bn_eps, bn)


# -- phase training -------------------------------------------------------------------------------
def _conv_names(model: ResNetModule) -> tuple[str, list[dict[str, str]]]:
    """The stem conv's name and, per block, pytree key (conv1..3, downsample) -> conv name."""
    layers = []
    for block in model.blocks:
        keys = {f"conv{n}": v.name for n, v in enumerate(block.convs, start=1)}
        if block.downsample is not None:
            keys["downsample"] = block.downsample.name
        layers.append(keys)
    return model.stem.name, layers


def _per_conv(model: ResNetModule, leaf: Callable[[str], Any]) -> Params:
    """A pytree shaped like the conv part of the parameters (``conv1``, ``layers``), ``leaf(conv name)`` at each
    conv."""
    stem, layers = _conv_names(model)
    return {"conv1": leaf(stem), "layers": [{key: leaf(name) for key, name in keys.items()} for keys in layers]}


def training_variables(model: ResNetModule) -> tuple[Params, Params]:
    """(trained parameters, batch-norm state) for phase training. Parameters: per conv its ``kernel`` (the
    inference pytree's array) and its BN's ``weight`` and ``bias``, and ``fc``; state: per conv its BN's
    running ``mean`` and ``var``. Same keys and order as the inference pytree (torchvision's order)."""
    kernels = {name: conv["kernel"] for name, conv in _flat_convs(model).items()}
    params = _per_conv(
        model,
        lambda name: {"kernel": kernels[name], "weight": model.bn[name]["weight"], "bias": model.bn[name]["bias"]},
    )
    params["fc"] = model.params["fc"]
    stats = _per_conv(model, lambda name: {"mean": model.bn[name]["mean"], "var": model.bn[name]["var"]})
    return params, stats


def _flat_convs(model: ResNetModule) -> dict[str, Params]:
    """The inference pytree's conv dicts by conv name."""
    stem, layers = _conv_names(model)
    flat = {stem: model.params["conv1"]}
    for p, keys in zip(model.params["layers"], layers, strict=True):
        flat.update({name: p[key] for key, name in keys.items()})
    return flat


def inference_logits(model: ResNetModule, params: Params, stats: Params, pixel_values: jax.Array) -> jax.Array:
    """(batch, classes) logits in inference form from the training pytrees (phase fit's evaluation after
    training): every BN folded into ``scale`` and ``shift`` from its trained weight and bias and its running
    ``mean`` and ``var``, as ``build_model`` folds the loaded ones."""

    def fold(p: Params, s: Params) -> Params:
        scale = p["weight"] / jnp.sqrt(s["var"] + model.eps)
        return {"kernel": p["kernel"], "scale": scale, "shift": p["bias"] - s["mean"] * scale}

    folded = {
        "conv1": fold(params["conv1"], stats["conv1"]),
        "layers": [
            {key: fold(p[key], s[key]) for key in p} for p, s in zip(params["layers"], stats["layers"], strict=True)
        ],
        "fc": params["fc"],
    }
    return forward(folded, pixel_values, model.stem, model.blocks)


def training_logits_and_stats(
    model: ResNetModule, params: Params, stats: Params, pixel_values: jax.Array, momentum: float = BN_MOMENTUM
) -> tuple[jax.Array, Params]:
    """The training logits (batch, classes), every BN on its batch's mean and biased variance over (N, H, W),
    and the updated running statistics: (1 − m)·running + m·batch, the unbiased batch variance for ``var``
    (torch's rule; m = 0.1 is torch's momentum, flax's 0.9). No gradient flows into the new statistics."""
    merged = {
        "conv1": {**params["conv1"], **stats["conv1"]},
        "layers": [
            {key: {**p[key], **s[key]} for key in p} for p, s in zip(params["layers"], stats["layers"], strict=True)
        ],
        "fc": params["fc"],
    }
    updated: dict[str, Params] = {}

    def conv_bn_training(p: Params, x: jax.Array, v: Conv) -> jax.Array:
        low = conv(p["kernel"], x, v)
        with precision.batch_norm_scope():  # statistics and normalisation in float32, result in the conv's dtype
            y = precision.in_float32(low)
            mean, var = jnp.mean(y, axis=(0, 1, 2)), jnp.var(y, axis=(0, 1, 2))  # biased, as BN normalises
            count = y.shape[0] * y.shape[1] * y.shape[2]
            batch_mean, batch_var = lax.stop_gradient(mean), lax.stop_gradient(var) * (count / (count - 1))
            updated[v.name] = {
                "mean": (1 - momentum) * p["mean"] + momentum * batch_mean,
                "var": (1 - momentum) * p["var"] + momentum * batch_var,
            }
            return precision.like((y - mean) * (p["weight"] * lax.rsqrt(var + model.eps)) + p["bias"], low)

    logits = forward(merged, pixel_values, model.stem, model.blocks, conv_bn_training)
    return logits, _per_conv(model, lambda name: updated[name])
