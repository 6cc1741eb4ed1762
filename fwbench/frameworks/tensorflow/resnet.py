"""ResNet v1.5 (bottleneck blocks) in TensorFlow: tf.nn.conv2d / tf.nn.max_pool2d / tf.matmul (tf.Module, not Keras).

Input ``pixel_values``: (batch, 3, H, W) float32, NCHW → ``(logits,)`` with logits (batch, classes).
Layout: NHWC internally, NCHW at the boundary. TensorFlow's CPU convolutions want channels-last, so
the first op of ``__call__`` transposes the input NCHW → NHWC (inside the timed call, so every
framework is fed the same NCHW tensor), and each conv kernel is transposed once, when loading, from
the canonical (out, in, kh, kw) to HWIO (kh, kw, in, out). ``fc`` kernel is (in, out), transposed
once when loading. Padding is explicit and symmetric, as torch's: ``"SAME"`` pads a stride-2 conv
or pool asymmetrically (more at the end), so it is never used; the max-pool pads with -inf and pools
``VALID``. Attribute names follow torchvision (``conv1``, ``blocks[i]`` = ``layer{k}.{j}``,
``.conv{n}``, ``.downsample``, ``fc``), each conv holding the BN after it.
Batch norm in inference form, ``(x - running_mean)·(weight / √(running_var + eps)) + bias``, is
computed as ``x·scale + shift`` with ``scale`` and ``shift`` precomputed (float32) when loading from
the four canonical tensors, each used once (torch's eval BN is one fused op as well); ``scale`` and
``shift`` are not trainable.
``taps``: the checkpoints (fwbench.models.checkpoints), recorded as computed (image ones NHWC) only when given a
dict; the backend hands them on NCHW.

Phase training (``training_logits``): the four BN tensors are kept as variables too (``weight`` and
``bias`` trainable, ``running_mean`` and ``running_var`` not), and every BN normalises with its batch's
mean and biased variance over (N, H, W) (``tf.nn.moments``), assigning the running statistics inside the
step (so inside the tf.function / XLA program): ``(1 − m)·running + m·batch``, m = BN_MOMENTUM (torch's
0.1), the unbiased batch variance for the variance, with no gradient through the update.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from fwbench.frameworks.tensorflow import precision
from fwbench.frameworks.tensorflow.bert import dense
from fwbench.frameworks.tensorflow.weights import CanonicalVariables, MakeVariable
from fwbench.models.checkpoints import Taps, tap
from fwbench.models.resnet import BN_MOMENTUM, Block, Conv, ResNet
from fwbench.models.weightmap import hwio, identity, transpose

LAYOUT = "NHWC inside the call (NCHW input transposed as its first op)"


def explicit_padding(padding: int) -> str | list[list[int]]:
    """Symmetric NHWC padding for tf.nn.conv2d (``VALID`` when there is none)."""
    return "VALID" if padding == 0 else [[0, 0], [padding, padding], [padding, padding], [0, 0]]


def max_pool(x: tf.Tensor, kernel: int = 3, stride: int = 2, padding: int = 1) -> tf.Tensor:
    """torch's MaxPool2d(3, 2, 1) on NHWC: pad with -inf (padding never wins), then a VALID pool."""
    x = tf.pad(x, [[0, 0], [padding, padding], [padding, padding], [0, 0]], constant_values=float("-inf"))
    return tf.nn.max_pool2d(x, kernel, stride, "VALID")


class ConvBN(tf.Module):
    """A bias-free conv (HWIO kernel, explicit symmetric padding) and the BN after it: inference form (folded
    ``scale`` and ``shift``) or training form (batch statistics, running statistics updated)."""

    def __init__(self, v: Conv, eps: float, variable: MakeVariable) -> None:
        super().__init__(name=v.name.replace(".", "_"))
        self.kernel = variable(f"{v.name}.weight", (v.kernel, v.kernel, v.in_channels, v.out_channels), hwio)
        shape = (v.out_channels,)
        self.weight, self.bias = (variable(f"{v.bn}.{s}", shape, identity) for s in ("weight", "bias"))
        self.running_mean, self.running_var = (
            variable(f"{v.bn}.{s}", shape, identity, trainable=False) for s in ("running_mean", "running_var")
        )
        scale = self.weight / tf.sqrt(self.running_var + eps)
        self.scale = tf.Variable(scale, name=f"{v.bn}.scale".replace(".", "_"), trainable=False)
        self.shift = tf.Variable(
            self.bias - self.running_mean * scale, name=f"{v.bn}.shift".replace(".", "_"), trainable=False
        )
        self.stride, self.padding, self.eps = v.stride, v.padding, eps

    def fold(self) -> None:
        """Recompute the inference ``scale`` and ``shift`` from the current BN weight, bias and running statistics
        (after training changed them), as loading does."""
        scale = self.weight / tf.sqrt(self.running_var + self.eps)
        self.scale.assign(scale)
        self.shift.assign(self.bias - self.running_mean * scale)

    def __call__(self, x: tf.Tensor, training: bool = False) -> tf.Tensor:
        """(B, H, W, in) -> (B, H / stride, W / stride, out); the BN computes in float32 and hands on the conv's
        dtype (bfloat16 under bf16, as torch's mixed-dtype batch norm)."""
        low = precision.conv2d(x, self.kernel, self.stride, explicit_padding(self.padding))
        with precision.batch_norm_scope():
            y = tf.cast(low, tf.float32)
            if not training:
                return tf.cast(y * self.scale + self.shift, low.dtype)
            mean, var = tf.nn.moments(y, axes=[0, 1, 2])  # biased variance, as BN normalises
            count = y.shape[0] * y.shape[1] * y.shape[2]  # static: the step's input signature is fixed
            m = BN_MOMENTUM
            batch_mean, batch_var = tf.stop_gradient(mean), tf.stop_gradient(var)
            self.running_mean.assign((1 - m) * self.running_mean + m * batch_mean)
            self.running_var.assign((1 - m) * self.running_var + m * batch_var * (count / (count - 1)))
            return tf.cast(tf.nn.batch_normalization(y, mean, var, self.bias, self.weight, self.eps), low.dtype)


