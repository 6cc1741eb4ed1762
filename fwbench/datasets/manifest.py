"""``manifest.json``: what a dataset folder holds and how it was made, with a digest of every file's bytes."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Manifest:
    """A dataset folder: ``kind`` ("images" or "text"), ``name`` (a data cell's model field, e.g. "images-256"),
    the generator's arguments, and ``files``: relative path → SHA-256 of its bytes (sorted by path)."""

    kind: str
    name: str
    arguments: dict[str, Any]
    files: dict[str, str] = field(default_factory=dict)

    @property
    def digest(self) -> str:
        """SHA-256 over the sorted (path, file digest) pairs: equal for two folders with the same bytes."""
        return hashlib.sha256(json.dumps(sorted(self.files.items())).encode()).hexdigest()


def file_digest(path: Path) -> str:
    """SHA-256 of ``path``'s bytes, hex."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_manifest(folder: Path, kind: str, name: str, arguments: dict[str, Any]) -> Manifest:
    """Describe every file under ``folder`` (the manifest itself excepted) and write ``folder/manifest.json``."""
    files = {
        str(path.relative_to(folder)): file_digest(path)
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != MANIFEST
    }
    manifest = Manifest(kind, name, arguments, files)
    (folder / MANIFEST).write_text(json.dumps({**asdict(manifest), "digest": manifest.digest}, indent=1) + "\n")
    return manifest


def read_manifest(folder: Path) -> Manifest:
    """The manifest of a folder ``fwbench data make`` wrote; ValueError (one line) if there is none."""
    path = folder / MANIFEST
    if not path.is_file():
        raise ValueError(f"{folder} has no {MANIFEST}: not a folder written by 'fwbench data make'")
    stored = json.loads(path.read_text())
    return Manifest(stored["kind"], stored["name"], stored["arguments"], stored["files"])
