"""``fwbench merge``: several results databases into one, ids remapped, shards of one plan reunited.

Every source is first copied with SQLite's backup API into a temporary folder (a consistent snapshot, WAL
included; the source is never written), checked (``PRAGMA integrity_check``) and migrated there to this fwbench's
schema. The target (an existing fwbench database or a new one) is built in a temporary file next to it and moved
into place only when every source merged: on any error the target is untouched.

Runs are matched by identity: a run (its ``uid``, or for runs stored before uids, the hash of its creation time,
command and plan) already in the target, as a run or as the source of a merged one, is skipped as a duplicate.
Runs that hold a shard (``run --shard I/N``) of the same plan (same plan hash, same N) are reunited into one run,
whose ``shard`` lists the shards it holds so far (NULL once all N are in); the same shard from two different runs is
a conflict (one line, nothing written).
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

from fwbench.spec import ShardSpec
from fwbench.store.db import Store, StoreError, check_database_path


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
    """What a merge did: the target runs it wrote and the source runs it skipped as duplicates."""

    runs: list[MergedRun] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)


def run_identity(row: sqlite3.Row | dict[str, Any]) -> str:
    """A run's identity across stores: its uid, or (stored before uids) a hash of when and how it was made."""
    if row["uid"]:
        return str(row["uid"])
    text = f"{row['created']}|{row['command']}|{row['plan_json']}"
    return "legacy-" + hashlib.sha256(text.encode()).hexdigest()[:32]


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
        raise StoreError(f"{path}: {exc}") from None
    try:
        if not store.integrity_ok():
            raise StoreError(f"{path}: the database fails SQLite's integrity check")
        yield store
    finally:
        store.close()


