"""The results store, :class:`Store`: opening a database (its path checked and its schema migrated:
:mod:`~fwbench.store.paths`, :mod:`~fwbench.store.schema`), its runs (:class:`RunRecord`), profiled cells and the
queries that read results back (the write side, results and transactions, is its base
:class:`~fwbench.store.writes.ResultWrites`).
"""

from __future__ import annotations

import json
import os
import sqlite3
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fwbench.measure.rounds import Block
from fwbench.profile.cells import ProfiledCell
from fwbench.profile.summary import OpRow
from fwbench.spec import Case, Plan, ShardSpec
from fwbench.store.errors import StoreError
from fwbench.store.moderation import moderate
from fwbench.store.paths import check_database_path, disk_full
from fwbench.store.records import ProfileRecord, ResultRecord, profile_record, unfinished
from fwbench.store.schema import BUSY_TIMEOUT_MS, check_identity, enable_wal, migrate
from fwbench.store.writes import ResultWrites, case_columns, now_iso


def _id_filter(column: str, ids: Iterable[int] | None) -> tuple[str, tuple[int, ...]]:
    """A ``WHERE column IN (...)`` clause and its parameters; empty when ``ids`` is None."""
    if ids is None:
        return "", ()
    values = tuple(int(i) for i in ids)
    return f" WHERE {column} IN ({', '.join('?' for _ in values) or 'NULL'})", values


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


class Store(ResultWrites):
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
                enable_wal(conn)
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