class Bottleneck(tf.Module):
    """1x1 → 3x3 (stride here, v1.5) → 1x1 (4x channels), BN after each; ReLU after the sum."""

    def __init__(self, block: Block, eps: float, variable: MakeVariable) -> None:
        super().__init__(name=block.prefix.replace(".", "_"))
        self.prefix = block.prefix  # its checkpoint's name
        first, second, third = block.convs
        self.conv1 = ConvBN(first, eps, variable)
        self.conv2 = ConvBN(second, eps, variable)
        self.conv3 = ConvBN(third, eps, variable)
        self.downsample: ConvBN | None = None
        if block.downsample is not None:
            self.downsample = ConvBN(block.downsample, eps, variable)

    def __call__(self, x: tf.Tensor, training: bool = False) -> tf.Tensor:
        """(B, H, W, C) -> (B, H / stride, W / stride, 4·width)."""
        shortcut = x if self.downsample is None else self.downsample(x, training)
        h = tf.nn.relu(self.conv1(x, training))
        h = tf.nn.relu(self.conv2(h, training))
        h = self.conv3(h, training)
        return tf.nn.relu(h + shortcut)


class ResNetModule(tf.Module):
    def __init__(self, description: ResNet, weights: dict[str, np.ndarray]) -> None:
        super().__init__(name=description.arch)
        c = description.config
        canonical = CanonicalVariables(weights)
        variable = canonical.take
        self.conv1 = ConvBN(description.stem, c.bn_eps, variable)  # conv1 + bn1
        # layer1.0, ..., layerN.{last}: one flat list, in torchvision's order
        self.blocks = [Bottleneck(b, c.bn_eps, variable) for b in description.blocks]
        self.fc = (
            variable("fc.weight", (c.features, c.num_classes), transpose),
            variable("fc.bias", (c.num_classes,), identity),
        )
        canonical.check_all_used()

    def __call__(self, pixel_values: tf.Tensor, taps: Taps = None) -> tuple[tf.Tensor]:
        return (self.forward(pixel_values, training=False, taps=taps),)

    def forward(self, pixel_values: tf.Tensor, training: bool, taps: Taps = None) -> tf.Tensor:
        """NCHW pixels → logits (B, classes); ``training``: BN on batch statistics, running ones updated."""
        x = tf.transpose(pixel_values, [0, 2, 3, 1])  # NCHW -> NHWC, inside the timed call
        x = tap(taps, "stem", max_pool(tf.nn.relu(self.conv1(x, training))))  # (B, H/4, W/4, width)
        for block in self.blocks:
            x = tap(taps, block.prefix, block(x, training))
        pooled = tap(taps, "avgpool", tf.reduce_mean(x, axis=[1, 2]))
        return tap(taps, "fc", dense(pooled, *self.fc))  # (B, classes)


def build_model(description: ResNet, weights: dict[str, np.ndarray], device: str) -> ResNetModule:
    """The ResNet with the canonical weights (torchvision names, each mapped once), its variables on ``device``."""
    with tf.device("/GPU:0" if device == "cuda" else "/CPU:0"):
        return ResNetModule(description, weights)


def inference_logits(module: ResNetModule, pixel_values: tf.Tensor) -> tf.Tensor:
    """(batch, classes) logits in inference form with the current variables (phase fit's evaluation after
    training): every BN's scale and shift refolded from its trained weight, bias and running statistics first."""
    for conv_bn in module.submodules:
        if isinstance(conv_bn, ConvBN):
            conv_bn.fold()
    return module(pixel_values)[0]


def training_logits(module: ResNetModule, pixel_values: tf.Tensor) -> tf.Tensor:
    """The logits the training loss is taken of: (batch, classes), BN in training form (each call assigns
    the running statistics)."""
    return module.forward(pixel_values, training=True)
