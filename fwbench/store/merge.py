"""``fwbench merge``: several results databases into one, ids remapped, shards of one plan reunited.

Every source is first copied with SQLite's backup API into a temporary folder (a consistent snapshot, WAL
included; the source is never written), checked (``PRAGMA integrity_check``) and migrated there. The target (an
existing fwbench database or a new one) is migrated and merged into in **one transaction**: on any error nothing of
the merge, its schema migration included, reaches it, and a target this merge created is removed.

Every run is made of *parts*: the runs it was merged from (``runs.sources_json``), or itself. A part is identified
by its run's ``uid`` (runs stored before uids: a hash of their creation time, command and plan). A source run meets
the target run that already holds one of its parts, or, for shards (``run --shard I/N``), the target run that
gathers shards of the same plan (same plan hash, same N). It adds the cells that run lacks (a source merged before,
then resumed, brings its new cells) and the parts it lacks; a run with nothing new is reported as a duplicate.
The gathering run's ``shard`` lists the shards it holds (``1,2/3``), NULL once all N are in. The same shard held by
two different runs is a conflict (one line, nothing written).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fwbench.diskfull import DiskFull
from fwbench.spec import ShardSpec
from fwbench.store.db import Store
from fwbench.store.errors import StoreError
from fwbench.store.paths import check_database_path, disk_full
from fwbench.store.records import unfinished
from fwbench.store.schema import apply_pending_migrations


@dataclass
class MergedRun:
    """One run of the target that this merge created or extended."""

    run_id: int
    plan_hash: str | None
    shard: str | None  # what the run holds now: None (the whole plan) or 'I,J/N'
    cells: int = 0  # cells added by this merge
    parts: list[str] = field(default_factory=list)  # 'A.db run 3 (shard 1/2)'


@dataclass
class MergeSummary:
    """What a merge did: the target runs it wrote and the source runs that brought nothing new."""

    runs: list[MergedRun] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)


Row = dict[str, Any]


def run_identity(row: Row) -> str:
    """A run's identity across stores: its uid, or (stored before uids) a hash of when and how it was made."""
    if row.get("uid"):
        return str(row["uid"])
    text = f"{row['created']}|{row['command']}|{row['plan_json']}"
    return "legacy-" + hashlib.sha256(text.encode()).hexdigest()[:32]


def own_part(label: str, run: Row) -> dict[str, Any]:
    """A run as a part of a merged run: where it came from and what it held."""
    environment = json.loads(run["environment_json"])
    return {
        "file": label,
        "run_id": run["id"],
        "identity": run_identity(run),
        "shard": run["shard"],
        "command": run["command"],
        "hostname": environment.get("hostname"),
        "created": run["created"],
        "finished": run["finished"],
    }


def parts_of(label: str, run: Row) -> list[dict[str, Any]]:
    """The runs ``run`` is made of: those it was merged from, or itself."""
    sources = json.loads(run.get("sources_json") or "null")
    return list(sources) if sources else [own_part(label, run)]


def held_shards(parts: Sequence[dict[str, Any]]) -> ShardSpec | None:
    """The shards ``parts`` hold together; None for a run of the whole plan (no part holds a shard)."""
    specs = [ShardSpec.parse(part["shard"]) for part in parts if part.get("shard")]
    if not specs:
        return None
    counts = {spec.count for spec in specs}
    if len(counts) != 1:
        raise StoreError(f"one run holds shards of different counts ({sorted(counts)}); it cannot be merged")
    return ShardSpec(frozenset().union(*(spec.indices for spec in specs)), counts.pop())


def shard_column(shards: ShardSpec | None) -> str | None:
    """``runs.shard`` of a run holding ``shards``: NULL for the whole plan (no shard, or all of them)."""
    return None if shards is None or shards.complete else str(shards)


