"""ResNet v1.5 with bottleneck blocks (resnet-tiny, resnet50); batch norm in inference form, or in
training form for phase training.

Stem: 7x7 conv stride 2 pad 3, BN, ReLU, 3x3 max-pool stride 2 pad 1. Four stages of bottleneck
blocks (1x1 conv, 3x3 conv, 1x1 conv with 4x expansion, each followed by BN; ReLU after the first
two and after the residual sum). v1.5: the stride 2 of stages 2-4 sits on the 3x3 conv (``conv2``)
of the stage's first block and on its 1x1 ``downsample`` conv. Head: global average pool, ``fc``.
Convs have no bias; BN uses its running statistics, eps 1e-5.

Parameter names and layouts are torchvision's ``resnet50`` state dict (conv weights are
(out, in, kh, kw); ``fc.weight`` is (classes, features)) without ``num_batches_tracked``; the BN
running statistics (``running_mean``, ``running_var``) are part of the canonical weights.
Input ``pixel_values``: (batch, 3, H, W) float32, NCHW. Output ``logits``: (batch, classes).

Training: softmax cross-entropy of ``logits`` against seeded class ids (every sample counts), with every
BN in training mode: it normalises with the batch's own mean and biased variance over (N, H, W), eps as
in inference, and updates its running statistics as torch does (momentum ``BN_MOMENTUM`` = 0.1:
``running ← 0.9·running + 0.1·batch``, the running variance from the *unbiased* batch variance,
n/(n − 1)·biased, n = N·H·W; in Keras' and flax's convention that is momentum 0.9). The running
statistics are state, not trained parameters (``running_statistics``: no gradient, no weight decay);
BN weight and bias are trained.

Phase fit (resnet-tiny only, ``fit_unsupported``): the same training-mode BN during the epochs; the final
loss/accuracy is evaluated in inference form, on the running statistics the epochs left.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fwbench.models.base import ModelDescription, ParamSpec, tensor_rng
from fwbench.models.checkpoints import Taps, tap
from fwbench.models.training import class_targets, reference_loss
from fwbench.spec import SpecError

EXPANSION = 4  # bottleneck output channels = 4 x its inner width
BN_SUFFIXES = ("weight", "bias", "running_mean", "running_var")
# The last BN of each residual branch (bn3) has weight RESIDUAL_BN_SCALE·(1 + N(0, 0.1)), a damped
# form of torchvision's ``zero_init_residual``. With every BN weight near 1, He-normal convs and
# running statistics that do not match the activations, the residual stream grows geometrically
# (resnet50 logits std ~1e3); at 0.2 activations stay between 1 and 5 RMS through all 16 blocks.
RESIDUAL_BN_SCALE = 0.2
# Phase training: running ← (1 − BN_MOMENTUM)·running + BN_MOMENTUM·batch (torch's momentum; Keras' and
# flax's ``momentum`` is 1 − BN_MOMENTUM), the running variance from the unbiased batch variance.
BN_MOMENTUM = 0.1
RUNNING_SUFFIXES = ("running_mean", "running_var")


@dataclass(frozen=True)
class ResNetConfig:
    """Blocks per stage, stem width (stage k's inner width is width·2^k), input size, classes."""

    blocks: tuple[int, ...] = (3, 4, 6, 3)
    width: int = 64
    image_size: int = 224
    in_channels: int = 3
    num_classes: int = 1000
    bn_eps: float = 1e-5

    def __post_init__(self) -> None:
        if not self.blocks or any(b <= 0 for b in self.blocks):
            raise SpecError(f"ResNet stages need at least one block each, got {self.blocks}")
        for field, value in (
            ("width", self.width),
            ("image_size", self.image_size),
            ("in_channels", self.in_channels),
            ("num_classes", self.num_classes),
        ):
            if value <= 0:
                raise SpecError(f"ResNet {field} must be positive, got {value}")

    @property
    def features(self) -> int:
        """Channels entering the average pool and ``fc``."""
        return self.width * 2 ** (len(self.blocks) - 1) * EXPANSION


@dataclass(frozen=True)
class Conv:
    """One convolution (no bias) and the BN after it: names, channels, kernel, stride, padding, sizes."""

    name: str  # e.g. "layer2.0.conv2"; its weight is f"{name}.weight"
    bn: str  # e.g. "layer2.0.bn2"
    in_channels: int
    out_channels: int
    kernel: int
    stride: int
    padding: int
    in_size: int  # input height = width
    out_size: int


@dataclass(frozen=True)
class Block:
    """One bottleneck block: its prefix, three convs, and its downsample conv (first block of a stage)."""

    prefix: str  # e.g. "layer3.0"
    convs: tuple[Conv, Conv, Conv]
    downsample: Conv | None


def _conv(name: str, bn: str, cin: int, cout: int, kernel: int, stride: int, size: int) -> Conv:
    padding = kernel // 2
    return Conv(name, bn, cin, cout, kernel, stride, padding, size, (size + 2 * padding - kernel) // stride + 1)


def _pool_size(size: int) -> int:
    """Height after the stem's 3x3 max-pool, stride 2, pad 1."""
    return (size + 2 - 3) // 2 + 1


class ResNet(ModelDescription):
    arch = "resnet"
    has_sequence = False
    output_names = ("logits",)
    # A seeded ResNet teacher puts ~94% of resnet-tiny's samples in one class (the pooled features share a
    # large positive mean, so fc's row sums decide); centred per class over the dataset, all classes occur.
    fit_teacher_centred = True

    def __init__(self, name: str, config: ResNetConfig, fit_phase: bool = False) -> None:
        self.name = name
        self.config = config
        self.fit_phase = fit_phase  # phase fit: only where the float64 numpy teacher labels a dataset quickly

    # -- structure --------------------------------------------------------------------------
    @property
    def stem(self) -> Conv:
        c = self.config
        return _conv("conv1", "bn1", c.in_channels, c.width, 7, 2, c.image_size)

    @property
    def blocks(self) -> list[Block]:
        """Every bottleneck block in order, with its convs' channels, strides and spatial sizes."""
        c = self.config
        size, channels = _pool_size(self.stem.out_size), c.width
        blocks: list[Block] = []
        for stage, count in enumerate(c.blocks):
            inner = c.width * 2**stage
            out = inner * EXPANSION
            for j in range(count):
                p = f"layer{stage + 1}.{j}"
                stride = 2 if stage > 0 and j == 0 else 1
                conv1 = _conv(f"{p}.conv1", f"{p}.bn1", channels, inner, 1, 1, size)
                conv2 = _conv(f"{p}.conv2", f"{p}.bn2", inner, inner, 3, stride, size)
                conv3 = _conv(f"{p}.conv3", f"{p}.bn3", inner, out, 1, 1, conv2.out_size)
                downsample = None
                if stride != 1 or channels != out:
                    downsample = _conv(f"{p}.downsample.0", f"{p}.downsample.1", channels, out, 1, stride, size)
                blocks.append(Block(p, (conv1, conv2, conv3), downsample))
                size, channels = conv2.out_size, out
        return blocks

    @property
    def convs(self) -> list[Conv]:
        """Every convolution, stem first, in schema order."""
        convs = [self.stem]
        for block in self.blocks:
            convs += [*block.convs, *([block.downsample] if block.downsample else [])]
        return convs

    # -- description ------------------------------------------------------------------------
    def param_schema(self) -> list[ParamSpec]:
        """torchvision's order: stem, each block's conv/bn pairs then its downsample, then fc."""
        specs: list[ParamSpec] = []
        for conv in self.convs:
            specs.append(
                ParamSpec(f"{conv.name}.weight", (conv.out_channels, conv.in_channels, conv.kernel, conv.kernel))
            )
            specs += [ParamSpec(f"{conv.bn}.{suffix}", (conv.out_channels,)) for suffix in BN_SUFFIXES]
        c = self.config
        specs += [ParamSpec("fc.weight", (c.num_classes, c.features)), ParamSpec("fc.bias", (c.num_classes,))]
        return specs

    def running_statistics(self) -> tuple[str, ...]:
        """Every BN's ``running_mean`` and ``running_var``: updated by a training step, never trained."""
        return tuple(s.name for s in self.param_schema() if s.name.endswith(RUNNING_SUFFIXES))

    def canonical_weights(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Seeded per tensor; every tensor non-zero so that a mapping error changes the logits.

        Convs He-normal N(0, 2/fan_in); BN weight 1 + N(0, 0.1) (times RESIDUAL_BN_SCALE for each
        block's bn3), bias and running mean N(0, 0.1), running var U(0.5, 1.5); fc weight and bias
        N(0, 0.01).
        """
        weights: dict[str, np.ndarray] = {}
        for spec in self.param_schema():
            rng = tensor_rng(seed, spec.name)
            suffix = spec.name.rsplit(".", 1)[1]
            if spec.name.startswith("fc."):
                values = rng.normal(0.0, 0.01, size=spec.shape)
            elif len(spec.shape) == 4:  # conv (out, in, kh, kw)
                fan_in = int(np.prod(spec.shape[1:]))
                values = rng.normal(0.0, np.sqrt(2.0 / fan_in), size=spec.shape)
            elif suffix == "weight":
                values = 1.0 + rng.normal(0.0, 0.1, size=spec.shape)
                if spec.name.endswith(".bn3.weight"):
                    values *= RESIDUAL_BN_SCALE
            elif suffix == "running_var":
                values = rng.uniform(0.5, 1.5, size=spec.shape)
            else:  # BN bias, running_mean
                values = rng.normal(0.0, 0.1, size=spec.shape)
            weights[spec.name] = values.astype(np.float32)
        return weights

    def make_inputs(self, batch_size: int, seq_len: int | None, seed: int = 0) -> dict[str, np.ndarray]:
        c = self.config
        rng = tensor_rng(seed, f"inputs/pixel_values/{batch_size}")
        shape = (batch_size, c.in_channels, c.image_size, c.image_size)
        return {"pixel_values": rng.standard_normal(shape).astype(np.float32)}

    def training_unsupported(self) -> str | None:
        return None

    def fit_unsupported(self) -> str | None:
        """Phase fit (fwbench.models.fit): resnet-tiny. A larger ResNet is refused: its float64 numpy teacher
        (im2col convs) would spend minutes labelling a dataset of thousands of images before the first epoch."""
        if self.fit_phase:
            return None
        return f"{self.name} has no fit phase (its float64 teacher is too slow to label a dataset; resnet-tiny has one)"

    def make_targets(self, batch_size: int, seq_len: int | None, seed: int = 0) -> dict[str, np.ndarray]:
        """labels (batch,) int32 class ids in [0, num_classes), seeded; label_weights (batch,) all 1."""
        return class_targets(batch_size, self.config.num_classes, seed)

    def reference_loss(
        self, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray], targets: dict[str, np.ndarray]
    ) -> float:
        """The float64 loss of the training-mode forward (every BN on its batch statistics)."""
        logits, _ = self._reference(weights, inputs, training=True)
        return reference_loss(logits, targets["labels"], targets["label_weights"])

    def reference_batch_statistics(
        self, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray]
    ) -> dict[str, tuple[np.ndarray, np.ndarray, int]]:
        """Per BN (its canonical prefix, e.g. ``layer1.0.bn2``): the float64 batch mean and biased variance its
        input has in the training-mode forward, and n = N·H·W, the count they are over."""
        return self._reference(weights, inputs, training=True)[1]

    def reference_running_statistics(
        self, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray], momentum: float = BN_MOMENTUM
    ) -> dict[str, np.ndarray]:
        """Every running statistic after one training step on ``inputs`` from ``weights``, float64, by
        canonical name: (1 − m)·running + m·batch (the running variance from the unbiased batch variance)."""
        updated: dict[str, np.ndarray] = {}
        for bn, (mean, var, count) in self.reference_batch_statistics(weights, inputs).items():
            running_mean, running_var = (weights[f"{bn}.{s}"].astype(np.float64) for s in RUNNING_SUFFIXES)
            updated[f"{bn}.running_mean"] = (1 - momentum) * running_mean + momentum * mean
            updated[f"{bn}.running_var"] = (1 - momentum) * running_var + momentum * var * count / (count - 1)
        return updated

    def forward_flops(self, batch_size: int, seq_len: int | None) -> int:
        """2·multiply-adds of every conv (out_h·out_w·out_c·in_c·k²) and of ``fc``.

        BN, ReLU, pooling and the residual adds are not counted.
        """
        c = self.config
        macs = sum(v.out_size**2 * v.out_channels * v.in_channels * v.kernel**2 for v in self.convs)
        macs += c.features * c.num_classes
        return 2 * batch_size * macs

    def parity_shape(self) -> tuple[int, int | None]:
        return 2, None

    def checkpoint_names(self) -> tuple[str, ...]:
        """``stem`` (after the max-pool), every block by its prefix (``layer1.0``, …: after its residual ReLU),
        ``avgpool`` (the pooled features, (batch, features)) and ``fc`` (the logits). Image checkpoints are
        channels-first (batch, channels, height, width), as the canonical inputs are."""
        return ("stem", *(block.prefix for block in self.blocks), "avgpool", "fc")

    def reference_checkpoints(
        self, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        taps: dict[str, np.ndarray] = {}
        self._reference(weights, inputs, training=False, taps=taps)
        return taps

    def reference_forward(self, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """float64 numpy, channels-last inside (convs as im2col + one matmul each), BN in inference form."""
        return {"logits": self._reference(weights, inputs, training=False)[0]}

    def _reference(
        self, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray], training: bool, taps: Taps = None
    ) -> tuple[np.ndarray, dict[str, tuple[np.ndarray, np.ndarray, int]]]:
        """(logits, batch statistics) in float64. ``training``: every BN normalises with its input's batch
        mean and biased variance over (N, H, W), recorded per BN as (mean, variance, N·H·W); otherwise with
        its running statistics (and nothing is recorded)."""
        eps = self.config.bn_eps
        w = {name: value.astype(np.float64) for name, value in weights.items()}
        statistics: dict[str, tuple[np.ndarray, np.ndarray, int]] = {}

        def conv_bn(x: np.ndarray, v: Conv, relu: bool) -> np.ndarray:
            y = conv2d_nhwc(x, w[f"{v.name}.weight"], v.stride, v.padding)
            if training:
                mean, var = y.mean(axis=(0, 1, 2)), y.var(axis=(0, 1, 2))
                statistics[v.bn] = (mean, var, y.shape[0] * y.shape[1] * y.shape[2])
            else:
                mean, var = w[f"{v.bn}.running_mean"], w[f"{v.bn}.running_var"]
            y = batch_norm(y, w[f"{v.bn}.weight"], w[f"{v.bn}.bias"], mean, var, eps)
            return np.maximum(y, 0.0) if relu else y

        x = inputs["pixel_values"].astype(np.float64).transpose(0, 2, 3, 1)  # (B, H, W, C)
        x = max_pool_nhwc(conv_bn(x, self.stem, relu=True), kernel=3, stride=2, padding=1)
        tap(taps, "stem", x.transpose(0, 3, 1, 2))
        for block in self.blocks:
            first, second, third = block.convs
            h = conv_bn(conv_bn(conv_bn(x, first, True), second, True), third, False)
            shortcut = conv_bn(x, block.downsample, False) if block.downsample else x
            x = np.maximum(h + shortcut, 0.0)
            tap(taps, block.prefix, x.transpose(0, 3, 1, 2))
        pooled = tap(taps, "avgpool", x.mean(axis=(1, 2)))  # (B, features)
        return tap(taps, "fc", pooled @ w["fc.weight"].T + w["fc.bias"]), statistics


# -- numpy building blocks (channels-last) ------------------------------------------------------
def conv2d_nhwc(x: np.ndarray, weight: np.ndarray, stride: int, padding: int) -> np.ndarray:
    """(B, H, W, C) * (O, C, kh, kw) -> (B, Ho, Wo, O), no bias: strided windows, then one matmul."""
    out_channels, channels, kh, kw = weight.shape
    if padding:
        x = np.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
    b, h, wd, c = x.shape
    if c != channels:
        raise ValueError(f"conv input has {c} channels, weight expects {channels}")
    ho, wo = (h - kh) // stride + 1, (wd - kw) // stride + 1
    sb, sh, sw, sc = x.strides
    windows = np.lib.stride_tricks.as_strided(
        x, shape=(b, ho, wo, kh, kw, c), strides=(sb, sh * stride, sw * stride, sh, sw, sc), writeable=False
    )
    columns = windows.reshape(b * ho * wo, kh * kw * c)  # copies: the im2col matrix
    kernel = weight.transpose(2, 3, 1, 0).reshape(kh * kw * c, out_channels)
    return (columns @ kernel).reshape(b, ho, wo, out_channels)


def max_pool_nhwc(x: np.ndarray, kernel: int, stride: int, padding: int) -> np.ndarray:
    """Max over kernel x kernel windows; padding never wins (-inf)."""
    x = np.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)), constant_values=-np.inf)
    b, h, wd, c = x.shape
    ho, wo = (h - kernel) // stride + 1, (wd - kernel) // stride + 1
    sb, sh, sw, sc = x.strides
    windows = np.lib.stride_tricks.as_strided(
        x, shape=(b, ho, wo, c, kernel, kernel), strides=(sb, sh * stride, sw * stride, sc, sh, sw), writeable=False
    )
    return windows.max(axis=(4, 5))


def batch_norm(
    x: np.ndarray, scale: np.ndarray, bias: np.ndarray, mean: np.ndarray, var: np.ndarray, eps: float
) -> np.ndarray:
    """BN over the last (channel) axis with the given statistics: the running ones (inference) or the
    batch's mean and biased variance (training)."""
    return (x - mean) / np.sqrt(var + eps) * scale + bias


RESNET_TINY = ResNet(
    "resnet-tiny", ResNetConfig(blocks=(1, 1, 1, 1), width=16, image_size=64, num_classes=10), fit_phase=True
)
RESNET50 = ResNet("resnet50", ResNetConfig(blocks=(3, 4, 6, 3), width=64, image_size=224, num_classes=1000))
