"""``tensorflow:data``: a tf.data pipeline over an image dataset's files, and the TFRecord shards of an image
dataset (the packed form tf.data users read with ``interleave`` over shards).

The pipeline: the files in order → ``map(decode and transform, num_parallel_calls=workers or AUTOTUNE)`` →
``batch`` → ``prefetch(AUTOTUNE)``; the ``center-crop`` transform is fwbench.datasets.transforms' (central
square, ``tf.image.resize`` bilinear without antialiasing, ImageNet normalisation); JPEGs are decoded by
``tf.io.decode_jpeg`` with ``dct_method="INTEGER_ACCURATE"`` (libjpeg's ISLOW, Pillow's default; TF's default
lets libjpeg choose a faster, less exact one). A batch is (images float32 (B, crop, crop, 3), NHWC as the
TensorFlow models take it; labels int64 (B,)).

Each record is a ``tf.train.Example`` with the JPEG file's bytes (``image``), its ``label`` and its ``file`` name
(relative to the dataset folder), serialised deterministically (the feature map's order is otherwise free);
images are dealt to shards in file order (image i to shard i mod shards), so the shards are the same bytes for
the same dataset.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from fwbench.datasets import images, transforms
from fwbench.datasets.images import LoaderInput

TFRECORDS = "tfrecords"  # the folder of shards inside a dataset folder
LAYOUT = "NHWC"
PACKED = TFRECORDS  # --data-source packed: the TFRecord shards
PACKED_ARGUMENT = "tfrecord_shards"  # the manifest's count of them


def shard_name(index: int, shards: int) -> str:
    """The file name of shard ``index`` of ``shards`` (relative to the tfrecords folder)."""
    return f"images-{index:05d}-of-{shards:05d}.tfrecord"


def write_packed(folder: Path, labels: list[tuple[str, int]], shards: int) -> list[Path]:
    """Write ``folder/tfrecords/`` with ``shards`` shards of the images ``labels`` lists ((file, label) relative to
    ``folder``). Returns the shard paths."""
    out = folder / TFRECORDS
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / shard_name(index, shards) for index in range(shards)]
    writers = [tf.io.TFRecordWriter(str(path)) for path in paths]
    try:
        for index, (file, label) in enumerate(labels):
            feature = {
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[(folder / file).read_bytes()])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                "file": tf.train.Feature(bytes_list=tf.train.BytesList(value=[file.encode()])),
            }
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            writers[index % shards].write(example.SerializeToString(deterministic=True))  # map order fixed
    finally:
        for writer in writers:
            writer.close()
    return paths


def _decoded(jpeg: tf.Tensor) -> tf.Tensor:
    """The JPEG bytes ``jpeg`` as uint8 (h, w, 3), libjpeg's exact IDCT."""
    return tf.io.decode_jpeg(jpeg, channels=3, dct_method="INTEGER_ACCURATE")


def _finish(region: tf.Tensor, crop: int) -> tf.Tensor:
    """uint8 region → (crop, crop, 3) float32: bilinear resize without antialiasing, ImageNet normalisation."""
    resized = tf.image.resize(tf.cast(region, tf.float32), (crop, crop), method="bilinear", antialias=False)
    return (resized / 255.0 - transforms.MEAN) / transforms.STD


def _center_crop(jpeg: tf.Tensor, crop: int) -> tf.Tensor:
    """The ``center-crop`` transform of the JPEG bytes ``jpeg``: float32 (crop, crop, 3)."""
    pixels = _decoded(jpeg)
    height, width = tf.shape(pixels)[0], tf.shape(pixels)[1]
    side = tf.minimum(height, width)
    return _finish(tf.image.crop_to_bounding_box(pixels, (height - side) // 2, (width - side) // 2, side, side), crop)


def _random_crop(jpeg: tf.Tensor, crop: int, seed: tf.Tensor) -> tf.Tensor:
    """The ``random`` transform with TF's own stateless sampling (``stateless_sample_distorted_bounding_box``,
    the Inception crop TF users write: area 8–100%, aspect 3/4–4/3, 10 tries, else the whole image; a stateless
    left-right flip); ``seed`` (2,) int64 is the sample's."""
    pixels = _decoded(jpeg)
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.shape(pixels),
        bounding_boxes=tf.zeros([1, 0, 4]),
        seed=seed,
        min_object_covered=0.0,
        aspect_ratio_range=transforms.RATIO,
        area_range=transforms.SCALE,
        max_attempts=transforms.TRIES,
        use_image_if_no_bounding_boxes=True,
    )
    region = tf.slice(pixels, begin, size)
    flip_seed = tf.random.experimental.stateless_fold_in(seed, 1)
    return _finish(tf.image.stateless_random_flip_left_right(region, flip_seed), crop)


SOURCES = ("files", "tfrecord")
_FEATURES = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}


