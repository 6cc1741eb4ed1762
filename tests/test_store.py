"""The SQLite store: schema, migrations, uniqueness, concurrent writers, refusal of foreign files."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path

import pytest

from fwbench.spec import Case, Plan, Settings
from fwbench.store import SCHEMA_VERSION, Store, StoreError
from fwbench.store.db import MIGRATIONS, migrate

PLAN = Plan((Case("mlp", "torch:eager", batch_size=1), Case("mlp", "torch:eager", batch_size=2)), Settings())


def add(store: Store, run_id: int, case: Case, status: str = "ok") -> bool:
    return store.add_result(run_id, case, {"status": status, "median_s": 1e-3}, [1e-3, 2e-3], {"k": "v"})


def test_schema_is_created_with_wal_and_version(db_path: Path) -> None:
    with Store.open(db_path) as store:
        assert store.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        tables = {r[0] for r in store.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"runs", "results"} <= tables
        assert store.integrity_ok()


def test_results_round_trip_with_raw_samples(db_path: Path) -> None:
    with Store.open(db_path) as store:
        run_id = store.create_run(PLAN, "fwbench run", {"cpu_model": "x"}, "0")
        assert add(store, run_id, PLAN.cases[0])
        (row,) = store.results([run_id])
        assert row["samples"] == [1e-3, 2e-3] and row["n_samples"] == 2 and row["details"] == {"k": "v"}
        assert row["seq_len"] is None and row["status"] == "ok"
        record = store.get_run(run_id)
        assert record is not None and record.plan == PLAN and record.environment == {"cpu_model": "x"}


def test_a_cell_is_never_stored_twice(db_path: Path) -> None:
    with Store.open(db_path) as store:
        run_id = store.create_run(PLAN, "fwbench run", {}, "0")
        assert add(store, run_id, PLAN.cases[0])
        assert not add(store, run_id, PLAN.cases[0], status="error")
        assert [r["status"] for r in store.results()] == ["ok"]
        assert store.done_keys(run_id) == {PLAN.cases[0].key}


def test_status_must_be_a_known_one(db_path: Path) -> None:
    with Store.open(db_path) as store:
        run_id = store.create_run(PLAN, "fwbench run", {}, "0")
        with pytest.raises(sqlite3.IntegrityError):
            add(store, run_id, PLAN.cases[0], status="fine")


def test_forward_migration_keeps_data(db_path: Path) -> None:
    with Store.open(db_path) as store:
        run_id = store.create_run(PLAN, "fwbench run", {}, "0")
        add(store, run_id, PLAN.cases[0])
    conn = sqlite3.connect(db_path, isolation_level=None)
    extra = (*MIGRATIONS, ("ALTER TABLE results ADD COLUMN note TEXT DEFAULT 'migrated'",))
    assert migrate(conn, extra) == SCHEMA_VERSION + 1
    assert conn.execute("SELECT status, note FROM results").fetchall() == [("ok", "migrated")]
    assert migrate(conn, extra) == SCHEMA_VERSION + 1  # idempotent
    conn.close()


def test_a_newer_schema_is_refused(db_path: Path) -> None:
    Store.open(db_path).close()
    conn = sqlite3.connect(db_path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    conn.close()
    with pytest.raises(StoreError, match="newer than this fwbench supports"):
        Store.open(db_path)


def _foreign_database(path: Path, user_version: int, wal: bool = False) -> bytes:
    conn = sqlite3.connect(path)
    if wal:
        conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE runs (name TEXT)")
    conn.execute("INSERT INTO runs VALUES ('someone else''s data')")
    conn.execute(f"PRAGMA user_version = {user_version}")
    conn.commit()
    conn.close()
    return path.read_bytes()


@pytest.mark.parametrize("user_version", [0, 1, 7])
def test_another_programs_sqlite_database_is_left_untouched(tmp_path: Path, user_version: int) -> None:
    path = tmp_path / "other.db"
    content = _foreign_database(path, user_version)
    for kwargs in ({}, {"readonly": True}):
        with pytest.raises(StoreError, match="fwbench did not create"):
            Store.open(path, **kwargs)
    assert path.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]


def _open_and_add(path: str, worker: int) -> None:
    with Store.open(path) as store:
        run_id = store.create_run(PLAN, f"opener {worker}", {}, "0")
        assert add(store, run_id, PLAN.cases[0])


def test_processes_creating_a_new_database_at_once_all_succeed(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    for trial in range(3):
        path = tmp_path / f"new-{trial}.db"
        procs = [ctx.Process(target=_open_and_add, args=(str(path), w)) for w in range(6)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        assert [p.exitcode for p in procs] == [0] * 6
        with Store.open(path) as store:
            assert len(store.results()) == 6 and store.integrity_ok()


def test_a_file_that_is_not_sqlite_is_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    content = b"these are my notes, not a database\n" * 10
    path.write_bytes(content)
    with pytest.raises(StoreError, match="not an SQLite database"):
        Store.open(path)
    assert path.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.db"]


def test_directory_and_unwritable_paths_are_refused(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="is a directory"):
        Store.open(tmp_path)
    with pytest.raises(StoreError, match="not a writable folder"):
        Store.open("/sys/fwbench-test.db")
    with pytest.raises(StoreError, match="does not exist"):
        Store.open(tmp_path / "missing.db", create=False)


def _writer(path: str, worker: int, count: int) -> None:
    with Store.open(path) as store:
        run_id = store.create_run(PLAN, f"writer {worker}", {}, "0")
        for i in range(count):
            assert add(store, run_id, Case("mlp", "torch:eager", batch_size=i + 1))


def test_two_concurrent_writers_lose_nothing(db_path: Path) -> None:
    Store.open(db_path).close()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(db_path), w, 150)) for w in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    with Store.open(db_path) as store:
        assert store.integrity_ok()
        rows = store.results()
        assert len(rows) == 300
        assert {r["run_id"] for r in rows} == {1, 2}
