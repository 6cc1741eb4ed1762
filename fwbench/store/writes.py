"""The store's write side (:class:`ResultWrites`, a base of :class:`~fwbench.store.db.Store`): write transactions
that turn a full disk into one line, and a cell's result row with its timed blocks and load points.

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
import sqlite3
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fwbench.details import ServingDetails
from fwbench.measure.environment import machine_ids
from fwbench.measure.rounds import Block
from fwbench.spec import CASE_FIELDS, Case
from fwbench.store.paths import disk_full
from fwbench.store.records import COLUMN_NAMES

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


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def case_columns(run_id: int, case: Case) -> dict[str, Any]:
    """The columns every per-cell table (``results``, ``profiles``) starts with: run, case key, creation time and
    the case's fields."""
    return {
        "run_id": run_id,
        "case_key": case.key,
        "created": now_iso(),
        **{name: getattr(case, name) for name in CASE_FIELDS},
    }


class ResultWrites:
    """The write side of :class:`~fwbench.store.db.Store` (which sets ``conn`` and ``path``): write transactions,
    result rows with their blocks and load points, mismatch marks."""

    conn: sqlite3.Connection
    path: Path

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
