"""The SQLite results store: WAL, ``PRAGMA user_version`` schema versions, forward migrations.

Each finished comparison group's cells (with their timed blocks) are committed in one short transaction, so a
manager killed at any moment loses no finished group. ``UNIQUE(run_id, case_key)`` makes a cell impossible to store twice.
Times are stored in seconds and sizes in bytes; raw samples are kept as a JSON array. A write that finds the disk
full raises :class:`~fwbench.diskfull.DiskFull` (one line with the path; SQLite has rolled the transaction back, what
was committed before is kept).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fwbench.details import ServingDetails
from fwbench.diskfull import DiskFull, disk_full_cause, low_space_cause
from fwbench.measure.environment import machine_ids
from fwbench.measure.rounds import Block
from fwbench.profile.cells import ProfiledCell
from fwbench.profile.summary import OpRow
from fwbench.spec import CASE_FIELDS, Case, Plan, ShardSpec
from fwbench.store.moderation import moderate
from fwbench.store.records import COLUMN_NAMES, ProfileRecord, ResultRecord, profile_record, unfinished

SQLITE_HEADER = b"SQLite format 3\x00"
APPLICATION_ID = 0x66776262  # "fwbb": PRAGMA application_id of fwbench databases
BUSY_TIMEOUT_MS = 60_000

# Forward migrations: MIGRATIONS[i] (a tuple of statements) takes user_version i to i + 1.
# Migration 1 stamps application_id, so fwbench recognises its own databases.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        f"PRAGMA application_id = {APPLICATION_ID}",
        """
        CREATE TABLE runs (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            created TEXT NOT NULL,
            finished TEXT,
            suite TEXT,
            command TEXT NOT NULL,
            settings_json TEXT NOT NULL,
            plan_json TEXT NOT NULL,
            environment_json TEXT NOT NULL,
            fwbench_version TEXT NOT NULL
        )
        """,
        """
        CREATE TABLE results (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
            case_key TEXT NOT NULL,
            created TEXT NOT NULL,
            model TEXT NOT NULL,
            runtime TEXT NOT NULL,
            phase TEXT NOT NULL,
            batch_size INTEGER NOT NULL,
            seq_len INTEGER,
            dtype TEXT NOT NULL,
            device TEXT NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('ok','oom','timeout','error','skipped','mismatch')),
            reason TEXT,
            protocol TEXT,
            samples_json TEXT NOT NULL DEFAULT '[]',
            calls_per_sample INTEGER,
            n_samples INTEGER NOT NULL DEFAULT 0,
            median_s REAL,
            ci_low_s REAL,
            ci_high_s REAL,
            mean_s REAL,
            stdev_s REAL,
            min_s REAL,
            first_call_s REAL,
            peak_memory_bytes INTEGER,
            allocator_peak_bytes INTEGER,
            threads INTEGER,
            interop_threads INTEGER,
            flops INTEGER,
            wall_s REAL,
            details_json TEXT NOT NULL DEFAULT '{}',
            UNIQUE (run_id, case_key)
        )
        """,
        """
        CREATE INDEX results_by_case ON results (model, runtime, phase, batch_size, seq_len, dtype)
        """,
    ),
    # Migration 2 (rounds and interleaving): each result's comparison group, schedule and round count, the
    # machine's state while it was timed (noise) and the machine itself; every timed block. Rows written
    # before it read as one round of unpaired samples (blocks none, group computed from the case).
    (
        "ALTER TABLE results ADD COLUMN group_key TEXT",
        "ALTER TABLE results ADD COLUMN schedule TEXT",
        "ALTER TABLE results ADD COLUMN rounds INTEGER",
        "ALTER TABLE results ADD COLUMN noise_json TEXT",
        "ALTER TABLE results ADD COLUMN machine_json TEXT",
        """
        CREATE TABLE blocks (
            result_id INTEGER NOT NULL REFERENCES results(id) ON DELETE CASCADE,
            round INTEGER NOT NULL,
            block INTEGER NOT NULL,
            cycle INTEGER,
            start_unix_s REAL,
            calls INTEGER NOT NULL,
            seconds REAL NOT NULL,
            PRIMARY KEY (result_id, round, block)
        ) WITHOUT ROWID
        """,
    ),
    # Migration 3 (fwbench profile): a run's kind ('benchmark' or 'profile'; benchmark reports read benchmark runs
    # only), and each profiled cell with its op rows in tables of their own, so profiled calls never count as
    # benchmark results. Seconds are per profiled call.
    (
        "ALTER TABLE runs ADD COLUMN kind TEXT NOT NULL DEFAULT 'benchmark' CHECK (kind IN ('benchmark','profile'))",
        """
        CREATE TABLE profiles (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
            case_key TEXT NOT NULL,
            created TEXT NOT NULL,
            model TEXT NOT NULL,
            runtime TEXT NOT NULL,
            phase TEXT NOT NULL,
            batch_size INTEGER NOT NULL,
            seq_len INTEGER,
            dtype TEXT NOT NULL,
            device TEXT NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('ok','oom','timeout','error','skipped','mismatch')),
            reason TEXT,
            trace_path TEXT,
            profiler TEXT,
            calls INTEGER,
            wall_s REAL,
            busy_s REAL,
            overlap_s REAL,
            overhead_s REAL,
            unprofiled_median_s REAL,
            profiled_median_s REAL,
            attribution TEXT,
            categories_json TEXT NOT NULL DEFAULT '{}',
            uncategorized_json TEXT NOT NULL DEFAULT '[]',
            details_json TEXT NOT NULL DEFAULT '{}',
            UNIQUE (run_id, case_key)
        )
        """,
        """
        CREATE TABLE profile_ops (
            profile_id INTEGER NOT NULL REFERENCES profiles(id) ON DELETE CASCADE,
            name TEXT NOT NULL,
            category TEXT NOT NULL,
            calls_per_call REAL NOT NULL,
            self_s_per_call REAL NOT NULL,
            PRIMARY KEY (profile_id, name)
        ) WITHOUT ROWID
        """,
    ),
    # Migration 4 (phase data): a data cell's loader worker count, a grid axis like the batch size (NULL in every
    # other phase and in rows stored before it).
    ("ALTER TABLE results ADD COLUMN workers INTEGER", "ALTER TABLE profiles ADD COLUMN workers INTEGER"),
    # Migration 5 (sweeps over many machines): each result's host, hardware fingerprint and software record id
    # (older rows: computed from their machine record when read); each run's identity (uid), the hash of its full
    # plan, its shard ('I/N' of `run --shard`, NULL for the whole plan) and, for a run merged from several stores,
    # where its parts came from (`fwbench merge`).
    (
        "ALTER TABLE results ADD COLUMN hostname TEXT",
        "ALTER TABLE results ADD COLUMN hardware_id TEXT",
        "ALTER TABLE results ADD COLUMN software_id TEXT",
        "CREATE INDEX results_by_hardware ON results (hardware_id)",
        "ALTER TABLE runs ADD COLUMN uid TEXT",
        "ALTER TABLE runs ADD COLUMN plan_hash TEXT",
        "ALTER TABLE runs ADD COLUMN shard TEXT",
        "ALTER TABLE runs ADD COLUMN sources_json TEXT",
    ),
    # Migration 6 (data-parallel training): a distributed cell's process count and scaling (weak: the batch size is
    # each process's; strong: the global batch), NULL for every other cell and in rows stored before it.
    (
        "ALTER TABLE results ADD COLUMN procs INTEGER",
        "ALTER TABLE results ADD COLUMN scaling TEXT CHECK (scaling IN ('weak','strong'))",
        "ALTER TABLE profiles ADD COLUMN procs INTEGER",
        "ALTER TABLE profiles ADD COLUMN scaling TEXT CHECK (scaling IN ('weak','strong'))",
    ),
    # Migration 7 (phase serving): each serving cell's load points, one row per point of each round (in the order
    # run), written with the result from its details.serving (queries per second, seconds, CPU seconds).
    (
        """
        CREATE TABLE load_points (
            result_id INTEGER NOT NULL REFERENCES results(id) ON DELETE CASCADE,
            round INTEGER NOT NULL,
            point INTEGER NOT NULL,
            label TEXT NOT NULL,
            scenario TEXT NOT NULL,
            fraction REAL,
            target_qps REAL,
            offered_qps REAL,
            achieved_qps REAL,
            queries INTEGER,
            answered INTEGER,
            dropped INTEGER,
            timed_out INTEGER,
            failed INTEGER,
            p50_s REAL,
            p90_s REAL,
            p99_s REAL,
            p999_s REAL,
            mean_s REAL,
            max_s REAL,
            wall_s REAL,
            server_cpu_s REAL,
            client_cpu_s REAL,
            batch_rows_json TEXT NOT NULL DEFAULT '{}',
            padded_rows INTEGER,
            PRIMARY KEY (result_id, round, point)
        ) WITHOUT ROWID
        """,
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)
# The columns of a load point row taken from fwbench.details.LoadPoint by name.
LOAD_POINT_FIELDS = (
    "label", "scenario", "fraction", "target_qps", "offered_qps", "achieved_qps", "queries", "answered", "dropped",
    "timed_out", "failed", "p50_s", "p90_s", "p99_s", "p999_s", "mean_s", "max_s", "wall_s", "server_cpu_s",
    "client_cpu_s", "padded_rows",
)  # fmt: skip

# The result columns add_result takes from its ``fields``: every record column except those it writes itself from
# the run, the case and the samples.
OWN_COLUMNS = frozenset(
    {"id", "run_id", "case_key", "created", "n_samples", *(f.name for f in dataclasses.fields(Case))}
)
RESULT_COLUMNS = tuple(name for name in COLUMN_NAMES if name not in OWN_COLUMNS)


def _id_filter(column: str, ids: Iterable[int] | None) -> tuple[str, tuple[int, ...]]:
    """A ``WHERE column IN (...)`` clause and its parameters; empty when ``ids`` is None."""
    if ids is None:
        return "", ()
    values = tuple(int(i) for i in ids)
    return f" WHERE {column} IN ({', '.join('?' for _ in values) or 'NULL'})", values


def case_columns(run_id: int, case: Case) -> dict[str, Any]:
    """The columns every per-cell table (``results``, ``profiles``) starts with: run, case key, creation time and
    the case's fields."""
    return {
        "run_id": run_id,
        "case_key": case.key,
        "created": now_iso(),
        **{name: getattr(case, name) for name in CASE_FIELDS},
    }


