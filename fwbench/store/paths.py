"""Database path checks and disk-full detection: whether a ``--db`` path is (or may become) a writable SQLite file,
checked before anything is written to it, and which SQLite errors mean the disk holding it is full.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from pathlib import Path

from fwbench.diskfull import DiskFull, disk_full_cause, low_space_cause
from fwbench.store.errors import StoreError

SQLITE_HEADER = b"SQLite format 3\x00"


def disk_full(exc: sqlite3.Error, path: Path) -> DiskFull | None:
    """The :class:`DiskFull` of ``exc`` when it is a write to the database ``path`` that found no room (SQLite rolled
    back the transaction it was in: what was committed before is kept); None for any other error.

    SQLITE_FULL names it; an I/O error with next to no space left on ``path``'s file system is taken for it too
    (opening a database in WAL mode grows its index file, ``-shm``: SQLite reports that failing as
    SQLITE_IOERR_SHMSIZE, without the ENOSPC behind it)."""
    cause = disk_full_cause(exc)
    name = str(getattr(exc, "sqlite_errorname", ""))
    if cause is None and name.startswith("SQLITE_IOERR"):
        cause = low_space_cause(path, name)
    return None if cause is None else DiskFull(path, cause, "what it held before is kept")


def _folder_writable(folder: Path) -> bool:
    """Whether a file can be created in ``folder`` (probed for real: root passes os.access checks)."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".fwbench-probe-", dir=folder)
    except OSError:
        return False
    os.close(fd)
    os.unlink(probe)
    return True


def _file_writable(path: Path) -> bool:
    """Whether ``path`` opens for writing (opened in append mode and closed: its bytes are untouched)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
    except OSError:
        return False
    return True


def check_database_path(path: Path, *, create: bool, writable: bool = True) -> None:
    """Raise StoreError unless ``path`` is (or, with ``create``, may become) a writable SQLite file.

    Nothing is written: a file that is not SQLite is left byte-for-byte untouched.
    """
    if path.is_dir():
        raise StoreError(f"--db {path} is a directory; give a database file path")
    folder = path.parent
    if path.exists():
        if not path.is_file():
            raise StoreError(f"--db {path} is not a regular file")
        with path.open("rb") as handle:
            header = handle.read(len(SQLITE_HEADER))
        if header and header != SQLITE_HEADER:
            raise StoreError(f"--db {path} is not an SQLite database; refusing to touch it")
        if writable and (not _file_writable(path) or not _folder_writable(folder)):
            raise StoreError(f"--db {path} is not writable (the file and its folder must be writable)")
        return
    if not create:
        raise StoreError(f"--db {path} does not exist")
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir() or not _folder_writable(folder):
        raise StoreError(f"--db {path}: cannot create it, {folder} is not a writable folder")