def _source(folder: Path, source: str, workers: int, exclude: frozenset[str]) -> tuple[tf.data.Dataset, int]:
    """(JPEG bytes, label) of ``folder``'s images in file order, and their count. ``files``: each file read by
    ``tf.io.read_file``; ``tfrecord``: the shards ``fwbench data make`` wrote, read by ``interleave`` over them
    one record at a time (image i is record i // k of shard i mod k, so the round robin gives file order),
    ``workers`` shards read in parallel."""
    labels = images.read_labels(folder, exclude if source == "files" else frozenset())
    if source == "files":
        paths = [str(folder / file) for file, _ in labels]
        files = tf.data.Dataset.from_tensor_slices((paths, np.array([label for _, label in labels], dtype=np.int64)))
        return files.map(lambda path, label: (tf.io.read_file(path), label)), len(labels)
    shards = sorted(str(path) for path in (folder / TFRECORDS).glob("*.tfrecord"))
    if not shards:
        raise ValueError(f"{folder} has no TFRecord shards ({TFRECORDS}/): write it with fwbench data make images")
    records = tf.data.Dataset.from_tensor_slices(shards).interleave(
        tf.data.TFRecordDataset,
        cycle_length=len(shards),
        block_length=1,
        num_parallel_calls=workers or None,
        deterministic=True,
    )

    def parsed(record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        example = tf.io.parse_single_example(record, _FEATURES)
        return example["image"], example["label"]

    return records.map(parsed), len(labels)


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
) -> tf.data.Dataset:
    """A tf.data pipeline over ``folder``'s images in file order (from the files or the TFRecord shards),
    ``epochs`` times (None: endlessly): ``workers`` parallel map calls (0: AUTOTUNE), deterministic order, the last incomplete
    batch dropped, AUTOTUNE prefetch. The random transform's seed for sample i of epoch e is (seed, e) folded
    with i: the same whatever the parallelism. ``exclude``: image files (relative to ``folder``) left out of the
    files source (the packed shards hold the images ``fwbench data make`` wrote)."""
    transforms.check_transform(transform)
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}; known: {', '.join(SOURCES)}")
    items, size = _source(folder, source, workers, exclude)

    def transformed(position: tf.Tensor, item: tuple[tf.Tensor, tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor]:
        jpeg, label = item
        if transform == "center-crop":
            return _center_crop(jpeg, crop), label
        epoch, index = position // size, position % size
        sample_seed = tf.random.experimental.stateless_fold_in(tf.stack([tf.constant(seed, tf.int64), epoch]), index)
        return _random_crop(jpeg, crop, sample_seed), label

    numbered = items.repeat(epochs).enumerate()
    pipeline = numbered.map(transformed, parallel_calls(workers), deterministic=True)
    options = tf.data.Options()
    options.experimental_optimization.map_parallelization = False  # the calls are parallel_calls(workers), no more
    return pipeline.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE).with_options(options)


def parallel_calls(workers: int) -> int:
    """The map's ``num_parallel_calls`` for ``workers``: W calls in parallel, or tf.data's AUTOTUNE for 0 (what a
    tf.data user gets with no number: tf.data's default ``map_parallelization`` rewrites a plain ``map`` into an
    AUTOTUNE one; measured on the default dataset, 2 cores: a plain map 27.6 ms per batch of 32, the rewrite off
    58.2 ms)."""
    return workers or int(tf.data.AUTOTUNE)


def configure_threads(threads: int) -> int:
    """The cell's thread budget for TensorFlow's op pools (tf.data's map runs on its own pool, ``workers`` wide);
    returns the intra-op thread count TensorFlow reports after it."""
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    return int(tf.config.threading.get_intra_op_parallelism_threads())


def batches(source: LoaderInput, batch_size: int, packed: bool) -> Iterator[Any]:
    """Endless batches of :func:`make_loader` over ``source`` (the files, or with ``packed`` the TFRecord
    shards)."""
    kind = "tfrecord" if packed else "files"
    yield from make_loader(
        source.folder, batch_size, source.workers, source.crop, source.transform, source.seed, None, kind,
        source.exclude,
    )  # fmt: skip


def versions() -> dict[str, str]:
    """Versions of the loader's libraries."""
    return {"tensorflow": tf.__version__}