class StoreError(Exception):
    """A database that cannot be used; the message is one line for the user."""


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


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


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


def migrate(conn: sqlite3.Connection, migrations: Sequence[Sequence[str]] = MIGRATIONS) -> int:
    """Apply the forward migrations this database lacks, each in its own transaction; return the version."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > len(migrations):
        raise StoreError(
            f"database schema version {version} is newer than this fwbench supports ({len(migrations)}); upgrade fwbench"
        )
    for target in range(version + 1, len(migrations) + 1):
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Re-read under the write lock: another process may have migrated meanwhile.
            if conn.execute("PRAGMA user_version").fetchone()[0] >= target:
                conn.execute("ROLLBACK")
                continue
            for statement in migrations[target - 1]:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {target}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:  # SQLite rolls back itself after some errors (a full disk): not twice
                conn.execute("ROLLBACK")
            raise
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def apply_pending_migrations(conn: sqlite3.Connection) -> int:
    """Apply the migrations this database lacks inside the caller's open transaction (``fwbench merge``: a merge
    that fails leaves an older target as it was); return the version."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > len(MIGRATIONS):
        raise StoreError(f"database schema version {version} is newer than this fwbench supports; upgrade fwbench")
    for target in range(version + 1, len(MIGRATIONS) + 1):
        for statement in MIGRATIONS[target - 1]:
            conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {target}")
    return len(MIGRATIONS)


