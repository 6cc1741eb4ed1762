"""The database schema: the tables as forward migrations (``PRAGMA user_version`` counts those applied), applying
them (:func:`migrate`, :func:`apply_pending_migrations`), recognising fwbench's own databases
(:func:`check_identity`, ``PRAGMA application_id``) and switching a database to WAL.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path

from fwbench.store.errors import StoreError

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


def enable_wal(conn: sqlite3.Connection) -> None:
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
