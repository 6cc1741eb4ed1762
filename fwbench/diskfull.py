"""A write that failed for want of space, said in one line the same way wherever fwbench writes (the results
database, dataset folders, exported artefacts, profile traces): which path, which error, what was kept, how to go on.

SQLite reports a full disk as SQLITE_FULL ("database or disk is full"); the operating system as ENOSPC (EDQUOT past a
disk quota). A file past the process's size limit (``ulimit -f``, RLIMIT_FSIZE, with SIGXFSZ ignored) fails with
EFBIG, worded apart: freeing space does not help there. Libraries that write in C (TensorFlow's file system, a
compiler) raise their own exceptions; their message carries the system's text (``os.strerror``), which is matched.
Only the standard library is imported: the worker uses this too.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# The OSError numbers that mean "no room for this write", by name.
CAUSES = {errno.ENOSPC: "ENOSPC", errno.EDQUOT: "EDQUOT", errno.EFBIG: "EFBIG"}
TEXTS = {os.strerror(number): name for number, name in CAUSES.items()}  # "No space left on device", ...
SQLITE_FULL = 13  # SQLite's primary result code (sqlite3.SQLITE_FULL); an extended code keeps it in its low byte
# Below this much free space, a write error SQLite cannot name (SQLITE_IOERR_*: growing the WAL index, -shm, on a
# full file system fails so) is taken for a full disk: SQLite grows its files by pages of a few KiB at most.
LOW_SPACE_BYTES = 1 << 20
KEPT, THEN = "what was written before is kept", "run the command again"  # unless the caller knows better


class DiskFull(Exception):
    """A write that found no room: ``path`` (what was being written), ``cause`` (SQLITE_FULL, ENOSPC, EDQUOT,
    EFBIG, or an SQLite I/O error with the free space seen), ``kept`` (what the failure left intact) and ``then``
    (how to go on once there is room). ``str()`` is the one line for the user; the command exits 1."""

    def __init__(self, path: str | os.PathLike[str], cause: str, kept: str = KEPT, then: str = THEN) -> None:
        super().__init__(str(path), cause, kept, then)
        self.path, self.cause, self.kept, self.then = str(path), cause, kept, then

    def __str__(self) -> str:
        too_large = self.cause == "EFBIG"
        what = "file too large (the file size limit, ulimit -f)" if too_large else "disk full"
        room = "raise the limit" if too_large else "free space"
        return f"fwbench: {what} writing {self.path} ({self.cause}): {self.kept}; {room} and {self.then}"

    def told(self, kept: str, then: str) -> DiskFull:
        """The same failure, with what the caller knows was kept and how to go on."""
        return DiskFull(self.path, self.cause, kept, then)

    @classmethod
    def from_report(
        cls,
        report: dict[str, Any],
        path: str | os.PathLike[str],
        kept: str = KEPT,
        then: str = THEN,
        partial: str | os.PathLike[str] | None = None,
    ) -> DiskFull:
        """The failure :func:`disk_full_report` described, at the file it named, else at ``path``; a file named
        inside ``partial`` (what is written under a temporary name and renamed to ``path`` when complete) counts
        as ``path``."""
        named = report.get("path")
        if not named or partial is not None and Path(named).is_relative_to(partial):
            named = path
        return cls(named, str(report.get("cause") or "ENOSPC"), kept, then)


def cells_kept(count: int, verb: str) -> str:
    """``the 12 cells stored before are kept`` (``verb``: what was done to them)."""
    return f"the {count} cell{'' if count == 1 else 's'} {verb} before {'is' if count == 1 else 'are'} kept"


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def disk_full_cause(exc: BaseException) -> str | None:
    """``SQLITE_FULL``, ``ENOSPC``, ``EDQUOT`` or ``EFBIG`` when ``exc`` (or one it came from) is a write that
    found no room; None otherwise."""
    for item in _chain(exc):
        if isinstance(item, OSError) and item.errno in CAUSES:
            return CAUSES[item.errno]
        if isinstance(item, sqlite3.Error) and (getattr(item, "sqlite_errorcode", 0) or 0) & 0xFF == SQLITE_FULL:
            return "SQLITE_FULL"
    for item in _chain(exc):  # a C library's own exception, with the system's words
        text = str(item)
        for message, name in TEXTS.items():
            if message in text:
                return name
    return None


def disk_full_report(exc: BaseException) -> dict[str, Any] | None:
    """What a worker sends back when ``exc`` is a write that found no room: ``cause`` and ``path`` (the file the
    error names, or None); None for any other failure."""
    cause = disk_full_cause(exc)
    if cause is None:
        return None
    path = next((str(item.filename) for item in _chain(exc) if isinstance(item, OSError) and item.filename), None)
    return {"cause": cause, "path": path}


SHARED_MEMORY = Path("/dev/shm")  # a loader's shared memory: full there is the cell's limit, not the disk's


def stops_the_sweep(report: dict[str, Any]) -> bool:
    """Whether a worker's :func:`disk_full_report` is a full file system the sweep cannot go on writing to: a file
    it names outside shared memory. A report without a path (a C library's text) or in ``/dev/shm`` (a DataLoader's
    shared memory) is that cell's error, stored as such."""
    path = report.get("path")
    return bool(path) and not Path(str(path)).absolute().is_relative_to(SHARED_MEMORY)


def free_bytes(path: str | os.PathLike[str]) -> int | None:
    """The bytes this process may still write on the file system of ``path`` (or of its nearest existing folder;
    root may use the reserved blocks too); None when it cannot be asked."""
    where = Path(path).absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        stats = os.statvfs(where)
    except OSError:
        return None
    blocks = stats.f_bfree if os.geteuid() == 0 else stats.f_bavail
    return blocks * stats.f_frsize


def low_space_cause(path: str | os.PathLike[str], symptom: str) -> str | None:
    """``symptom`` and the free space left, when the file system of ``path`` has next to none left (a write that
    failed without saying why, there, found the disk full); None otherwise."""
    free = free_bytes(path)
    if free is None or free >= LOW_SPACE_BYTES:
        return None
    return f"{symptom}, {free // 1024} KiB free"
