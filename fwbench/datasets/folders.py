"""The dataset folder a phase data run reads: the one ``--input`` names, or the default dataset, written once
into a cache folder; and which of its images a loader cannot decode.

Nothing here imports a framework: the default dataset's packed variants (TFRecord, ArrayRecord) are written by
``fwbench data make`` in a child process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from fwbench.datasets import images
from fwbench.datasets.manifest import Manifest, file_digest, read_manifest

# The default dataset of phase data (the "images 256 px, N = 2048"): written on first use.
DEFAULT_IMAGES = 2048
DEFAULT_SIZE = 256
DEFAULT_SEED = 0
CACHE_ENV = "FWBENCH_DATA_CACHE"  # the folder default datasets are written into (default ~/.cache/fwbench/datasets)


class DatasetError(ValueError):
    """A dataset folder that cannot be read; the message is one line for the user."""


def cache_folder() -> Path:
    """Where default datasets live: $FWBENCH_DATA_CACHE, else $XDG_CACHE_HOME/fwbench/datasets (~/.cache/...)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "fwbench" / "datasets"


def default_folder() -> Path:
    """The default dataset's folder (it may not exist yet: :func:`ensure_default`)."""
    name = images.dataset_name(DEFAULT_SIZE)
    return (cache_folder() / f"{name}-n{DEFAULT_IMAGES}-seed{DEFAULT_SEED}").resolve()


def default_name() -> str:
    """The default dataset's name (a data cell's model), known before it is written."""
    return images.dataset_name(DEFAULT_SIZE)


def image_dataset(folder: Path) -> Manifest:
    """The manifest of an image dataset folder; DatasetError (one line) for a missing folder, a folder that
    ``fwbench data make images`` did not write, or a text dataset."""
    if not folder.is_dir():
        raise DatasetError(f"--input {folder}: no such folder (write one with `fwbench data make images`)")
    try:
        manifest = read_manifest(folder)
    except (ValueError, KeyError, OSError) as exc:  # json.JSONDecodeError is a ValueError
        raise DatasetError(
            f"--input {folder}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from None
    if manifest.kind != "images":
        raise DatasetError(f"--input {folder}: a {manifest.kind} dataset; phase data reads images")
    return manifest


def ensure_default(folder: Path) -> None:
    """Write the default dataset into ``folder`` unless it is there (``fwbench data make images`` in a child
    process, which writes the packed variants with the frameworks that are installed). Raises DatasetError if the
    writer fails."""
    if folder.is_dir():
        return
    print(
        f"fwbench: writing the default dataset ({DEFAULT_IMAGES} images of {DEFAULT_SIZE} px) to {folder}",
        file=sys.stderr,
    )
    command = [
        sys.executable, "-m", "fwbench", "data", "make", "images",
        "--n", str(DEFAULT_IMAGES), "--size", str(DEFAULT_SIZE), "--seed", str(DEFAULT_SEED), "--out", str(folder),
    ]  # fmt: skip
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:  # the writer's one line (a full disk: where, and that no half dataset is left)
        lines = done.stderr.strip().splitlines()
        last = lines[-1].removeprefix("fwbench: ") if lines else done.returncode
        raise DatasetError(f"writing the default dataset to {folder} failed: {last}")


@dataclass(frozen=True)
class CorruptFile:
    """An image a loader could not decode: its path relative to the dataset folder and Pillow's complaint."""

    file: str
    error: str


def corrupt_images(folder: Path, manifest: Manifest) -> list[CorruptFile]:
    """The images of ``folder`` that do not decode. An image whose bytes still have the manifest's digest is the
    one ``fwbench data make`` wrote and decoded; any other is decoded fully with Pillow here."""
    found = []
    for file, _ in images.read_labels(folder):
        path = folder / file
        if not path.is_file():
            found.append(CorruptFile(file, "missing"))
            continue
        if manifest.files.get(file) == file_digest(path):
            continue
        try:
            with Image.open(path) as image:
                image.convert("RGB").load()
        except Exception as exc:  # Pillow raises OSError, SyntaxError, ValueError... for bad bytes
            found.append(CorruptFile(file, f"{type(exc).__name__}: {str(exc).strip() or 'cannot decode'}"))
    return found


def changed_packed_files(folder: Path, manifest: Manifest, prefix: str) -> list[str]:
    """The files under ``folder/prefix`` (a packed variant) whose bytes differ from the manifest's, or that it
    does not list: a packed variant written by something else than ``fwbench data make`` is not read."""
    changed = []
    for path in sorted((folder / prefix).rglob("*")):
        if path.is_file():
            relative = str(path.relative_to(folder))
            if manifest.files.get(relative) != file_digest(path):
                changed.append(relative)
    return changed