def _rows(store: Store, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    return [dict(row) for row in store.conn.execute(sql, tuple(params)).fetchall()]


def _insert(store: Store, table: str, values: dict[str, Any]) -> int:
    cursor = store.conn.execute(
        f"INSERT INTO {table} ({', '.join(values)}) VALUES ({', '.join('?' for _ in values)})", tuple(values.values())
    )
    return int(cursor.lastrowid or 0)


def _known_identities(target: Store) -> set[str]:
    """Identities of every run in the target and of every run a merged one came from."""
    known: set[str] = set()
    for row in _rows(target, "SELECT * FROM runs"):
        known.add(run_identity(row))
        for part in json.loads(row["sources_json"] or "[]"):
            known.add(str(part["identity"]))
    return known


def _copy_cells(source: Store, target: Store, source_run: int, target_run: int) -> int:
    """Copy run ``source_run``'s results (with their blocks) and profiles (with their op rows) into ``target_run``;
    the number of cells. A cell the target run already has is a StoreError (the same cell stored twice)."""
    count = 0
    for table, child, child_key in (("results", "blocks", "result_id"), ("profiles", "profile_ops", "profile_id")):
        for row in _rows(source, f"SELECT * FROM {table} WHERE run_id = ? ORDER BY id", [source_run]):
            old_id = row.pop("id")
            row["run_id"] = target_run
            try:
                new_id = _insert(target, table, row)
            except sqlite3.IntegrityError:
                raise StoreError(f"cell {row['case_key']} would be stored twice in run {target_run}") from None
            for sub in _rows(source, f"SELECT * FROM {child} WHERE {child_key} = ?", [old_id]):
                sub[child_key] = new_id
                _insert(target, child, sub)
            count += 1
    return count


def _source_part(label: str, run: dict[str, Any]) -> dict[str, Any]:
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


def _shard_home(target: Store, run: dict[str, Any], spec: ShardSpec) -> dict[str, Any] | None:
    """The target run that gathers the shards of ``run``'s plan (same plan hash, kind and shard count), if any."""
    for row in _rows(
        target,
        "SELECT * FROM runs WHERE plan_hash = ? AND kind = ? AND sources_json IS NOT NULL ORDER BY id",
        [run["plan_hash"], run["kind"]],
    ):
        held = _held(row)
        if held is not None and held.count == spec.count:
            return row
    return None


def _held(row: dict[str, Any]) -> ShardSpec | None:
    """The shards a gathering run holds: its ``shard`` column, or all of them (its sources' count) when NULL."""
    if row["shard"]:
        return ShardSpec.parse(row["shard"])
    counts = {ShardSpec.parse(p["shard"]).count for p in json.loads(row["sources_json"] or "[]") if p.get("shard")}
    return ShardSpec(frozenset(range(1, max(counts) + 1)), max(counts)) if len(counts) == 1 else None


def merge_run(source: Store, label: str, run: dict[str, Any], target: Store, summary: MergeSummary) -> None:
    """Merge one source run into ``target`` (inside the caller's transaction)."""
    part = _source_part(label, run)
    if not run["shard"]:
        columns = {key: value for key, value in run.items() if key != "id"}
        columns["sources_json"] = json.dumps([*json.loads(run["sources_json"] or "[]"), part])
        columns["uid"] = columns["uid"] or part["identity"]
        new_id = target.insert_run(columns)
        merged = MergedRun(new_id, run["plan_hash"], None, parts=[f"{label} run {run['id']}"])
        merged.cells = _copy_cells(source, target, run["id"], new_id)
        summary.runs.append(merged)
        return
    spec = ShardSpec.parse(run["shard"])
    home = _shard_home(target, run, spec)
    if home is None:
        columns = {key: value for key, value in run.items() if key != "id"}
        columns.update(uid=uuid.uuid4().hex, sources_json=json.dumps([part]))
        home_id = target.insert_run(columns)
        held = spec
    else:
        held = _held(home) or spec
        clash = held.indices & spec.indices
        if clash:
            owners = [
                p
                for p in json.loads(home["sources_json"])
                if p.get("shard") and clash & ShardSpec.parse(p["shard"]).indices
            ]
            where = ", ".join(f"{p['file']} run {p['run_id']}" for p in owners)
            raise StoreError(
                f"shard {run['shard']} of plan {str(run['plan_hash'])[:12]} is in {label} run {run['id']} and already "
                f"in {where} (two different runs of one shard); merge one of them"
            )
        held = ShardSpec(held.indices | spec.indices, spec.count)
        home_id = int(home["id"])
        sources = [*json.loads(home["sources_json"]), part]
        finished = [p["finished"] for p in sources]
        target.conn.execute(
            "UPDATE runs SET created = MIN(created, ?), finished = ?, sources_json = ?, shard = ? WHERE id = ?",
            (
                run["created"],
                None if None in finished else max(finished),
                json.dumps(sources),
                None if held.complete else str(held),
                home_id,
            ),
        )
    if home is None and held.complete:
        target.conn.execute("UPDATE runs SET shard = NULL WHERE id = ?", (home_id,))
    found = [m for m in summary.runs if m.run_id == home_id]
    merged = found[0] if found else MergedRun(home_id, run["plan_hash"], None)
    if not found:
        summary.runs.append(merged)
    merged.shard = None if held.complete else str(held)
    merged.parts.append(f"{label} run {run['id']} (shard {run['shard']})")
    merged.cells += _copy_cells(source, target, run["id"], home_id)


def merge_stores(sources: Sequence[Path], into: Path) -> MergeSummary:
    """Merge the fwbench databases ``sources`` into ``into`` (created if absent) in one transaction; StoreError (one
    line, the target untouched) for a source that is missing, foreign, corrupt or the target itself, or for a shard
    conflict. Every source is checked before the target is opened."""
    check_database_path(into, create=True)
    for path in sources:
        if path.exists() and into.exists() and path.resolve() == into.resolve():
            raise StoreError(f"{path} is the --into database itself; name the others")
    created = not into.exists()
    summary = MergeSummary()
    with tempfile.TemporaryDirectory(prefix="fwbench-merge-") as scratch, ExitStack() as stack:
        snapshots = [(path, stack.enter_context(snapshot(path, Path(scratch)))) for path in sources]
        try:
            with Store.open(into) as target, target.transaction():
                known = _known_identities(target)
                for path, source in snapshots:
                    for run in _rows(source, "SELECT * FROM runs ORDER BY id"):
                        identity = run_identity(run)
                        if identity in known:
                            summary.duplicates.append(f"{path} run {run['id']}")
                            continue
                        merge_run(source, str(path), run, target, summary)
                        known.add(identity)
        except BaseException:
            if created:  # nothing of a target this merge created survives its failure
                for suffix in ("", "-wal", "-shm"):
                    Path(f"{into}{suffix}").unlink(missing_ok=True)
            raise
    return summary
