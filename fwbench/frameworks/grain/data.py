"""``grain:dataloader``: a Grain ``DataLoader`` over an image dataset's files, what JAX users feed a training
loop with.

A random-access source of the images in file order (the files, or the ArrayRecord files ``fwbench data make``
writes: Grain's packed format) → an ``IndexSampler`` (one epoch per pass, no
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

import io
import struct
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import grain.python as grain
import numpy as np
import PIL
from absl import flags
from array_record.python.array_record_module import ArrayRecordWriter
from PIL import Image

from fwbench.datasets import images, transforms
from fwbench.datasets.images import LoaderInput

LAYOUT = "NHWC"
ARRAY_RECORDS = "arrayrecords"  # the folder of ArrayRecord files inside a dataset folder
SOURCES = ("files", "arrayrecord")
PACKED = ARRAY_RECORDS  # --data-source packed: the ArrayRecord files
PACKED_ARGUMENT = "array_record_shards"  # the manifest's count of them
_HEADER = struct.Struct("<qq")  # an ArrayRecord record: label, index (little-endian int64), then the JPEG bytes

if not flags.FLAGS.is_parsed():
    flags.FLAGS(sys.argv[:1])


Record = tuple[str | bytes, int, int]  # (absolute JPEG path or JPEG bytes, label, index in file order)


def array_record_name(index: int, shards: int) -> str:
    """The file name of ArrayRecord shard ``index`` of ``shards`` (relative to the arrayrecords folder)."""
    return f"images-{index:05d}-of-{shards:05d}.array_record"


def write_packed(folder: Path, labels: list[tuple[str, int]], shards: int) -> list[Path]:
    """Write ``folder/arrayrecords/`` with ``shards`` files holding the images ``labels`` lists ((file, label)
    relative to ``folder``) in contiguous, balanced runs (shard j: images ⌊j·n/k⌋ to ⌊(j+1)·n/k⌋ − 1, none
    empty when n ≥ k), so that reading the shards in order gives file order. A record is the label and index as
    two little-endian int64, then the JPEG bytes."""
    out = folder / ARRAY_RECORDS
    out.mkdir(parents=True, exist_ok=True)
    bounds = [shard * len(labels) // shards for shard in range(shards + 1)]
    paths = [out / array_record_name(index, shards) for index in range(shards)]
    for shard, path in enumerate(paths):
        writer = ArrayRecordWriter(str(path), "group_size:1")
        try:
            for index in range(bounds[shard], bounds[shard + 1]):
                file, label = labels[index]
                writer.write(_HEADER.pack(label, index) + (folder / file).read_bytes())
        finally:
            writer.close()
    return paths


class ParseRecord(grain.MapTransform):
    """An ArrayRecord record's bytes → (JPEG bytes, label, index)."""

    def map(self, element: bytes) -> Record:
        label, index = _HEADER.unpack_from(element)
        return element[_HEADER.size :], label, index


class JpegSource(grain.RandomAccessDataSource[Record]):
    """The records of a dataset folder's images, in file order."""

    def __init__(self, folder: Path, exclude: frozenset[str] = frozenset()) -> None:
        labels = images.read_labels(folder, exclude)
        self.records = [(str(folder / file), label, index) for index, (file, label) in enumerate(labels)]

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> Record:
        return self.records[index]


def _pixels(jpeg: str | bytes) -> np.ndarray:
    """A JPEG (a file path or its bytes) decoded by Pillow: uint8 (h, w, 3)."""
    with Image.open(io.BytesIO(jpeg) if isinstance(jpeg, bytes) else jpeg) as image:
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
        return transforms.random_crop_from(_pixels(path), self.crop, rng), label, index


class DropIndex(grain.MapTransform):
    """(image, label, index) → (image, label): what ``model.fit`` takes as (x, y)."""

    def map(self, element: tuple[np.ndarray, int, int]) -> tuple[np.ndarray, int]:
        return element[0], element[1]


def make_loader(
    folder: Path,
    batch_size: int,
    workers: int,
    crop: int,
    transform: str = "center-crop",
    seed: int = 0,
    epochs: int | None = 1,
    source: str = "files",
    exclude: frozenset[str] = frozenset(),
    indices: bool = True,
) -> Any:
    """A Grain DataLoader over ``folder``'s images in file order (from the files or the ArrayRecord files),
    ``epochs`` passes (None: endless), ``workers`` worker processes (0: in this process) each keeping two batches
    buffered, the last incomplete batch dropped. ``exclude``: image files (relative to ``folder``) left out of the
    files source (the ArrayRecord files hold the images ``fwbench data make`` wrote). ``indices`` False: batches
    of (images, labels) only, as Keras' ``model.fit`` reads a Grain DataLoader."""
    transforms.check_transform(transform)
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}; known: {', '.join(SOURCES)}")
    parse: list[Any] = []
    if source == "files":
        records: Any = JpegSource(folder, exclude)
    else:
        shards = sorted(str(path) for path in (folder / ARRAY_RECORDS).glob("*.array_record"))
        if not shards:
            raise ValueError(f"{folder} has no ArrayRecord files ({ARRAY_RECORDS}/): write it with fwbench data make")
        records, parse = grain.ArrayRecordDataSource(shards), [ParseRecord()]
    sampler = grain.IndexSampler(
        num_records=len(records), num_epochs=epochs, shard_options=grain.NoSharding(), shuffle=False, seed=seed
    )
    operation = CenterCrop(crop) if transform == "center-crop" else RandomCrop(crop)
    return grain.DataLoader(
        data_source=records,
        sampler=sampler,
        operations=[
            *parse,
            operation,
            *([] if indices else [DropIndex()]),
            grain.Batch(batch_size, drop_remainder=True),
        ],
        worker_count=workers,
        worker_buffer_size=2,
    )


def configure_threads(threads: int) -> int:
    """Grain has no thread pool of its own to size (its transforms are numpy and Pillow, one thread each):
    returns 1, the threads a transform uses."""
    return 1


def batches(source: LoaderInput, batch_size: int, packed: bool) -> Iterator[Any]:
    """Endless batches of :func:`make_loader` over ``source`` (the files, or with ``packed`` the ArrayRecord
    files)."""
    kind = "arrayrecord" if packed else "files"
    yield from make_loader(
        source.folder, batch_size, source.workers, source.crop, source.transform, source.seed, None, kind,
        source.exclude,
    )  # fmt: skip


def versions() -> dict[str, str]:
    """Versions of the loader's libraries."""
    return {
        "grain": metadata.version("grain"),
        "array-record": metadata.version("array-record"),
        "pillow": PIL.__version__,
    }
