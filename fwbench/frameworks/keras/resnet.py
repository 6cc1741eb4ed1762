"""ResNet v1.5 (bottleneck blocks) in Keras: Conv2D / BatchNormalization / MaxPooling2D / Dense, channels-last.

Input ``pixel_values``: (batch, H, W, 3) float32, NHWC — Keras' image layout; the backend transposes
the description's NCHW array once, outside the timed call → ``{"logits": (batch, classes)}``.
A functional model; each bottleneck block is a keras Layer named like torchvision's (``layer{k}_{j}``,
with ``conv{n}``, ``bn{n}``, ``downsample_0`` / ``downsample_1`` sublayers). Padding is explicit
(``ZeroPadding2D`` then a ``valid`` conv or pool), because Keras' ``same`` pads a stride-2 window
asymmetrically where torch pads both sides; zero padding before the max-pool equals torch's -inf
padding there, since the pool's input is a ReLU output (≥ 0). Batch norm runs in inference form
(``training=False``) on its moving statistics, loaded from the canonical running_mean / running_var.
Conv weights (out, in, kh, kw) become Conv2D kernels (kh, kw, in, out) when loading. Each checkpoint
(fwbench.models.checkpoints) is the output of a layer called once (``checkpoint_layers``): ``checkpoint_model``.

Phase training (``training_model``, trained by ``train_on_batch``, which calls the model with
``training=True``): every :class:`BatchNorm` normalises with its batch's mean and biased variance and
updates its moving statistics itself, as Keras' BatchNormalization does, with ``momentum`` 0.9 (Keras'
convention for torch's 0.1, BN_MOMENTUM) and one difference: the moving variance averages the *unbiased*
batch variance (n/(n − 1)·biased, n = N·H·W), as torch does, where Keras' own layer averages the biased
one. The moving statistics are non-trainable variables (no gradient, no weight decay); gamma and beta train.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import layers, ops

from fwbench.frameworks.keras.weights import OVERWRITTEN, keras_device, load_canonical
from fwbench.models.resnet import BN_MOMENTUM, BN_SUFFIXES, Block, Conv, ResNet
from fwbench.models.weightmap import Transform, hwio, transpose

LAYOUT = "NHWC"  # Keras' image layout (channels_last): the backend transposes the NCHW pixel_values once

# canonical BN suffix -> BatchNormalization variable name
_BN_NAMES = {"weight": "gamma", "bias": "beta", "running_mean": "moving_mean", "running_var": "moving_variance"}
assert set(_BN_NAMES) == set(BN_SUFFIXES)


class BatchNorm(layers.BatchNormalization):
    """Keras' BatchNormalization (momentum 1 − BN_MOMENTUM), whose training call updates the moving variance
    from the unbiased batch variance, as torch does (Keras' own layer uses the biased one there). Inference,
    and normalisation in training (batch mean, biased variance), are Keras' own. Training computes its
    statistics and normalises in float32 (also under mixed_bfloat16, as Keras' own layer); masks and batch
    renormalisation are Keras' own code path."""

    def __init__(self, epsilon: float, name: str) -> None:
        super().__init__(momentum=1.0 - BN_MOMENTUM, epsilon=epsilon, name=name)

    def call(self, inputs, training=None, mask=None):  # type: ignore[no-untyped-def]
        if not (training and self.trainable) or mask is not None or self.renorm:
            return super().call(inputs, training=training, mask=mask)
        x = ops.cast(inputs, "float32")
        mean, variance = self._moments(x, None)  # over every axis but the channels; biased
        count = ops.cast(ops.size(x), "float32") / x.shape[self.axis]
        unbiased = ops.stop_gradient(variance) * count / (count - 1.0)
        m = self.momentum
        self.moving_mean.assign(self.moving_mean * m + ops.stop_gradient(mean) * (1.0 - m))
        self.moving_variance.assign(self.moving_variance * m + unbiased * (1.0 - m))
        outputs = ops.batch_normalization(
            x, mean, variance, axis=self.axis, offset=self.beta, scale=self.gamma, epsilon=self.epsilon
        )
        return ops.cast(outputs, self.compute_dtype)


def _conv(v: Conv, name: str) -> layers.Conv2D:
    return layers.Conv2D(
        v.out_channels,
        v.kernel,
        strides=v.stride,
        padding="valid",
        use_bias=False,
        kernel_initializer=OVERWRITTEN,
        name=name,
    )


def _pad(v: Conv, name: str) -> layers.Layer:
    return layers.ZeroPadding2D(v.padding, name=name) if v.padding else layers.Identity(name=name)


class Bottleneck(layers.Layer):
    """1x1 → 3x3 (stride here, v1.5) → 1x1 (4x channels), BN after each; ReLU after the sum."""

    def __init__(self, block: Block, eps: float, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.block = block
        first, second, third = block.convs
        self.conv1, self.bn1 = _conv(first, "conv1"), BatchNorm(eps, name="bn1")
        self.pad2 = _pad(second, "pad2")
        self.conv2, self.bn2 = _conv(second, "conv2"), BatchNorm(eps, name="bn2")
        self.conv3, self.bn3 = _conv(third, "conv3"), BatchNorm(eps, name="bn3")
        self.downsample: tuple[layers.Conv2D, BatchNorm] | None = None
        if block.downsample is not None:
            self.downsample = (_conv(block.downsample, "downsample_0"), BatchNorm(eps, name="downsample_1"))

    def build(self, input_shape):  # type: ignore[no-untyped-def]
        pairs = [(self.conv1, self.bn1), (self.conv2, self.bn2), (self.conv3, self.bn3)]
        convs = list(self.block.convs)
        if self.downsample is not None:
            assert self.block.downsample is not None
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
    x = layers.ReLU(name="relu")(BatchNorm(c.bn_eps, name="bn1")(x))
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
    transforms: dict[str, Transform] = {name: hwio for name, path in mapping.items() if path.endswith("/kernel")}
    mapping.update({"fc.weight": "fc/kernel", "fc.bias": "fc/bias"})
    transforms["fc.weight"] = transpose  # (classes, features) -> Dense (features, classes)
    load_canonical(model, weights, mapping, transforms)
    return model


def checkpoint_layers(description: ResNet) -> dict[str, str]:
    """Each checkpoint (``description.checkpoint_names()``) → the layer of the functional model whose output it
    is (each called once): the stem's max-pool, every bottleneck block (after its residual ReLU), the average
    pool, the classifier."""
    layer_names = {"stem": "maxpool", "avgpool": "avgpool", "fc": "fc"}
    layer_names.update({block.prefix: block.prefix.replace(".", "_") for block in description.blocks})
    return {name: layer_names[name] for name in description.checkpoint_names()}


def checkpoint_model(model: keras.Model, description: ResNet) -> keras.Model:
    """The functional model sharing ``model``'s layers and variables whose outputs are ``model``'s and every
    checkpoint by its name (fwbench.models.checkpoints); the image checkpoints NHWC, as the model computes
    (the backend transposes them to the canonical NCHW)."""
    taps = {name: model.get_layer(layer).output for name, layer in checkpoint_layers(description).items()}
    return keras.Model(model.input, {**model.output, **taps}, name=f"{model.name}_checkpoints")


def training_model(model: keras.Model, description: ResNet) -> keras.Model:
    """The model train_on_batch trains: the same layers, the logits (batch, classes) as its one output; with
    ``training=True`` every BatchNorm uses batch statistics and updates its moving ones."""
    return keras.Model(model.input, model.output["logits"], name=f"{model.name}_training")
