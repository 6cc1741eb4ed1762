"""The data phase's loaders (torch DataLoader, tf.data, Grain) give the reference transform's batches.

With the deterministic ``center-crop`` transform every loader's batches must equal fwbench.datasets.transforms'
numpy reference up to the JPEG decoders: Pillow and ``tf.io.decode_jpeg(dct_method="INTEGER_ACCURATE")`` both
run libjpeg's exact integer IDCT (measured identical on this project's builds, docs/data.md), and the limit
allows one uint8 level anywhere, the difference a decoder built otherwise may make. The torch DataLoader's and
Grain's batches with 2 worker processes are the matrix's (``make test-matrix``); ``make test`` starts their workers
in the random-transform checks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from fwbench.datasets import images, transforms

# Each xdist process is pinned to one core, below the 2 workers some tests start: torch warns, and that is meant.
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create 2 worker processes:UserWarning")
CROP, BATCH = 32, 4
# The xdist process that runs these may have imported JAX or TensorFlow (multithreaded): forking it could
# deadlock a worker, so the torch loaders' workers start from a fork server (torch's default, fork, is what the
# data phase's own fresh worker processes use).
START = "forkserver"
ONE_LEVEL = 1.0 / (255.0 * float(transforms.STD.min()))  # one uint8 step after normalisation


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("images")
    images.make_images(folder, n=10, size=64, seed=5)
    from fwbench.frameworks.tensorflow.data import write_packed as write_tfrecords

    write_tfrecords(folder, images.read_labels(folder), 3)  # 10 images in 3 shards: 4, 3, 3
    from fwbench.frameworks.grain.data import write_packed as write_array_records

    write_array_records(folder, images.read_labels(folder), 3)  # 10 images in 3 files: 3, 3, 4
    return folder


def _reference(folder: Path) -> tuple[np.ndarray, list[int]]:
    """Every image through the numpy transform, (N, CROP, CROP, 3), and the labels, in file order."""
    labels = images.read_labels(folder)
    pixels = [np.asarray(Image.open(folder / file).convert("RGB")) for file, _ in labels]
    return np.stack([transforms.center_crop(p, CROP) for p in pixels]), [label for _, label in labels]


def test_reference_resize_is_bilinear_without_antialiasing() -> None:
    ramp = np.tile(np.arange(8, dtype=np.uint8)[None, :, None] * 10, (2, 1, 1))  # (2, 8, 1): 0, 10, ..., 70
    # halving: half-pixel centres fall between two samples, their mean (no wider antialiasing filter)
    assert np.allclose(transforms.resize_bilinear(ramp, 2, 4)[0, :, 0], [5, 25, 45, 65])
    # doubling: the edge samples are clamped
    assert np.allclose(transforms.resize_bilinear(ramp[:, :2], 2, 4)[0, :, 0], [0, 2.5, 7.5, 10])
    assert transforms.central_square(5, 9) == (0, 2, 5) and transforms.central_square(9, 4) == (2, 0, 4)


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.matrix)])
def test_torch_dataloader_batches_are_the_reference(dataset: Path, workers: int) -> None:
    from fwbench.frameworks.torch import data

    expected, labels = _reference(dataset)
    batches = list(data.make_loader(dataset, BATCH, workers, CROP, start_method=START))
    assert len(batches) == len(labels) // BATCH  # the incomplete last batch dropped
    got = np.concatenate([b.numpy() for b, _ in batches]).transpose(0, 2, 3, 1)  # NCHW → NHWC
    assert got.dtype == np.float32 and got.shape == (8, CROP, CROP, 3)
    assert np.abs(got - expected[:8]).max() <= ONE_LEVEL + 1e-4
    assert np.concatenate([y.numpy() for _, y in batches]).tolist() == labels[:8]


@pytest.mark.parametrize(("workers", "source"), [(0, "files"), (2, "files"), (2, "tfrecord")])
def test_tf_data_batches_are_the_reference(dataset: Path, workers: int, source: str) -> None:
    from fwbench.frameworks.tensorflow import data

    expected, labels = _reference(dataset)
    batches = list(data.make_loader(dataset, BATCH, workers, CROP, source=source))
    assert len(batches) == len(labels) // BATCH
    got = np.concatenate([b.numpy() for b, _ in batches])
    assert got.dtype == np.float32 and got.shape == (8, CROP, CROP, 3)
    assert np.abs(got - expected[:8]).max() <= ONE_LEVEL + 1e-4
    assert np.concatenate([y.numpy() for _, y in batches]).tolist() == labels[:8]


def _stack(batches: list[Any], nchw: bool) -> np.ndarray:
    images_ = np.concatenate([np.asarray(b) for b, _ in batches])
    return images_.transpose(0, 2, 3, 1) if nchw else images_


def test_reference_random_transform_is_seeded_per_sample_and_epoch() -> None:
    image = np.asarray(np.random.default_rng(0).integers(0, 256, (40, 60, 3)), dtype=np.uint8)
    first = transforms.random_crop(image, CROP, seed=7, epoch=0, index=3)
    assert np.array_equal(first, transforms.random_crop(image, CROP, seed=7, epoch=0, index=3))
    assert not np.array_equal(first, transforms.random_crop(image, CROP, seed=7, epoch=1, index=3))
    assert not np.array_equal(first, transforms.random_crop(image, CROP, seed=8, epoch=0, index=3))
    boxes = [transforms.random_crop_box(transforms.sample_rng(7, 0, i), 40, 60) for i in range(200)]
    for top, left, h, w in boxes:  # inside the image, area and aspect within the sampling ranges or the fallback
        assert 0 <= top and top + h <= 40 and 0 <= left and left + w <= 60
    assert len(set(boxes)) > 150


def test_torch_random_transform_is_reproducible_whatever_the_workers(dataset: Path) -> None:
    from fwbench.frameworks.torch import data

    loader = data.make_loader(dataset, BATCH, 2, CROP, transform="random", seed=7, start_method=START)
    epoch0, epoch1 = _stack(list(loader), nchw=True), _stack(list(loader), nchw=True)
    again = _stack(list(data.make_loader(dataset, BATCH, 0, CROP, transform="random", seed=7)), nchw=True)
    assert np.array_equal(epoch0, again)  # same seed, same epoch: the same batches with 2 workers or none
    assert not np.allclose(epoch0, epoch1)  # the next epoch draws new crops
    labels = images.read_labels(dataset)
    expected = np.stack(
        [
            transforms.random_crop(np.asarray(Image.open(dataset / file).convert("RGB")), CROP, 7, 0, index)
            for index, (file, _) in enumerate(labels[:8])
        ]
    )
    assert np.abs(epoch0 - expected).max() <= ONE_LEVEL + 1e-4  # the numpy reference's crops and flips


def test_tf_data_random_transform_is_reproducible_whatever_the_workers(dataset: Path) -> None:
    from fwbench.frameworks.tensorflow import data

    two_epochs = _stack(list(data.make_loader(dataset, BATCH, 2, CROP, "random", seed=7, epochs=2)), nchw=False)
    one_epoch = _stack(list(data.make_loader(dataset, BATCH, 0, CROP, "random", seed=7)), nchw=False)
    assert two_epochs.shape == (20, CROP, CROP, 3) and one_epoch.shape == (8, CROP, CROP, 3)
    assert np.array_equal(two_epochs[:8], one_epoch)  # epoch 0, with 2 parallel calls or none
    assert not np.allclose(two_epochs[10:18], one_epoch)  # epoch 1 (samples 10-17 are its first 8)
    expected, _ = _reference(dataset)
    assert not np.allclose(one_epoch, expected[:8], atol=ONE_LEVEL)  # not the center crop


def _by_index(batches: list[Any]) -> dict[int, list[np.ndarray]]:
    """Grain's batches as image index → its images, one per epoch (a batch's images depend on the workers)."""
    found: dict[int, list[np.ndarray]] = {}
    for images_, _, indices in batches:
        for image, index in zip(images_, indices):
            found.setdefault(int(index), []).append(image)
    return found


@pytest.mark.parametrize(
    ("workers", "source"), [(0, "files"), pytest.param(2, "files", marks=pytest.mark.matrix), (0, "arrayrecord")]
)
def test_grain_dataloader_images_are_the_reference(dataset: Path, workers: int, source: str) -> None:
    from fwbench.frameworks.grain import data

    expected, labels = _reference(dataset)
    batches = list(data.make_loader(dataset, BATCH, workers, CROP, source=source))
    assert sum(len(b[0]) for b in batches) == 8 and all(b[0].shape == (BATCH, CROP, CROP, 3) for b in batches)
    found = _by_index(batches)
    assert len(found) == 8  # each worker drops its own incomplete batch: which 8 depends on the workers
    for index, (image,) in found.items():
        assert image.dtype == np.float32 and np.abs(image - expected[index]).max() <= ONE_LEVEL + 1e-4
    assert all(int(label) == labels[int(i)] for _, ls, idx in batches for label, i in zip(ls, idx))


def test_grain_random_transform_is_reproducible_whatever_the_workers(dataset: Path) -> None:
    from fwbench.frameworks.grain import data

    none = _by_index(list(data.make_loader(dataset, 2, 0, CROP, "random", seed=7, epochs=2)))
    two = _by_index(list(data.make_loader(dataset, 2, 2, CROP, "random", seed=7)))
    assert set(none) == set(range(10)) and len(two) == 8  # each of the 2 workers drops its 5th image
    for index, images_ in two.items():
        assert np.array_equal(images_[0], none[index][0])  # epoch 0, with 2 workers or none
        assert not np.array_equal(none[index][0], none[index][1])  # epoch 1 draws new crops
    expected, _ = _reference(dataset)
    assert not all(np.allclose(two[i][0], expected[i], atol=ONE_LEVEL) for i in two)  # not the center crop
