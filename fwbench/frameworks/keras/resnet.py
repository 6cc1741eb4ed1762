"""ResNet v1.5 (bottleneck blocks) in Keras: Conv2D / BatchNormalization / MaxPooling2D / Dense, channels-last.

Input ``pixel_values``: (batch, H, W, 3) float32, NHWC — Keras' image layout; the backend transposes
the description's NCHW array once, outside the timed call → ``{"logits": (batch, classes)}``.
A functional model; each bottleneck block is a keras Layer named like torchvision's (``layer{k}_{j}``,
with ``conv{n}``, ``bn{n}``, ``downsample_0`` / ``downsample_1`` sublayers). Padding is explicit
(``ZeroPadding2D`` then a ``valid`` conv or pool), because Keras' ``same`` pads a stride-2 window
asymmetrically where torch pads both sides; zero padding before the max-pool equals torch's -inf
padding there, since the pool's input is a ReLU output (≥ 0). Batch norm runs in inference form
(``training=False``) on its moving statistics, loaded from the canonical running_mean / running_var.
Conv weights (out, in, kh, kw) become Conv2D kernels (kh, kw, in, out) when loading.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import layers, ops

from fwbench.frameworks.keras.weights import (OVERWRITTEN, Transform, conv_kernel, keras_device, load_canonical,
                                            transpose)
from fwbench.models.resnet import BN_SUFFIXES, Block, Conv, ResNet

# canonical BN suffix -> BatchNormalization variable name
_BN_NAMES = {"weight": "gamma", "bias": "beta", "running_mean": "moving_mean", "running_var": "moving_variance"}
assert set(_BN_NAMES) == set(BN_SUFFIXES)


def _conv(v: Conv, name: str) -> layers.Conv2D:
    return layers.Conv2D(v.out_channels, v.kernel, strides=v.stride, padding="valid", use_bias=False,
                         kernel_initializer=OVERWRITTEN, name=name)


def _pad(v: Conv, name: str) -> layers.Layer:
    return layers.ZeroPadding2D(v.padding, name=name) if v.padding else layers.Identity(name=name)


class Bottleneck(layers.Layer):
    """1x1 → 3x3 (stride here, v1.5) → 1x1 (4x channels), BN after each; ReLU after the sum."""

    def __init__(self, block: Block, eps: float, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.block = block
        first, second, third = block.convs
        self.conv1, self.bn1 = _conv(first, "conv1"), layers.BatchNormalization(epsilon=eps, name="bn1")
        self.pad2 = _pad(second, "pad2")
        self.conv2, self.bn2 = _conv(second, "conv2"), layers.BatchNormalization(epsilon=eps, name="bn2")
        self.conv3, self.bn3 = _conv(third, "conv3"), layers.BatchNormalization(epsilon=eps, name="bn3")
        self.downsample: tuple[layers.Conv2D, layers.BatchNormalization] | None = None
        if block.downsample is not None:
            self.downsample = (_conv(block.downsample, "downsample_0"),
                               layers.BatchNormalization(epsilon=eps, name="downsample_1"))

    def build(self, input_shape):  # type: ignore[no-untyped-def]
        pairs = [(self.conv1, self.bn1), (self.conv2, self.bn2), (self.conv3, self.bn3)]
        convs = list(self.block.convs)
        if self.downsample is not None:
            pairs.append(self.downsample)
            convs.append(self.block.downsample)
        for (conv, bn), v in zip(pairs, convs):
            conv.build((None, None, None, v.in_channels))
            bn.build((None, None, None, v.out_channels))

    def call(self, x, training=False):  # type: ignore[no-untyped-def]
        """(B, H, W, C) → (B, H / stride, W / stride, 4·width)."""
        shortcut = x
        if self.downsample is not None:
            conv, bn = self.downsample
            shortcut = bn(conv(x), training=training)
        h = ops.relu(self.bn1(self.conv1(x), training=training))
        h = ops.relu(self.bn2(self.conv2(self.pad2(h)), training=training))
        h = self.bn3(self.conv3(h), training=training)
        return ops.relu(h + shortcut)


def resnet_model(description: ResNet) -> keras.Model:
    c = description.config
    stem = description.stem
    pixels = keras.Input((c.image_size, c.image_size, c.in_channels), dtype="float32", name="pixel_values")
    x = _conv(stem, "conv1")(layers.ZeroPadding2D(stem.padding, name="conv1_pad")(pixels))
    x = layers.ReLU(name="relu")(layers.BatchNormalization(epsilon=c.bn_eps, name="bn1")(x))
    x = layers.MaxPooling2D(3, strides=2, name="maxpool")(layers.ZeroPadding2D(1, name="maxpool_pad")(x))
    for block in description.blocks:  # block.prefix "layer{k}.{j}" -> layer name "layer{k}_{j}"
        x = Bottleneck(block, c.bn_eps, name=block.prefix.replace(".", "_"))(x)
    x = layers.GlobalAveragePooling2D(name="avgpool")(x)  # (B, features)
    logits = layers.Dense(c.num_classes, kernel_initializer=OVERWRITTEN, name="fc")(x)  # (B, classes)
    return keras.Model({"pixel_values": pixels}, {"logits": logits}, name=description.name)


def build_model(description: ResNet, weights: dict[str, np.ndarray], device: str) -> keras.Model:
    """The ResNet with the canonical weights (torchvision names onto the matching variable paths)."""
    with keras.device(keras_device(device)):
        model = resnet_model(description)
    mapping = {"conv1.weight": "conv1/kernel"}
    mapping.update({f"bn1.{s}": f"bn1/{_BN_NAMES[s]}" for s in BN_SUFFIXES})
    for block in description.blocks:
        layer = block.prefix.replace(".", "_")
        for n, conv in enumerate(block.convs, start=1):
            mapping[f"{conv.name}.weight"] = f"{layer}/conv{n}/kernel"
            mapping.update({f"{conv.bn}.{s}": f"{layer}/bn{n}/{_BN_NAMES[s]}" for s in BN_SUFFIXES})
        if block.downsample is not None:
            mapping[f"{block.downsample.name}.weight"] = f"{layer}/downsample_0/kernel"
            mapping.update({f"{block.downsample.bn}.{s}": f"{layer}/downsample_1/{_BN_NAMES[s]}" for s in BN_SUFFIXES})
    transforms: dict[str, Transform] = {name: conv_kernel for name, path in mapping.items() if path.endswith("/kernel")}
    mapping.update({"fc.weight": "fc/kernel", "fc.bias": "fc/bias"})
    transforms["fc.weight"] = transpose  # (classes, features) -> Dense (features, classes)
    load_canonical(model, weights, mapping, transforms)
    return model
