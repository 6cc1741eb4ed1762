"""``fwbench data make images|text``: seeded datasets for the data phase, written into a new folder.

The folder appears complete or not at all: it is written under a temporary name beside ``--out`` and renamed
at the end, so an interrupted run, or one that finds the disk full (one line: DiskFull), leaves no half dataset
where ``--input`` would find it.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fwbench.cli.common import Parser, non_negative_int, positive_int
from fwbench.datasets import images, text
from fwbench.datasets.manifest import Manifest, write_manifest
from fwbench.diskfull import DiskFull, disk_full_report
from fwbench.frameworks import missing_requirement, packing_loader_module, runtimes
from fwbench.spec import SpecError

DEFAULT_SHARDS = 8


def add_parser(commands: Any) -> None:
    """Register ``data`` (``data make images``, ``data make text``) on the subcommand parsers ``commands``."""
    data = commands.add_parser(
        "data", help="write seeded datasets for the data phase", description="Seeded datasets, no network."
    )
    actions = data.add_subparsers(dest="data_action", required=True, parser_class=Parser, metavar="ACTION")
    make = actions.add_parser(
        "make", help="write a dataset folder", description="Write a seeded dataset into a new folder."
    )
    kinds = make.add_subparsers(dest="kind", required=True, parser_class=Parser, metavar="KIND")
    image = kinds.add_parser(
        "images",
        help="JPEG images with labels (+ TFRecord shards, ArrayRecord files)",
        description="N seeded JPEG images, width and height each within ±25%% of --size, labels.csv, "
        "TFRecord shards (tfrecords/, when TensorFlow is installed), ArrayRecord files (arrayrecords/, when Grain "
        "is installed) and manifest.json (every file's SHA-256). Same arguments, same bytes.",
    )
    image.add_argument("--n", type=positive_int, required=True, help="number of images")
    image.add_argument("--size", type=positive_int, default=256, help="typical side in px (default 256, ≥ 8)")
    image.add_argument("--classes", type=positive_int, default=10, help="number of labels (default 10)")
    image.add_argument(
        "--shards", type=positive_int, default=DEFAULT_SHARDS, help="TFRecord shards and ArrayRecord files (default 8)"
    )
    line = kinds.add_parser(
        "text",
        help="text lines for a tokenising pipeline",
        description="N seeded lines of 8-64 words from fwbench's fixed vocabulary (lines.txt) and manifest.json.",
    )
    line.add_argument("--n", type=positive_int, required=True, help="number of lines")
    for parser in (image, line):
        parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="a new or empty folder")
        parser.add_argument("--seed", type=non_negative_int, default=0, help="default 0")


def _check_out(out: Path) -> None:
    """Refuse an --out that is a file, a non-empty folder, or below a file."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise SpecError(f"--out {out}: give a new or empty folder")
    existing = next(folder for folder in out.parents if folder.exists())
    if not existing.is_dir():
        raise SpecError(f"--out {out}: {existing} is a file")


def _write(args: argparse.Namespace, folder: Path) -> tuple[Manifest, str]:
    """Write the dataset ``args`` asks for into ``folder``; its manifest and what was packed (a phrase)."""
    if args.kind == "text":
        return text.make_text(folder, args.n, args.seed), "no packed variant"
    arguments: dict[str, Any] = images.write_images(folder, args.n, args.size, args.seed, args.classes)
    labels, shards, packed = images.read_labels(folder), min(args.shards, args.n), []
    for info in runtimes().values():  # each loader that reads a packed format: its data.py writes it
        if not info.packed:
            continue
        missing = missing_requirement(info)
        if missing is not None:
            packed.append(f"{info.packed} skipped: {missing}")
            continue
        loader = packing_loader_module(info)  # imports the loader's framework
        loader.write_packed(folder, labels, shards)
        arguments[loader.PACKED_ARGUMENT] = shards
        packed.append(f"{shards} {info.packed}")
    return write_manifest(folder, "images", images.dataset_name(args.size), arguments), ", ".join(packed)


def command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    out: Path = args.out.expanduser().resolve()
    _check_out(out)
    if args.kind == "images" and args.size < 8:
        raise SpecError(f"--size {args.size}: images need at least 8 px")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        manifest, packed = _write(args, partial)
        if out.exists():
            out.rmdir()  # empty, checked above
        partial.rename(out)
    except Exception as exc:  # Pillow, TensorFlow's and Grain's writers each raise their own on a full disk
        full = disk_full_report(exc)
        if full is None:
            raise
        raise DiskFull.from_report(full, out, f"no half dataset is left at {out}", partial=partial) from exc
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    total = sum(path.stat().st_size for path in out.rglob("*") if path.is_file())
    print(
        f"wrote {out}: {manifest.name}, {args.n} {'lines' if args.kind == 'text' else 'images'}, seed {args.seed}, "
        f"{packed}, {total / 2**20:.1f} MiB, digest {manifest.digest[:12]}",
        file=sys.stderr,
    )
    return 0