@contextmanager
def snapshot(path: Path, folder: Path) -> Iterator[Store]:
    """A migrated, integrity-checked copy of the fwbench database ``path`` in ``folder`` (StoreError, one line,
    for a file that is missing, foreign or corrupt)."""
    try:
        Store.open(path, readonly=True, allow_old=True).close()  # refuses a missing or foreign file first
    except StoreError as exc:
        raise StoreError(str(exc).removeprefix("--db ")) from None
    copy = folder / f"source-{uuid.uuid4().hex}.db"
    try:
        source = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        target = sqlite3.connect(copy)
        try:
            source.backup(target)
        finally:
            source.close()
            target.close()
        store = Store.open(copy)
    except sqlite3.DatabaseError as exc:
        full = disk_full(exc, copy)  # the copy, in the temporary folder, found no room
        if full is not None:
            raise full from exc
        raise StoreError(f"{path}: {exc}") from None
    try:
        try:
            intact = store.integrity_ok()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{path}: {exc}") from None
        if not intact:
            raise StoreError(f"{path}: the database fails SQLite's integrity check")
        yield store
    finally:
        store.close()


def _rows(store: Store, sql: str, params: Sequence[Any] = ()) -> list[Row]:
    return [dict(row) for row in store.conn.execute(sql, tuple(params)).fetchall()]


def _copy_cells(source: Store, target: Store, source_run: int, target_run: int, min_rounds: int) -> int:
    """Copy the cells of ``source_run`` that ``target_run`` lacks (results with their blocks and load points, profiles
    with their op rows; matched by case key); the number copied. A result with fewer than ``min_rounds`` rounds (the rounds so far
    of a group whose window the source run was stopped in) is not copied: the source's ``--resume`` finishes it, and
    the next merge brings it."""
    count = 0
    children = {
        "results": (("blocks", "result_id"), ("load_points", "result_id")),
        "profiles": (("profile_ops", "profile_id"),),
    }
    for table, kids in children.items():
        held = {row[0] for row in target.conn.execute(f"SELECT case_key FROM {table} WHERE run_id = ?", (target_run,))}
        for row in _rows(source, f"SELECT * FROM {table} WHERE run_id = ? ORDER BY id", [source_run]):
            if row["case_key"] in held or (table == "results" and unfinished(row["status"], row["rounds"], min_rounds)):
                continue
            old_id = row.pop("id")
            row["run_id"] = target_run
            new_id = target.insert_row(table, row)
            for child, child_key in kids:
                for sub in _rows(source, f"SELECT * FROM {child} WHERE {child_key} = ?", [old_id]):
                    sub[child_key] = new_id
                    target.insert_row(child, sub)
            count += 1
    return count


def _home(target: Store, run: Row, parts: Sequence[dict[str, Any]]) -> Row | None:
    """The target run ``run`` belongs to: the one holding one of its parts, else (a shard) the one gathering the
    shards of its plan."""
    identities = {part["identity"] for part in parts}
    shards = held_shards(parts)
    gathering = None
    for row in _rows(target, "SELECT * FROM runs WHERE kind = ? ORDER BY id", [run["kind"]]):
        row_parts = parts_of(str(target.path), row)
        if identities & {part["identity"] for part in row_parts}:
            return row
        if gathering is None and shards is not None and row["plan_hash"] == run["plan_hash"]:
            row_shards = held_shards(row_parts)
            if row_shards is not None and row_shards.count == shards.count:
                gathering = row
    return gathering


def _check_conflicts(
    label: str, run: Row, parts: Sequence[dict[str, Any]], home_parts: Sequence[dict[str, Any]]
) -> None:
    """StoreError when a shard of ``parts`` is held in ``home_parts`` by a different run."""
    for part in parts:
        if not part.get("shard"):
            continue
        indices = ShardSpec.parse(part["shard"]).indices
        for other in home_parts:
            if other.get("shard") and other["identity"] != part["identity"]:
                if indices & ShardSpec.parse(other["shard"]).indices:
                    raise StoreError(
                        f"shard {part['shard']} of plan {str(run['plan_hash'])[:12]} is in {label} run {run['id']} "
                        f"and already in {other['file']} run {other['run_id']} (two different runs of one shard); "
                        "merge one of them"
                    )


