"""TFRecord shards of an image dataset: the packed form tf.data users read (``interleave`` over shards).

Each record is a ``tf.train.Example`` with the JPEG file's bytes (``image``), its ``label`` and its ``file`` name
(relative to the dataset folder), serialised deterministically (the feature map's order is otherwise free);
images are dealt to shards in file order (image i to shard i mod shards), so the shards are the same bytes for
the same dataset.
"""

from __future__ import annotations

from pathlib import Path

import tensorflow as tf

TFRECORDS = "tfrecords"  # the folder of shards inside a dataset folder


def shard_name(index: int, shards: int) -> str:
    """The file name of shard ``index`` of ``shards`` (relative to the tfrecords folder)."""
    return f"images-{index:05d}-of-{shards:05d}.tfrecord"


def write_tfrecords(folder: Path, labels: list[tuple[str, int]], shards: int) -> list[Path]:
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
