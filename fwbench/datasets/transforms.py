"""The data phase's image transform, written once in numpy: the reference every loader's batches are checked
against. Images are uint8 (height, width, 3) RGB; results float32 (crop, crop, 3), normalised.

``center-crop`` (deterministic, for parity): the central square of the image (side min(height, width), offsets
rounded down), resized to ``crop`` × ``crop`` bilinearly **without antialiasing** (half-pixel centres, edge
samples clamped: ``tf.image.resize(antialias=False)`` and ``torch.nn.functional.interpolate(mode="bilinear",
align_corners=False, antialias=False)``; Pillow's BILINEAR antialiases when it shrinks, so it is not used), then
scaled to [0, 1] and normalised with the ImageNet mean and standard deviation.

``random`` (training augmentation): a random-resized crop (area 8–100% of the image, aspect ratio 3/4–4/3,
torchvision's ``RandomResizedCrop`` sampling: 10 tries, then the central crop of the clamped ratio) resized to
``crop`` × ``crop`` the same way, flipped left-right with probability 1/2, normalised. Its random numbers come
from ``numpy.random.default_rng((seed, epoch, index))``: the same seed gives the same crops whatever the number of
loader workers or the order they finish in; each epoch draws new ones.
"""

from __future__ import annotations

import math

import numpy as np

TRANSFORMS = ("center-crop", "random")
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)  # ImageNet, per RGB channel, [0, 1] scale
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def central_square(height: int, width: int) -> tuple[int, int, int]:
    """(top, left, side) of the central square of a height × width image."""
    side = min(height, width)
    return (height - side) // 2, (width - side) // 2, side


def _axis_weights(size_in: int, size_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each output index along one axis: the two input indices and the weight of the second (half-pixel
    centres, source coordinates clamped to the edge samples)."""
    centres = (np.arange(size_out, dtype=np.float64) + 0.5) * (size_in / size_out) - 0.5
    centres = np.clip(centres, 0.0, size_in - 1)
    low = np.floor(centres).astype(np.int64)
    high = np.minimum(low + 1, size_in - 1)
    return low, high, (centres - low).astype(np.float32)


def resize_bilinear(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """``image`` (h, w, c) resized to (height, width, c) float32, bilinear without antialiasing."""
    pixels = image.astype(np.float32)
    top, bottom, wy = _axis_weights(pixels.shape[0], height)
    left, right, wx = _axis_weights(pixels.shape[1], width)
    rows = pixels[top] * (1 - wy)[:, None, None] + pixels[bottom] * wy[:, None, None]
    return rows[:, left] * (1 - wx)[None, :, None] + rows[:, right] * wx[None, :, None]


def normalise(pixels: np.ndarray) -> np.ndarray:
    """Pixel values 0–255 → (value / 255 − MEAN) / STD, float32."""
    return ((pixels.astype(np.float32) / 255.0 - MEAN) / STD).astype(np.float32)


def center_crop(image: np.ndarray, crop: int) -> np.ndarray:
    """The ``center-crop`` transform of a uint8 (h, w, 3) image: float32 (crop, crop, 3)."""
    top, left, side = central_square(image.shape[0], image.shape[1])
    return normalise(resize_bilinear(image[top : top + side, left : left + side], crop, crop))


SCALE = (0.08, 1.0)  # random crop: share of the image's area
RATIO = (3 / 4, 4 / 3)  # random crop: width / height
TRIES = 10


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The random numbers of one sample's ``random`` transform."""
    return np.random.default_rng((seed, epoch, index))


def random_crop_box(rng: np.random.Generator, height: int, width: int) -> tuple[int, int, int, int]:
    """(top, left, crop height, crop width) of a random-resized crop (torchvision's sampling)."""
    area = height * width
    for _ in range(TRIES):
        target = area * rng.uniform(*SCALE)
        aspect = math.exp(rng.uniform(math.log(RATIO[0]), math.log(RATIO[1])))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
    ratio = width / height
    if ratio < RATIO[0]:
        w, h = width, round(width / RATIO[0])
    elif ratio > RATIO[1]:
        h, w = height, round(height * RATIO[1])
    else:
        h, w = height, width
    return (height - h) // 2, (width - w) // 2, h, w


def check_transform(name: str) -> None:
    """ValueError (one line) unless ``name`` is one of TRANSFORMS."""
    if name not in TRANSFORMS:
        raise ValueError(f"unknown transform {name!r}; known: {', '.join(TRANSFORMS)}")


def random_params(rng: np.random.Generator, height: int, width: int) -> tuple[tuple[int, int, int, int], bool]:
    """The crop box and whether to flip, drawn from ``rng`` in that order (a sample's generator:
    :func:`sample_rng`, or the one Grain hands a record)."""
    box = random_crop_box(rng, height, width)
    return box, bool(rng.random() < 0.5)


def random_crop_from(image: np.ndarray, crop: int, rng: np.random.Generator) -> np.ndarray:
    """The ``random`` transform of a uint8 (h, w, 3) image with the numbers of ``rng``: float32 (crop, crop, 3)."""
    (top, left, h, w), flip = random_params(rng, image.shape[0], image.shape[1])
    resized = resize_bilinear(image[top : top + h, left : left + w], crop, crop)
    return normalise(resized[:, ::-1] if flip else resized)


def random_crop(image: np.ndarray, crop: int, seed: int, epoch: int, index: int) -> np.ndarray:
    """The ``random`` transform of a uint8 (h, w, 3) image, sample ``index`` of ``epoch``: float32 (crop, crop, 3)."""
    return random_crop_from(image, crop, sample_rng(seed, epoch, index))
