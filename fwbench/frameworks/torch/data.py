"""``torch:dataloader``: a map-style ``Dataset`` that decodes each JPEG with Pillow (what DataLoader users do:
torchvision does not import beside this torch build) and a ``DataLoader`` over it.

The transforms are fwbench.datasets.transforms' (``center-crop``: central square; ``random``: random-resized crop
and flip from the sample's own seeded generator), resized bilinearly without antialiasing by
``torch.nn.functional.interpolate`` and normalised; a batch is (images float32 (B, 3, crop, crop), NCHW as the
torch models take it; labels int64 (B,)). The sampler hands the dataset (epoch, index) keys, so the random
transform's numbers depend on the sample and the epoch only, not on which worker decodes it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import PIL
import torch
import torch.nn.functional as F
from PIL import Image

from fwbench.datasets import images, transforms
from fwbench.datasets.images import LoaderInput

LAYOUT = "NCHW"
PACKED = None  # DataLoader users read the files: --data-source packed reads them too


class EpochSampler(torch.utils.data.Sampler[tuple[int, int]]):
    """(epoch, index) keys in file order; each iteration (epoch) numbers its keys one epoch further."""

    def __init__(self, size: int) -> None:
        self.size, self.epoch = size, 0

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch, self.epoch = self.epoch, self.epoch + 1
        return iter([(epoch, index) for index in range(self.size)])

    def __len__(self) -> int:
        return self.size


class JpegFolder(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """The images of a dataset folder (``fwbench data make images``), each decoded and transformed when read (in
    the loader's worker processes when it has some), keyed by (epoch, index)."""

    def __init__(
        self, folder: Path, crop: int, transform: str, seed: int, exclude: frozenset[str] = frozenset()
    ) -> None:
        transforms.check_transform(transform)
        self.folder, self.crop, self.transform, self.seed = folder, crop, transform, seed
        self.labels = images.read_labels(folder, exclude)
        self.mean = torch.from_numpy(transforms.MEAN).view(3, 1, 1)  # made once, not per image
        self.std = torch.from_numpy(transforms.STD).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, int]:
        epoch, index = key
        file, label = self.labels[index]
        with Image.open(self.folder / file) as image:
            pixels = np.array(image.convert("RGB"))  # a writable copy: torch.from_numpy shares it
        flip = False
        if self.transform == "random":
            rng = transforms.sample_rng(self.seed, epoch, index)
            (top, left, height, width), flip = transforms.random_params(rng, *pixels.shape[:2])
        else:
            top, left, height = transforms.central_square(pixels.shape[0], pixels.shape[1])
            width = height
        region = torch.from_numpy(pixels[top : top + height, left : left + width])
        chw = region.permute(2, 0, 1).unsqueeze(0).to(torch.float32)  # (1, 3, height, width)
        resized = F.interpolate(chw, size=(self.crop, self.crop), mode="bilinear", align_corners=False, antialias=False)
        image_chw = torch.flip(resized[0], dims=(2,)) if flip else resized[0]
        return (image_chw / 255.0 - self.mean) / self.std, label


def make_loader(
    folder: Path,
    batch_size: int,
    workers: int,
    crop: int,
    transform: str = "center-crop",
    seed: int = 0,
    start_method: str | None = None,
    exclude: frozenset[str] = frozenset(),
) -> torch.utils.data.DataLoader[Any]:
    """A DataLoader over ``folder``'s images in file order, ``workers`` worker processes (0: in this process),
    each keeping two batches prefetched and alive across epochs, the last incomplete batch dropped; each
    iteration over it is the next epoch (0, 1, ...). ``start_method``: how workers start (None: DataLoader's
    default, fork on Linux, what its users get; a process that has imported a multithreaded framework such as
    JAX or TensorFlow must not fork, and passes "forkserver"). ``exclude``: image files (relative to ``folder``)
    left out."""
    dataset = JpegFolder(folder, crop, transform, seed, exclude)
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=EpochSampler(len(dataset)),
        num_workers=workers,
        prefetch_factor=2 if workers else None,
        persistent_workers=workers > 0,
        drop_last=True,
        multiprocessing_context=start_method if workers else None,
    )


def configure_threads(threads: int) -> int:
    """The cell's thread budget for the loader's own process (its worker processes use one thread each, as
    DataLoader sets); returns torch's intra-op thread count after it."""
    torch.set_num_threads(threads)
    return torch.get_num_threads()


def batches(source: LoaderInput, batch_size: int, packed: bool) -> Iterator[Any]:
    """Endless batches of :func:`make_loader` over ``source`` (epoch after epoch; its worker processes stay alive
    across epochs) with DataLoader's default start method; ``packed`` changes nothing (DataLoader reads the
    files)."""
    loader = make_loader(
        source.folder, batch_size, source.workers, source.crop, source.transform, source.seed, exclude=source.exclude
    )
    for _ in itertools.count():
        yield from loader


def versions() -> dict[str, str]:
    """Versions of the loader's libraries."""
    return {"torch": torch.__version__, "pillow": PIL.__version__}
