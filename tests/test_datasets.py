"""``fwbench data make``: seeded datasets, byte for byte; their manifests; TFRecord shards tf.data reads back (the
CLI writing them: the matrix's, ``make test-matrix``; tests/test_data_loaders.py reads TFRecord shards in make
test)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import run_cli
from fwbench.datasets import images, text
from fwbench.datasets.manifest import MANIFEST, file_digest, read_manifest


def test_images_are_the_same_bytes_for_the_same_seed(tmp_path: Path) -> None:
    first = images.make_images(tmp_path / "a", n=6, size=32, seed=3, classes=4)
    second = images.make_images(tmp_path / "b", n=6, size=32, seed=3, classes=4)
    other = images.make_images(tmp_path / "c", n=6, size=32, seed=4, classes=4)
    assert first.files == second.files and first.digest == second.digest
    assert other.digest != first.digest
    assert sorted(first.files) == ["images/" + f"{i:06d}.jpg" for i in range(6)] + ["labels.csv"]
    labels = images.read_labels(tmp_path / "a")
    assert [file for file, _ in labels] == [f"images/{i:06d}.jpg" for i in range(6)]
    assert all(0 <= label < 4 for _, label in labels)
    for file, _ in labels:
        with Image.open(tmp_path / "a" / file) as image:
            assert image.format == "JPEG" and image.mode == "RGB"
            assert all(24 <= side <= 40 for side in image.size), image.size  # 32 ± 25%
    stored = json.loads((tmp_path / "a" / MANIFEST).read_text())
    assert stored["digest"] == first.digest and stored["name"] == "images-32"
    assert read_manifest(tmp_path / "a") == first
    assert file_digest(tmp_path / "a" / "labels.csv") == first.files["labels.csv"]


def test_images_vary_in_size_and_content(tmp_path: Path) -> None:
    images.make_images(tmp_path, n=12, size=64, seed=0)
    sizes, means = set(), []
    for file, _ in images.read_labels(tmp_path):
        with Image.open(tmp_path / file) as image:
            sizes.add(image.size)
            means.append(np.asarray(image, dtype=np.float64).mean())
    assert len(sizes) > 6  # widths and heights drawn independently in [48, 80]
    assert np.std(means) > 1.0  # not twelve copies of one picture


def test_text_lines_and_tokenizer(tmp_path: Path) -> None:
    first = text.make_text(tmp_path / "a", n=20, seed=1)
    assert first.digest == text.make_text(tmp_path / "b", n=20, seed=1).digest
    lines = (tmp_path / "a" / text.LINES).read_text().splitlines()
    assert len(lines) == 20
    low, high = text.WORDS_PER_LINE
    assert all(low <= len(line.split()) <= high for line in lines)
    vocabulary = text.vocabulary()
    assert len(vocabulary) == len(set(vocabulary)) == text.VOCABULARY_SIZE
    ids = text.tokenize(lines[0], 128)
    assert len(ids) == 128 and ids[len(lines[0].split()) :] == [text.PAD] * (128 - len(lines[0].split()))
    assert all(2 <= i < text.VOCABULARY_SIZE + 2 for i in ids[: len(lines[0].split())])
    assert text.tokenize(f"{vocabulary[0]} NOTAWORD {vocabulary[5].upper()}", 2) == [2, text.UNKNOWN]
    assert text.tokenize(vocabulary[5].upper(), 1) == [7]


@pytest.mark.slow
@pytest.mark.matrix
def test_cli_writes_images_with_tfrecord_shards_tf_data_reads(tmp_path: Path) -> None:
    out = tmp_path / "new" / "images"  # its folder is created
    done = run_cli("data", "make", "images", "--n", "5", "--size", "16", "--shards", "2", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "images-16, 5 images, seed 0, 2 TFRecord shards, 2 ArrayRecord files" in done.stderr
    manifest = read_manifest(out)
    assert manifest.arguments["tfrecord_shards"] == manifest.arguments["array_record_shards"] == 2
    assert sorted(name for name in manifest.files if name.startswith("arrayrecords/")) == [
        "arrayrecords/images-00000-of-00002.array_record",
        "arrayrecords/images-00001-of-00002.array_record",
    ]
    shards = sorted(name for name in manifest.files if name.startswith("tfrecords/"))
    assert shards == ["tfrecords/images-00000-of-00002.tfrecord", "tfrecords/images-00001-of-00002.tfrecord"]
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no partial folder left

    import tensorflow as tf

    labels = dict(images.read_labels(out))
    spec = {
        name: tf.io.FixedLenFeature([], dtype)
        for name, dtype in (("image", tf.string), ("label", tf.int64), ("file", tf.string))
    }
    seen = {}
    for record in tf.data.TFRecordDataset([str(out / name) for name in shards]):
        example = tf.io.parse_single_example(record, spec)
        file = example["file"].numpy().decode()
        assert example["image"].numpy() == (out / file).read_bytes()
        seen[file] = int(example["label"])
    assert seen == labels

    again = run_cli(
        "data", "make", "images", "--n", "5", "--size", "16", "--shards", "2", "--out", str(tmp_path / "again")
    )
    assert again.returncode == 0, again.stderr
    assert read_manifest(tmp_path / "again").files == manifest.files  # shards and ArrayRecords too: same bytes


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["images", "--n", "0", "--out", "{tmp}/x"], "'0' is not a positive integer"),
        (["images", "--n", "2", "--size", "4", "--out", "{tmp}/x"], "--size 4: images need at least 8 px"),
        (["text", "--n", "2", "--seed", "-1", "--out", "{tmp}/x"], "'-1' is not an integer from 0 to"),
        (["text", "--n", "2", "--out", "{tmp}/full"], "give a new or empty folder"),
        (["text", "--n", "2", "--out", "{tmp}/full/keep.txt/x"], "is a file"),
    ],
)
def test_cli_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, arguments: list[str], message: str) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    before = sorted(tmp_path.rglob("*"))
    done = run_cli("data", "make", *(a.format(tmp=tmp_path) for a in arguments))
    assert done.returncode == 2
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert sorted(tmp_path.rglob("*")) == before
