"""``torch:dataloader``: a map-style ``Dataset`` that decodes each JPEG with Pillow (what DataLoader users do:
torchvision does not import beside this torch build) and a ``DataLoader`` over it.

The ``center-crop`` transform is fwbench.datasets.transforms' (central square, bilinear resize without
antialiasing by ``torch.nn.functional.interpolate``, ImageNet normalisation); a batch is (images float32
(B, 3, crop, crop), NCHW as the torch models take it; labels int64 (B,)).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from fwbench.datasets import images, transforms

LAYOUT = "NCHW"


class JpegFolder(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """The images of a dataset folder (``fwbench data make images``), in file order, each decoded and
    transformed when read (in the loader's worker processes when it has some)."""

    def __init__(self, folder: Path, crop: int) -> None:
        self.folder, self.crop = folder, crop
        self.labels = images.read_labels(folder)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        file, label = self.labels[index]
        with Image.open(self.folder / file) as image:
            pixels = np.array(image.convert("RGB"))  # a writable copy: torch.from_numpy shares it
        top, left, side = transforms.central_square(pixels.shape[0], pixels.shape[1])
        square = torch.from_numpy(pixels[top : top + side, left : left + side])
        chw = square.permute(2, 0, 1).unsqueeze(0).to(torch.float32)  # (1, 3, side, side)
        resized = F.interpolate(chw, size=(self.crop, self.crop), mode="bilinear", align_corners=False, antialias=False)
        mean = torch.from_numpy(transforms.MEAN).view(3, 1, 1)
        std = torch.from_numpy(transforms.STD).view(3, 1, 1)
        return (resized[0] / 255.0 - mean) / std, label


def make_loader(folder: Path, batch_size: int, workers: int, crop: int) -> torch.utils.data.DataLoader[Any]:
    """A DataLoader over ``folder``'s images in file order, ``workers`` worker processes (0: in this process),
    each keeping two batches prefetched and alive across epochs, the last incomplete batch dropped."""
    return torch.utils.data.DataLoader(
        JpegFolder(folder, crop),
        batch_size=batch_size,
        shuffle=False,
        num_workers=workers,
        prefetch_factor=2 if workers else None,
        persistent_workers=workers > 0,
        drop_last=True,
    )