def merge_run(source: Store, label: str, run: Row, target: Store, summary: MergeSummary) -> None:
    """Merge one source run into ``target`` (inside the caller's transaction)."""
    parts = parts_of(label, run)
    home = _home(target, run, parts)
    min_rounds = int(json.loads(run["settings_json"]).get("rounds") or 1)  # the run's --rounds
    if home is None:
        columns = {key: value for key, value in run.items() if key != "id"}
        shards = held_shards(parts)
        keeps_uid = bool(run.get("sources_json")) or shards is None  # the same run; a first shard starts a new one
        columns.update(
            uid=(run["uid"] or run_identity(run)) if keeps_uid else uuid.uuid4().hex,
            sources_json=json.dumps(parts),
            shard=shard_column(shards),
        )
        home_id = target.insert_run(columns)
        added, shards_now = _copy_cells(source, target, run["id"], home_id, min_rounds), shards
    else:
        home_id = int(home["id"])
        home_parts = parts_of(str(target.path), home)
        _check_conflicts(label, run, parts, home_parts)
        known = {part["identity"] for part in home_parts}
        new_parts = [part for part in parts if part["identity"] not in known]
        added = _copy_cells(source, target, run["id"], home_id, min_rounds)
        if not new_parts and not added:
            summary.duplicates.append(f"{label} run {run['id']}")
            return
        every = [*home_parts, *new_parts]
        shards_now = held_shards(every)
        finished = [part["finished"] for part in every]
        target.conn.execute(
            "UPDATE runs SET created = MIN(created, ?), finished = ?, sources_json = ?, shard = ? WHERE id = ?",
            (
                run["created"],
                None if None in finished else max(finished),
                json.dumps(every),
                shard_column(shards_now),
                home_id,
            ),
        )
    found = [m for m in summary.runs if m.run_id == home_id]
    merged = found[0] if found else MergedRun(home_id, run["plan_hash"], None)
    if not found:
        summary.runs.append(merged)
    merged.shard = shard_column(shards_now)
    merged.parts.append(f"{label} run {run['id']}" + (f" (shard {run['shard']})" if run["shard"] else ""))
    merged.cells += added


def merge_stores(sources: Sequence[Path], into: Path) -> MergeSummary:
    """Merge the fwbench databases ``sources`` into ``into`` (created if absent) in one transaction; StoreError (one
    line, the target untouched) for a source that is missing, foreign, corrupt or the target itself, or for a shard
    conflict; DiskFull (one line, the target untouched) when the target or a source's copy finds no room. Every
    source is checked before the target is opened."""
    check_database_path(into, create=True)
    for path in sources:
        if path.exists() and into.exists() and path.resolve() == into.resolve():
            raise StoreError(f"{path} is the --into database itself; name the others")
    created = not into.exists()
    summary = MergeSummary()
    try:
        with tempfile.TemporaryDirectory(prefix="fwbench-merge-") as scratch, ExitStack() as stack:
            snapshots = [(path, stack.enter_context(snapshot(path, Path(scratch)))) for path in sources]
            try:
                with Store.open(into, defer_migration=True) as target, target.transaction():
                    apply_pending_migrations(target.conn)  # in the merge's transaction: undone with it
                    for path, source in snapshots:
                        for run in _rows(source, "SELECT * FROM runs ORDER BY id"):
                            merge_run(source, str(path), run, target, summary)
            except BaseException:
                if created:  # nothing of a target this merge created survives its failure
                    for suffix in ("", "-wal", "-shm"):
                        Path(f"{into}{suffix}").unlink(missing_ok=True)
                raise
    except DiskFull as full:  # writing the target, or a source's copy in the temporary folder
        kept = f"{into} is as it was (nothing of the merge reached it), the sources untouched"
        raise full.told(kept, "merge again") from full
    return summary