def check_identity(conn: sqlite3.Connection, path: Path, *, readonly: bool, allow_old: bool = False) -> None:
    """Refuse a database that fwbench did not create, or one this version cannot read; writes nothing."""
    # One read transaction, so the three reads see one snapshot: read one by one, a process that
    # commits the first migration in between makes a fresh database look like a foreign one.
    conn.execute("BEGIN")
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        application_id = conn.execute("PRAGMA application_id").fetchone()[0]
        has_tables = conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0] > 0
    finally:
        if conn.in_transaction:  # a read that failed for a full disk has ended it: a COMMIT would hide why
            conn.execute("COMMIT")
    if version == 0:
        if has_tables or application_id not in (0, APPLICATION_ID):
            raise StoreError(f"--db {path} is an SQLite database that fwbench did not create; refusing to touch it")
        if readonly:
            raise StoreError(f"--db {path} holds no fwbench results yet")
        return
    if application_id != APPLICATION_ID:
        raise StoreError(f"--db {path} is an SQLite database that fwbench did not create; refusing to touch it")
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"--db {path}: database schema version {version} is newer than this fwbench supports "
            f"({SCHEMA_VERSION}); upgrade fwbench"
        )
    if readonly and version < SCHEMA_VERSION and not allow_old:
        raise StoreError(
            f"--db {path}: schema version {version} predates this fwbench ({SCHEMA_VERSION}); "
            "the next `fwbench run --db` on it migrates it"
        )


