"""How far TensorFlow's JPEG decoder is from Pillow's on a dataset folder (``fwbench data make images``).

For each image: Pillow's RGB decode against ``tf.io.decode_jpeg(channels=3)`` with its default ``dct_method``
and with ``INTEGER_ACCURATE`` (what the tf.data loader uses); prints how many uint8 values differ and by how
much at most.

    .venv/bin/python benchmarks/jpeg_decoders.py DIR
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image

from fwbench.datasets import images


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path, help="a folder written by fwbench data make images")
    args = parser.parse_args()

    import tensorflow as tf

    methods = {"default": "", "INTEGER_ACCURATE": "INTEGER_ACCURATE"}
    differing, largest, total = dict.fromkeys(methods, 0), dict.fromkeys(methods, 0), 0
    for file, _ in images.read_labels(args.folder):
        with Image.open(args.folder / file) as image:
            pillow = np.asarray(image.convert("RGB"), dtype=np.int16)
        total += pillow.size
        data = tf.io.read_file(str(args.folder / file))
        for name, method in methods.items():
            decoded = tf.io.decode_jpeg(data, channels=3, dct_method=method).numpy().astype(np.int16)
            difference = np.abs(decoded - pillow)
            differing[name] += int(np.count_nonzero(difference))
            largest[name] = max(largest[name], int(difference.max()))
    for name in methods:
        share = differing[name] / total
        print(
            f"tf.io.decode_jpeg {name}: {differing[name]} of {total} values differ from Pillow ({share:.0%}), "
            f"by at most {largest[name]}"
        )


if __name__ == "__main__":
    main()
