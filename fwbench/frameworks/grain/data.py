"""``grain:dataloader``: a Grain ``DataLoader`` over an image dataset's files, what JAX users feed a training
loop with.

A random-access source of (JPEG path, label) in file order → an ``IndexSampler`` (one epoch per pass, no
shuffling) → a map transform that decodes with Pillow and applies fwbench.datasets.transforms (``center-crop``:
the numpy reference itself; ``random``: its crop sampling with the generator Grain hands each record, seeded by
Grain from the loader's seed and the record's position) → ``Batch``; ``worker_count`` worker processes. A batch
is (images float32 (B, crop, crop, 3), NHWC as the JAX models take it; labels int64 (B,); the images' indices in
file order (B,)). With worker processes, worker w transforms and batches the records w, w + W, ...: a batch's
images depend on the worker count (each image does not), so the indices come with the batch.

Grain reads absl flags: they are parsed (program name only) on import when nobody has, or Grain raises
``UnparsedFlagAccessError``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import grain.python as grain
import numpy as np
from absl import flags
from PIL import Image

from fwbench.datasets import images, transforms

LAYOUT = "NHWC"

if not flags.FLAGS.is_parsed():
    flags.FLAGS(sys.argv[:1])


Record = tuple[str, int, int]  # (absolute JPEG path, label, index in file order)


class JpegSource(grain.RandomAccessDataSource[Record]):
    """The records of a dataset folder's images, in file order."""

    def __init__(self, folder: Path) -> None:
        labels = images.read_labels(folder)
        self.records = [(str(folder / file), label, index) for index, (file, label) in enumerate(labels)]

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> Record:
        return self.records[index]


def _pixels(path: str) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


class CenterCrop(grain.MapTransform):
    """The ``center-crop`` transform of a record → (float32 (crop, crop, 3), label, index)."""

    def __init__(self, crop: int) -> None:
        self.crop = crop

    def map(self, element: Record) -> tuple[np.ndarray, int, int]:
        path, label, index = element
        return transforms.center_crop(_pixels(path), self.crop), label, index


class RandomCrop(grain.RandomMapTransform):
    """The ``random`` transform of a record, its numbers from Grain's per-record generator."""

    def __init__(self, crop: int) -> None:
        self.crop = crop

    def random_map(self, element: Record, rng: np.random.Generator) -> tuple[np.ndarray, int, int]:
        path, label, index = element
        pixels = _pixels(path)
        top, left, height, width = transforms.random_crop_box(rng, pixels.shape[0], pixels.shape[1])
        resized = transforms.resize_bilinear(pixels[top : top + height, left : left + width], self.crop, self.crop)
        return transforms.normalise(resized[:, ::-1] if rng.random() < 0.5 else resized), label, index


def make_loader(
    folder: Path,
    batch_size: int,
    workers: int,
    crop: int,
    transform: str = "center-crop",
    seed: int = 0,
    epochs: int = 1,
) -> Any:
    """A Grain DataLoader over ``folder``'s images in file order, ``epochs`` passes, ``workers`` worker processes
    (0: in this process) each keeping two batches buffered, the last incomplete batch dropped."""
    if transform not in transforms.TRANSFORMS:
        raise ValueError(f"unknown transform {transform!r}; known: {', '.join(transforms.TRANSFORMS)}")
    source = JpegSource(folder)
    sampler = grain.IndexSampler(
        num_records=len(source), num_epochs=epochs, shard_options=grain.NoSharding(), shuffle=False, seed=seed
    )
    operation = CenterCrop(crop) if transform == "center-crop" else RandomCrop(crop)
    return grain.DataLoader(
        data_source=source,
        sampler=sampler,
        operations=[operation, grain.Batch(batch_size, drop_remainder=True)],
        worker_count=workers,
        worker_buffer_size=2,
    )