def _enable_wal(conn: sqlite3.Connection) -> None:
    """Switch to WAL, retrying: the switch needs a lock that SQLite's busy handler does not wait for."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    delay = 0.01
    while True:
        try:
            if conn.execute("PRAGMA journal_mode = WAL").fetchone()[0] == "wal":
                return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise StoreError("could not switch the database to WAL mode")
        time.sleep(delay)
        delay = min(delay * 2, 0.5)


@dataclass
class RunRecord:
    id: int
    created: str
    finished: str | None
    suite: str | None
    command: str
    settings: dict[str, Any]
    plan: Plan
    environment: dict[str, Any]
    fwbench_version: str
    kind: str = "benchmark"  # or "profile" (fwbench profile): its cells are in the profiles table
    uid: str | None = None  # the run's identity across stores (None: stored before migration 5)
    plan_hash: str | None = None  # the full plan's digest (shards of one plan share it)
    shard: str | None = None  # 'I/N' when the run holds one shard of its plan; None: the whole plan
    sources: list[dict[str, Any]] | None = None  # fwbench merge: the runs this one was merged from

    @property
    def planned(self) -> Plan:
        """The cells this run is to hold: its shard of the plan, or the whole plan."""
        return self.plan.shard(None if self.shard is None else ShardSpec.parse(self.shard))

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "uid": self.uid,
            "plan_hash": self.plan_hash,
            "shard": self.shard,
            "sources": self.sources,
            "kind": self.kind,
            "created": self.created,
            "finished": self.finished,
            "suite": self.suite,
            "command": self.command,
            "settings": self.settings,
            "cells": self.planned.size,
            "environment": self.environment,
            "fwbench_version": self.fwbench_version,
        }


class Store:
    """A results database. Open with :meth:`open`; every write is its own short transaction."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self.conn = conn
        self.path = path

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        create: bool = True,
        readonly: bool = False,
        allow_old: bool = False,
        defer_migration: bool = False,
    ) -> Store:
        """Open (and, unless ``readonly``, create and migrate) the database at ``path``; ``allow_old``: a read-only
        open accepts an older schema (a caller that only checks the file, or reads what every version has);
        ``defer_migration``: the caller migrates inside its own transaction (:func:`apply_pending_migrations`).

        A file that is not an fwbench database is refused before anything is written to it.
        """
        db_path = Path(path)
        check_database_path(db_path, create=create and not readonly, writable=not readonly)
        if not readonly:
            db_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            if readonly:
                conn = sqlite3.connect(
                    f"{db_path.resolve().as_uri()}?mode=ro",
                    uri=True,
                    timeout=BUSY_TIMEOUT_MS / 1000,
                    isolation_level=None,
                )
            else:
                conn = sqlite3.connect(db_path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            check_identity(conn, db_path, readonly=readonly, allow_old=allow_old)
            if not readonly:
                _enable_wal(conn)
                conn.execute("PRAGMA synchronous = NORMAL")
                conn.execute("PRAGMA foreign_keys = ON")
                if not defer_migration:
                    migrate(conn)
        except sqlite3.DatabaseError as exc:
            full = disk_full(exc, db_path)
            if full is not None:
                raise full from exc
            raise StoreError(f"--db {db_path}: {exc}") from None
        return cls(conn, db_path)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- runs ---------------------------------------------------------------------------------
    def create_run(
        self,
        plan: Plan,
        command: str,
        environment: dict[str, Any],
        version: str,
        kind: str = "benchmark",
        shard: ShardSpec | None = None,
    ) -> int:
        """A new run of ``plan`` (the whole plan is stored; ``shard``: the part this run holds); its id."""
        return self.insert_run(
            {
                "created": now_iso(),
                "suite": plan.suite,
                "command": command,
                "settings_json": json.dumps(plan.settings.to_dict(), sort_keys=True),
                "plan_json": plan.to_json(),
                "environment_json": json.dumps(environment, sort_keys=True),
                "fwbench_version": version,
                "kind": kind,
                "uid": uuid.uuid4().hex,
                "plan_hash": plan.digest,
                "shard": None if shard is None else str(shard),
            }
        )

    def insert_run(self, columns: dict[str, Any]) -> int:
        """Insert one ``runs`` row from its column values; its new id."""
        return self.insert_row("runs", columns)

    def insert_row(self, table: str, columns: dict[str, Any]) -> int:
        """Insert one row of ``table`` from its column values (``fwbench merge`` copies rows this way); its id."""
        with self.writing():
            cursor = self.conn.execute(
                f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})",
                tuple(columns.values()),
            )
        return int(cursor.lastrowid or 0)

    def finish_run(self, run_id: int) -> None:
        with self.writing():
            self.conn.execute("UPDATE runs SET finished = ? WHERE id = ?", (now_iso(), run_id))

    def _run_from_row(self, row: sqlite3.Row) -> RunRecord:
        return RunRecord(
            id=row["id"],
            created=row["created"],
            finished=row["finished"],
            suite=row["suite"],
            command=row["command"],
            settings=json.loads(row["settings_json"]),
            plan=Plan.from_json(row["plan_json"]),
            environment=json.loads(row["environment_json"]),
            fwbench_version=row["fwbench_version"],
            kind=row["kind"],
            uid=row["uid"],
            plan_hash=row["plan_hash"],
            shard=row["shard"],
            sources=json.loads(row["sources_json"]) if row["sources_json"] else None,
        )

    def get_run(self, run_id: int) -> RunRecord | None:
        row = self.conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        return None if row is None else self._run_from_row(row)

    def runs(self, run_ids: Iterable[int] | None = None) -> list[RunRecord]:
        where, params = _id_filter("id", run_ids)
        rows = self.conn.execute(f"SELECT * FROM runs{where} ORDER BY id", params).fetchall()
        return [self._run_from_row(r) for r in rows]

    def latest_run_id(self, kind: str = "benchmark") -> int | None:
        """The newest run of ``kind`` (benchmark reports never pick a profile run as 'latest')."""
        row = self.conn.execute("SELECT MAX(id) FROM runs WHERE kind = ?", (kind,)).fetchone()
        return None if row[0] is None else int(row[0])

    # -- profiles (fwbench profile) ---------------------------------------------------------------
    def add_profile(
        self,
        run_id: int,
        case: Case,
        status: str,
        reason: str | None,
        cell: ProfiledCell | None,
        details: dict[str, Any],
    ) -> int:
        """Store one profiled cell (``cell`` None when it did not end ``ok``) with its op rows, in one transaction."""
        summary = cell.summary if cell is not None else None
        with self.transaction():
            values = {
                **case_columns(run_id, case),
                "status": status,
                "reason": reason,
                "trace_path": cell.trace if cell else None,
                "profiler": cell.profiler if cell else None,
                "calls": summary.calls if summary else None,
                "wall_s": summary.wall_s if summary else None,
                "busy_s": summary.busy_s if summary else None,
                "overlap_s": summary.overlap_s if summary else None,
                "overhead_s": summary.overhead_s if summary else None,
                "unprofiled_median_s": cell.unprofiled_median_s if cell else None,
                "profiled_median_s": cell.profiled_median_s if cell else None,
                "attribution": cell.attribution if cell else None,
                "categories_json": json.dumps(summary.categories_s if summary else {}),
                "uncategorized_json": json.dumps(summary.uncategorized if summary else []),
                "details_json": json.dumps(details, sort_keys=True, default=str),
            }
            cursor = self.conn.execute(
                f"INSERT INTO profiles ({', '.join(values)}) VALUES ({', '.join('?' for _ in values)})",
                tuple(values.values()),
            )
            profile_id = int(cursor.lastrowid or 0)
            if summary is not None:
                self.conn.executemany(
                    "INSERT INTO profile_ops (profile_id, name, category, calls_per_call, self_s_per_call)"
                    " VALUES (?, ?, ?, ?, ?)",
                    [(profile_id, op.name, op.category, op.calls_per_call, op.self_s_per_call) for op in summary.ops],
                )
        return profile_id

    def profiles(self, run_ids: Iterable[int] | None = None) -> list[ProfileRecord]:
        """The profiled cells of ``run_ids`` (default: every run), in the order they were stored."""
        where, params = _id_filter("run_id", run_ids)
        rows = self.conn.execute(f"SELECT * FROM profiles{where} ORDER BY id", params).fetchall()
        ops: dict[int, list[OpRow]] = {}
        for op in self.conn.execute(
            "SELECT * FROM profile_ops WHERE profile_id IN (SELECT id FROM profiles" + where + ")", params
        ).fetchall():
            ops.setdefault(op["profile_id"], []).append(
                OpRow(op["name"], op["category"], op["calls_per_call"], op["self_s_per_call"])
            )
        return [profile_record(row, ops.get(row["id"], [])) for row in rows]

    # -- results ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Around writes: a write that finds the disk full raises :class:`~fwbench.diskfull.DiskFull` (one line,
        the database path) instead of SQLite's error; what was committed before is kept."""
        try:
            yield
        except sqlite3.Error as exc:
            full = disk_full(exc, self.path)
            if full is None:
                raise
            raise full from exc

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """One write transaction around the block (committed at its end, rolled back on an exception; DiskFull
        when the disk is full, at a statement or at the commit)."""
        with self.writing():
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield
                self.conn.execute("COMMIT")
            except BaseException:
                # SQLite has rolled back itself after some errors (SQLITE_FULL, I/O errors), at a statement or at
                # the COMMIT: a second ROLLBACK would fail and hide why ("cannot rollback - no transaction is active").
                if self.conn.in_transaction:
                    self.conn.execute("ROLLBACK")
                raise

    def add_result(
        self,
        run_id: int,
        case: Case,
        fields: dict[str, Any],
        samples: Sequence[float],
        details: dict[str, Any],
        blocks: Sequence[Block] = (),
        *,
        replace: bool = False,
    ) -> bool:
        """Store one cell's result and its timed blocks; False (and nothing written) if the run already has this
        cell. ``fields`` may hold ``noise`` and ``machine`` (JSON objects) besides the result columns.
        ``replace``: store the run's cell again, in place (its id, so its place in the run's order, kept), with these
        blocks instead of its old ones (a group's extra round); False (nothing written) when the run does not have
        it. Call inside :meth:`transaction`."""
        values = self._result_values(run_id, case, fields, samples, details)
        if replace:
            found = self.conn.execute(
                "SELECT id FROM results WHERE run_id = ? AND case_key = ?", (run_id, case.key)
            ).fetchone()
            if found is None:
                return False
            assignments = ", ".join(f"{name} = ?" for name in values)
            self.conn.execute(f"UPDATE results SET {assignments} WHERE id = ?", (*values.values(), found[0]))
            self.conn.execute("DELETE FROM blocks WHERE result_id = ?", (found[0],))
            self.conn.execute("DELETE FROM load_points WHERE result_id = ?", (found[0],))
            self._add_blocks(int(found[0]), blocks)
            self._add_load_points(int(found[0]), details)
            return True
        names = ", ".join(values)
        marks = ", ".join("?" for _ in values)
        cursor = self.conn.execute(
            f"INSERT INTO results ({names}) VALUES ({marks}) ON CONFLICT (run_id, case_key) DO NOTHING",
            tuple(values.values()),
        )
        if cursor.rowcount != 1:
            return False
        self._add_blocks(int(cursor.lastrowid or 0), blocks)
        self._add_load_points(int(cursor.lastrowid or 0), details)
        return True

    @staticmethod
    def _result_values(
        run_id: int, case: Case, fields: dict[str, Any], samples: Sequence[float], details: dict[str, Any]
    ) -> dict[str, Any]:
        """A result row's columns from a cell's fields, samples and details."""
        columns = {name: fields.get(name) for name in RESULT_COLUMNS}
        columns["noise_json"] = None if fields.get("noise") is None else json.dumps(fields["noise"], sort_keys=True)
        columns["machine_json"] = (
            None if fields.get("machine") is None else json.dumps(fields["machine"], sort_keys=True)
        )
        columns["hostname"], columns["hardware_id"], columns["software_id"] = machine_ids(fields.get("machine"))
        return {
            **case_columns(run_id, case),
            "samples_json": json.dumps(list(samples)),
            "n_samples": len(samples),
            "details_json": json.dumps(details, sort_keys=True, default=str),
            **columns,
        }

    def _add_load_points(self, result_id: int, details: dict[str, Any]) -> None:
        """A serving cell's load points (details.serving, every round), one row each; nothing for other cells."""
        serving = ServingDetails.parse(details.get("serving"))
        if serving is None:
            return
        names = ("result_id", "round", "point", *LOAD_POINT_FIELDS, "batch_rows_json")
        rows = [
            (result_id, round_index, index, *(getattr(p, name) for name in LOAD_POINT_FIELDS),
             json.dumps(p.batch_rows, sort_keys=True))
            for round_index, served in enumerate(serving.rounds)
            for index, p in enumerate(served.points)
            if p.label is not None and p.scenario is not None
        ]  # fmt: skip
        self.conn.executemany(
            f"INSERT INTO load_points ({', '.join(names)}) VALUES ({', '.join('?' for _ in names)})", rows
        )

    def _add_blocks(self, result_id: int, blocks: Sequence[Block]) -> None:
        self.conn.executemany(
            "INSERT INTO blocks (result_id, round, block, cycle, start_unix_s, calls, seconds) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(result_id, b.round, b.index, b.cycle, b.start_unix_s, b.calls, b.seconds) for b in blocks],
        )

    def mark_mismatch(
        self, run_id: int, model: str, runtime: str, phase: str, reason: str, procs: int | None = None
    ) -> int:
        """Set status ``mismatch`` and ``reason`` on every cell of run ``run_id`` with this model, runtime and
        phase (``fwbench verify --phase training --db --run``), only those of ``procs`` processes when given; the
        number of cells changed."""
        clause, params = ("", ()) if procs is None else (" AND procs = ?", (procs,))
        with self.writing(), self.conn:
            cursor = self.conn.execute(
                "UPDATE results SET status = 'mismatch', reason = ? WHERE run_id = ? AND model = ? AND runtime = ? "
                f"AND phase = ?{clause}",
                (reason, run_id, model, runtime, phase, *params),
            )
        return cursor.rowcount

    def done_keys(self, run_id: int, min_rounds: int = 1) -> set[str]:
        """Keys of the run's cells that are done: a terminal status, and not :func:`~fwbench.store.records.unfinished`
        (an ``ok`` cell with fewer than ``min_rounds`` rounds, which ``--resume`` runs again)."""
        rows = self.conn.execute("SELECT case_key, status, rounds FROM results WHERE run_id = ?", (run_id,))
        return {key for key, status, rounds in rows if not unfinished(status, rounds, min_rounds)}

    def results(self, run_ids: Iterable[int] | None = None) -> list[ResultRecord]:
        """Result records (samples and details decoded, details typed), in run then insertion order; whole runs,
        so each run's cell intervals are moderated over its cells (:mod:`fwbench.store.moderation`)."""
        where, params = _id_filter("run_id", run_ids)
        return moderate(self._records(f"{where} ORDER BY run_id, id", params))

    def _records(self, clause: str, params: tuple[Any, ...]) -> list[ResultRecord]:
        """Result records selected by ``clause`` (WHERE / ORDER BY)."""
        rows = [dict(row) for row in self.conn.execute(f"SELECT * FROM results {clause}", params).fetchall()]
        blocks = self._blocks([row["id"] for row in rows])
        return [ResultRecord.from_row({**row, "blocks": blocks.get(row["id"], ())}) for row in rows]

    def _blocks(self, result_ids: Sequence[int]) -> dict[int, tuple[Block, ...]]:
        """The timed blocks of each of ``result_ids``, in round then block order."""
        found: dict[int, list[Block]] = {}
        for start in range(0, len(result_ids), 500):
            chunk = result_ids[start : start + 500]
            marks = ", ".join("?" for _ in chunk)
            for row in self.conn.execute(
                f"SELECT result_id, round, block, cycle, start_unix_s, calls, seconds FROM blocks "
                f"WHERE result_id IN ({marks}) ORDER BY result_id, round, block",
                tuple(chunk),
            ):
                found.setdefault(row[0], []).append(Block(row[1], row[2], row[3], row[4], row[5], row[6]))
        return {key: tuple(value) for key, value in found.items()}

    def result(self, run_id: int, case_key: str) -> ResultRecord | None:
        """One stored cell of run ``run_id`` as :meth:`results` gives it, or None."""
        records = self._records("WHERE run_id = ? AND case_key = ?", (run_id, case_key))
        return records[0] if records else None

    def integrity_ok(self) -> bool:
        return bool(self.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok")
