"""Seeded JPEG images of varied size with class labels: what an image-classification input pipeline reads.

Each image is a colour gradient with a few filled ellipses and rectangles and mild noise (photograph-like JPEG
sizes, unlike flat colour or pure noise), its width and height drawn independently from ±25% around ``size``.
Its label (0 … classes − 1) sets the gradient's hue. Written with Pillow at quality 90; same arguments, same
bytes (on the same Pillow / libjpeg build: ``manifest.json`` holds every file's digest).
"""

from __future__ import annotations

import colorsys
import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from fwbench.datasets.manifest import Manifest, write_manifest

IMAGES = "images"  # the folder of JPEG files inside a dataset folder
LABELS = "labels.csv"  # file,label per image, in file order
SIZE_SPREAD = 0.25  # width and height within size × (1 ± SIZE_SPREAD)
JPEG_QUALITY = 90
NOISE_STD = 6.0  # pixel noise, uint8 units


@dataclass(frozen=True)
class ImageRecord:
    """One image of a dataset: its path relative to the dataset folder, its label, its (height, width)."""

    file: str
    label: int
    height: int
    width: int


@dataclass(frozen=True)
class LoaderInput:
    """The images a loader (a framework's ``data.py``: DataLoader, tf.data, Grain) reads, and how: ``folder`` (a
    dataset of ``fwbench data make images``), ``workers`` workers, the ``transform`` cropped to ``crop`` px,
    seeded; ``exclude``: files left out (corrupt, --skip-corrupt). What a data cell times and what a fit from
    images trains on."""

    folder: Path
    crop: int
    transform: str
    workers: int
    seed: int
    exclude: frozenset[str] = frozenset()


def dataset_name(size: int) -> str:
    """The name a data cell stores as its model: "images-<size>"."""
    return f"images-{size}"


def _picture(rng: np.random.Generator, height: int, width: int, label: int, classes: int) -> np.ndarray:
    """(height, width, 3) uint8: a gradient of the label's hue, 3–6 shapes, noise."""
    hue = (label + rng.uniform(-0.3, 0.3)) / classes
    start = np.array(colorsys.hsv_to_rgb(hue % 1.0, 0.6, 0.9)) * 255
    end = np.array(colorsys.hsv_to_rgb((hue + 0.15) % 1.0, 0.8, 0.4)) * 255
    ramp = np.linspace(0.0, 1.0, width)[None, :, None] * np.ones((height, 1, 1))
    image = Image.fromarray(((1 - ramp) * start + ramp * end).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(3, 7))):
        x0, x1 = sorted(rng.integers(0, width, 2).tolist())
        y0, y1 = sorted(rng.integers(0, height, 2).tolist())
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        shape = draw.ellipse if rng.random() < 0.5 else draw.rectangle
        shape((x0, y0, x1 + 1, y1 + 1), fill=colour)
    pixels = np.asarray(image, dtype=np.float64) + rng.normal(0.0, NOISE_STD, (height, width, 3))
    return np.clip(np.rint(pixels), 0, 255).astype(np.uint8)


def write_images(out: Path, n: int, size: int, seed: int = 0, classes: int = 10) -> dict[str, int]:
    """Write ``n`` JPEG images around ``size`` px into ``out/images/`` and ``out/labels.csv``. Returns the
    generator's arguments (what the manifest records)."""
    if n < 1 or size < 8 or classes < 1:
        raise ValueError(f"need n ≥ 1, size ≥ 8 and classes ≥ 1 (got n={n}, size={size}, classes={classes})")
    folder = out / IMAGES
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    low, high = round(size * (1 - SIZE_SPREAD)), round(size * (1 + SIZE_SPREAD))
    records = []
    for index in range(n):
        height, width = (int(v) for v in rng.integers(low, high + 1, 2))
        label = int(rng.integers(0, classes))
        file = f"{IMAGES}/{index:06d}.jpg"
        Image.fromarray(_picture(rng, height, width, label, classes)).save(out / file, quality=JPEG_QUALITY)
        records.append(ImageRecord(file, label, height, width))
    with (out / LABELS).open("w", newline="") as stream:
        writer = csv.writer(stream)
        writer.writerow(["file", "label"])
        writer.writerows((r.file, r.label) for r in records)
    return {"n": n, "size": size, "seed": seed, "classes": classes, "quality": JPEG_QUALITY}


def make_images(out: Path, n: int, size: int, seed: int = 0, classes: int = 10) -> Manifest:
    """:func:`write_images` and the folder's manifest (no packed variants). Returns the manifest."""
    return write_manifest(out, "images", dataset_name(size), write_images(out, n, size, seed, classes))


def read_labels(folder: Path, exclude: frozenset[str] = frozenset()) -> list[tuple[str, int]]:
    """(file relative to ``folder``, label) of every image of a dataset folder but those in ``exclude``, in file
    order."""
    with (folder / LABELS).open(newline="") as stream:
        return [(row["file"], int(row["label"])) for row in csv.DictReader(stream) if row["file"] not in exclude]
