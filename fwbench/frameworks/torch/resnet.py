"""ResNet v1.5 (bottleneck blocks) in PyTorch: nn.Conv2d / nn.BatchNorm2d / nn.MaxPool2d / nn.Linear.

Input ``pixel_values``: (batch, 3, H, W) float32, NCHW → ``(logits,)`` with logits (batch, classes).
Attribute names are torchvision's (``conv1``, ``bn1``, ``layer{k}.{j}.conv{n}``, ``.downsample.{0,1}``,
``fc``), so the weight map is an identity, spelled out. BN running statistics are buffers: they
are loaded through the same strict map as the parameters (``weights.load_canonical``).
Phase training: the backend puts the module in ``train()`` mode, so every nn.BatchNorm2d normalises with
the batch's statistics and updates its running buffers (momentum 0.1, unbiased running variance).
``taps``: the checkpoints (fwbench.models.checkpoints), recorded only when given a dict.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fwbench.frameworks.torch.weights import load_canonical
from fwbench.models.checkpoints import Taps, tap
from fwbench.models.resnet import BN_MOMENTUM, BN_SUFFIXES, Block, Conv, ResNet

LAYOUT = "NCHW"


def _bn(channels: int, eps: float) -> nn.BatchNorm2d:
    """BN with torch's running-statistics momentum (BN_MOMENTUM, 0.1: nn.BatchNorm2d's default)."""
    return nn.BatchNorm2d(channels, eps=eps, momentum=BN_MOMENTUM)


def _conv(v: Conv) -> nn.Conv2d:
    return nn.Conv2d(v.in_channels, v.out_channels, v.kernel, stride=v.stride, padding=v.padding, bias=False)


class Bottleneck(nn.Module):
    """1x1 → 3x3 (stride here, v1.5) → 1x1 (4x channels), BN after each; ReLU after the sum."""

    def __init__(self, block: Block, eps: float) -> None:
        super().__init__()
        first, second, third = block.convs
        self.conv1, self.bn1 = _conv(first), _bn(first.out_channels, eps)
        self.conv2, self.bn2 = _conv(second), _bn(second.out_channels, eps)
        self.conv3, self.bn3 = _conv(third), _bn(third.out_channels, eps)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if block.downsample is not None:
            self.downsample = nn.Sequential(_conv(block.downsample), _bn(block.downsample.out_channels, eps))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, H, W) -> (B, 4·width, H / stride, W / stride)
        shortcut = x if self.downsample is None else self.downsample(x)
        h = self.relu(self.bn1(self.conv1(x)))
        h = self.relu(self.bn2(self.conv2(h)))
        h = self.bn3(self.conv3(h))
        return self.relu(h + shortcut)


class ResNetModule(nn.Module):
    def __init__(self, description: ResNet) -> None:
        super().__init__()
        c = description.config
        self.conv1 = _conv(description.stem)
        self.bn1 = _bn(description.stem.out_channels, c.bn_eps)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        blocks = description.blocks
        start = 0
        for stage, count in enumerate(c.blocks):  # layer1..layerN: nn.Sequential, indexed like torchvision
            self.add_module(
                f"layer{stage + 1}", nn.Sequential(*(Bottleneck(b, c.bn_eps) for b in blocks[start : start + count]))
            )
            start += count
        self.stages = len(c.blocks)
        self.block_names = tuple(b.prefix for b in blocks)  # each block's checkpoint, in order
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c.features, c.num_classes)

    def forward(self, pixel_values: torch.Tensor, taps: Taps = None) -> tuple[torch.Tensor]:
        x = tap(taps, "stem", self.maxpool(self.relu(self.bn1(self.conv1(pixel_values)))))  # (B, width, H/4, W/4)
        index = 0
        for stage in range(self.stages):
            layer = getattr(self, f"layer{stage + 1}")
            if taps is None:  # the timed call: each stage's nn.Sequential, as torchvision calls it
                x = layer(x)
                continue
            for block in layer:  # each block, as nn.Sequential calls them, its output recorded
                x = tap(taps, self.block_names[index], block(x))
                index += 1
        pooled = tap(taps, "avgpool", torch.flatten(self.avgpool(x), 1))
        return (tap(taps, "fc", self.fc(pooled)),)  # (B, classes)


def build_model(description: ResNet, weights: dict[str, np.ndarray], device: str) -> ResNetModule:
    """The ResNet with the canonical weights (torchvision names onto the same attribute paths), on ``device``."""
    module = ResNetModule(description)
    mapping = {"conv1.weight": "conv1.weight", "fc.weight": "fc.weight", "fc.bias": "fc.bias"}
    mapping.update({f"bn1.{s}": f"bn1.{s}" for s in BN_SUFFIXES})
    for block in description.blocks:  # block.prefix "layer{k}.{j}" is also the nn.Sequential path
        for n, conv in enumerate(block.convs, start=1):
            mapping[f"{conv.name}.weight"] = f"{block.prefix}.conv{n}.weight"
            mapping.update({f"{conv.bn}.{s}": f"{block.prefix}.bn{n}.{s}" for s in BN_SUFFIXES})
        if block.downsample is not None:
            mapping[f"{block.downsample.name}.weight"] = f"{block.prefix}.downsample.0.weight"
            mapping.update({f"{block.downsample.bn}.{s}": f"{block.prefix}.downsample.1.{s}" for s in BN_SUFFIXES})
    load_canonical(module, weights, mapping)
    return module.to(device).eval()


def training_logits(module: ResNetModule, pixel_values: torch.Tensor) -> torch.Tensor:
    """The logits the training loss is taken of: (batch, classes), every BN on its batch statistics (the
    backend has put the module in train() mode; each call updates the running buffers)."""
    if not module.training:
        raise RuntimeError("ResNet training logits need the module in train() mode (batch-norm batch statistics)")
    return module(pixel_values)[0]
