"""The SQLite store: schema, migrations, uniqueness, concurrent writers, refusal of foreign files."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from fwbench.details import LoadPoint
from fwbench.spec import Case, Plan, Settings
from fwbench.store import SCHEMA_VERSION, ResultRecord, Store, StoreError
from fwbench.store.records import CompileHealth, OutputError, StepLossParts
from fwbench.store.schema import MIGRATIONS, migrate

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
        assert row.samples == (1e-3, 2e-3) and row.n_samples == 2 and row.details == {"k": "v"}
        assert row.seq_len is None and row.status == "ok" and row.case_key == PLAN.cases[0].key
        assert store.result(run_id, PLAN.cases[0].key) == row and store.result(run_id, "absent") is None
        record = store.get_run(run_id)
        assert record is not None and record.plan == PLAN and record.environment == {"cpu_model": "x"}


def test_a_cell_is_never_stored_twice(db_path: Path) -> None:
    with Store.open(db_path) as store:
        run_id = store.create_run(PLAN, "fwbench run", {}, "0")
        assert add(store, run_id, PLAN.cases[0])
        assert not add(store, run_id, PLAN.cases[0], status="error")
        assert [r.status for r in store.results()] == ["ok"]
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


def _open_and_add_at_once(paths: list[str], worker: int, barrier: Any) -> None:
    """For each of ``paths`` in turn: wait until every other process is ready too, then create it and add a cell.
    A failure is kept until the last path (the others still find this process at every barrier), then exits 1."""
    failed = []
    for path in paths:
        barrier.wait(timeout=120)
        try:
            _open_and_add(path, worker)
        except Exception as exc:  # reported by the exit status, once every trial has run
            failed.append(f"{path}: {type(exc).__name__}: {exc}")
    if failed:
        raise SystemExit("; ".join(failed))


def test_processes_creating_a_new_database_at_once_all_succeed(tmp_path: Path) -> None:
    """Six processes create each of three new databases at the same moment (a barrier before each; started once,
    not once per database: a spawned process takes longer to start than a creation takes)."""
    ctx = multiprocessing.get_context("spawn")
    paths = [str(tmp_path / f"new-{trial}.db") for trial in range(3)]
    barrier = ctx.Barrier(6)
    procs = [ctx.Process(target=_open_and_add_at_once, args=(paths, w, barrier)) for w in range(6)]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(360)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    assert [p.exitcode for p in procs] == [0] * 6
    for path in paths:
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
        assert {r.run_id for r in rows} == {1, 2}


# -- typed result records ---------------------------------------------------------------------------
TRAINING_DETAILS = {
    "parity": {
        "ok": True,
        "reference": "numpy-float64",
        "tolerance_rel_l2": 1e-4,
        "checked": "loss of the first step",
        "outputs": {"loss": {"rel_l2": 3e-6, "max_abs": 1e-6}},
        "reference_loss": 2.5,
        "shape": [2, None],
    },
    "training": {
        "optimizer": {"name": "adamw"},
        "first_loss": 2.5,
        "final_loss": 1.5,
        "step_losses": [2.5, 2.0, 1.75],
        "step_loss_parts": {"first_call": 1, "warmup": 1, "calibration": 0, "timed": 1},
        "counted_steps_before_final": 3,
        "samples_per_step": 2,
        "tokens_per_step": None,
    },
    "compile_health": {
        "flags": ["recompiles +1 in timed loop"],
        "recompiled_in_timed_loop": True,
        "during_timing": {"recompiles": 1},
        "after_warmup": {"recompiles": 2},
        "after_timing": {"recompiles": 3},
    },
    "versions": {"torch": "2.9.0"},
    "stage_seconds": {"build": 0.5},
}
FIT_DETAILS = {
    "fit": {
        "loop": "keras fit",
        "epochs": 3,
        "samples": 64,
        "batch_size": 8,
        "steps_per_epoch": 8,
        "epoch_s": [1.0, 0.5, 0.5],
        "epoch_loss": [2.0, 1.5, 1.0],
        "total_s": 2.0,
        "final_loss": 0.9,
        "final_accuracy": 0.75,
        "optimizer": {"name": "adamw"},
    }
}


def _stored(db_path: Path, details: dict[str, Any], case: Case = PLAN.cases[0]) -> ResultRecord:
    with Store.open(db_path) as store:
        run_id = store.create_run(PLAN, "fwbench run", {}, "0")
        store.add_result(run_id, case, {"status": "ok", "median_s": 1e-3, "calls_per_sample": 4}, [1e-3], details)
        record = store.result(run_id, case.key)
    assert record is not None
    return record


def test_details_are_parsed_into_typed_sub_records(db_path: Path) -> None:
    row = _stored(db_path, TRAINING_DETAILS)
    assert row.parity is not None and row.parity.ok is True and row.parity.passed
    assert row.parity.outputs == {"loss": OutputError(rel_l2=3e-6, max_abs=1e-6)} and row.parity.worst_rel_l2 == 3e-6
    assert row.parity.shape == (2, None) and row.parity.reference_loss == 2.5 and row.parity.tolerance_rel_l2 == 1e-4
    assert row.training is not None and row.training.step_losses == (2.5, 2.0, 1.75)
    assert row.training.step_loss_parts == StepLossParts(first_call=1, warmup=1, calibration=0, timed=1)
    assert row.training.step_loss_parts.before_timed == 2 and row.training.first_loss == 2.5
    assert row.training.optimizer == {"name": "adamw"} and row.training.tokens_per_step is None
    assert row.compile_health.flags == ("recompiles +1 in timed loop",) and row.compile_health.recompiled_in_timed_loop
    assert row.compile_health.during_timing == {"recompiles": 1} and row.compile_health.after_timing == {
        "recompiles": 3
    }
    assert row.versions == {"torch": "2.9.0"} and row.fit is None
    assert row.details["stage_seconds"] == {"build": 0.5}  # untyped keys stay on the raw details


def test_fit_details_are_parsed(db_path: Path) -> None:
    row = _stored(db_path, FIT_DETAILS, Case("mlp", "keras:torch", phase="fit", batch_size=8))
    assert row.fit is not None and row.fit.loop == "keras fit" and row.fit.steps_per_epoch == 8
    assert row.fit.epoch_s == (1.0, 0.5, 0.5) and (row.fit.final_loss, row.fit.final_accuracy) == (0.9, 0.75)
    assert (row.fit.epochs, row.fit.samples, row.fit.total_s) == (3, 64, 2.0) and row.training is None


def test_old_details_without_the_typed_keys_read_with_defaults(db_path: Path) -> None:
    """Rows of older fwbench versions (no parity, compile health, versions or training keys) stay readable."""
    row = _stored(db_path, {"stage_seconds": {"build": 0.1}, "first_call_s": 0.2})
    assert row.parity is None and row.training is None and row.fit is None and row.versions is None
    assert row.compile_health == CompileHealth() and row.compile_health.flags == ()
    assert not row.compile_health.recompiled_in_timed_loop and row.details == {
        "stage_seconds": {"build": 0.1},
        "first_call_s": 0.2,
    }


def test_partial_old_sub_records_read_with_defaults() -> None:
    """A parity check without a verdict or errors, training without the per-step losses (stored before they
    were), fit details without the fields the overhead table needs: each reads with its defaults."""
    base = {
        "id": 1,
        "run_id": 1,
        "case_key": "k",
        "created": "2025-01-01T00:00:00+00:00",
        "model": "mlp",
        "runtime": "torch:eager",
        "phase": "training",
        "batch_size": 2,
        "seq_len": None,
        "dtype": "fp32",
        "device": "cpu",
        "status": "ok",
        "samples_json": "[0.001]",
    }
    row = ResultRecord.from_row(
        {
            **base,
            "details_json": '{"parity": {"outputs": {"out": {}, "bad": 3}}, '
            '"training": {"first_loss": 2.0}, "fit": {"epochs": 2}}',
        }
    )
    assert row.parity is not None and row.parity.ok is None and not row.parity.passed
    assert row.parity.outputs == {"out": OutputError()} and row.parity.worst_rel_l2 == 0.0 and row.parity.shape == ()
    assert row.training is not None and row.training.first_loss == 2.0 and row.training.step_losses is None
    assert row.training.step_loss_parts is None and row.fit is None
    assert row.samples == (0.001,) and row.median_s is None and row.reason is None and row.n_samples == 0


def test_record_to_dict_is_the_stored_row(db_path: Path) -> None:
    row = _stored(db_path, TRAINING_DETAILS)
    data = row.to_dict()
    assert data["samples"] == [1e-3] and data["details"] == TRAINING_DETAILS and data["calls_per_sample"] == 4
    assert data["case_key"] == PLAN.cases[0].key and data["status"] == "ok" and data["seq_len"] is None
    assert ResultRecord.from_row(data) == row  # a dict row reads back as the same record


def test_resume_reads_settled_parity_from_typed_records(db_path: Path) -> None:
    """``fwbench run --resume``: a pair whose stored cell passed parity is settled by that cell, a mismatch
    settles its pair as failed, a cell without a check (an older row, or an error) settles nothing."""
    from fwbench.runner.manager import stored_parity

    checked, unchecked, failed = (
        Case("mlp", "torch:eager", batch_size=1),
        Case("mlp", "jax:jit", batch_size=1),
        Case("mlp", "keras:jax", batch_size=1),
    )
    with Store.open(db_path) as store:
        run_id = store.create_run(Plan((checked, unchecked, failed), Settings()), "fwbench run", {}, "0")
        store.add_result(run_id, checked, {"status": "ok"}, [1e-3], {"parity": {"ok": True, "outputs": {}}})
        store.add_result(run_id, unchecked, {"status": "ok"}, [1e-3], {"stage_seconds": {}})
        store.add_result(
            run_id, failed, {"status": "mismatch", "reason": "outputs differ"}, [], {"parity": {"ok": False}}
        )
        assert stored_parity(store, run_id) == {
            ("mlp", "torch:eager", "fp32", "cpu", None): checked.key,
            ("mlp", "keras:jax", "fp32", "cpu", None): "mismatch",
        }


def test_migration_2_keeps_runs_of_schema_1_readable(db_path: Path) -> None:
    """A database written before rounds (schema 1) gains the group, schedule, rounds, noise and machine columns and
    the blocks table; its rows read as one round of unpaired samples, with no CI claimed by the reports."""
    from fwbench.speedups import compare_cells

    db_path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(db_path, isolation_level=None)
    assert migrate(conn, MIGRATIONS[:1]) == 1
    conn.execute(
        "INSERT INTO runs (created, command, settings_json, plan_json, environment_json, fwbench_version) "
        "VALUES ('2026-01-01', 'fwbench run', '{}', ?, '{}', '0')",
        (PLAN.to_json(),),
    )
    for case, median in (
        (Case("mlp", "torch:eager", batch_size=1), 2e-3),
        (Case("mlp", "jax:jit", batch_size=1), 1e-3),
    ):
        conn.execute(
            "INSERT INTO results (run_id, case_key, created, model, runtime, phase, batch_size, dtype, device, status, "
            "samples_json, n_samples, median_s, ci_low_s, ci_high_s) VALUES (1, ?, '', 'mlp', ?, 'inference', 1, "
            "'fp32', 'cpu', 'ok', ?, 3, ?, ?, ?)",
            (
                case.key,
                case.runtime,
                f"[{median}, {median * 1.01}, {median * 0.99}]",
                median,
                median * 0.99,
                median * 1.01,
            ),
        )
    conn.close()
    with Store.open(db_path) as store:
        assert store.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 7
        base, other = store.results([1])
    assert base.blocks == () and base.rounds is None and base.schedule is None and base.group_key is None
    assert base.noise is None and base.machine is None and base.contended == []
    assert base.round_samples == [[2e-3, 2e-3 * 1.01, 2e-3 * 0.99]] and base.round_count == 1
    assert base.ci_low_s == pytest.approx(2e-3 * 0.99)  # the stored columns as they were
    (cell,) = compare_cells([base, other], "torch:eager", "jax:jit")
    assert cell.ratio == pytest.approx(2.0) and cell.ci_low is None and not cell.significant


def test_blocks_and_noise_round_trip(db_path: Path) -> None:
    from fwbench.measure.noise import NoiseTotals
    from fwbench.measure.rounds import Block

    blocks = [Block(0, 0, 0, 1.5e9, 4, 0.04), Block(0, 1, 2, 1.5e9 + 1, 4, 0.041), Block(1, 0, None, None, 2, 0.02)]
    noise = NoiseTotals(wall_s=1.0, other_cpu_s=0.2, steal_s=0.0, machine_s=2.0, involuntary_switches=3)
    with Store.open(db_path) as store:
        run_id = store.create_run(PLAN, "fwbench run", {}, "0")
        fields = {
            "status": "ok",
            "group_key": "g",
            "schedule": "interleaved",
            "rounds": 2,
            "noise": noise.to_dict(),
            "machine": {"hostname": "h"},
        }
        with store.transaction():
            store.add_result(run_id, PLAN.cases[0], fields, [0.01, 0.01025, 0.01], {}, blocks)
        (row,) = store.results([run_id])
    assert list(row.blocks) == blocks and row.noise == noise and row.machine == {"hostname": "h"}
    assert (row.group_key, row.schedule, row.rounds) == ("g", "interleaved", 2)
    assert row.round_samples == [[0.01, 0.01025], [0.01]]
    assert row.contended == ["other processes used 20% of a core while timed (limit 10%)"]
    assert ResultRecord.from_row(row.to_dict() | {"blocks": row.blocks}) == row


def test_migration_3_keeps_runs_of_schema_2_benchmark_runs(db_path: Path) -> None:
    """A database of schema 2 gains runs.kind (its runs read as benchmark runs: 'latest' still finds them) and the
    profile tables; a profile run added afterwards is never 'latest' for the benchmark reports."""
    db_path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(db_path, isolation_level=None)
    assert migrate(conn, MIGRATIONS[:2]) == 2
    conn.execute(
        "INSERT INTO runs (created, command, settings_json, plan_json, environment_json, fwbench_version) "
        "VALUES ('2026-01-01', 'fwbench run', '{}', ?, '{}', '0')",
        (PLAN.to_json(),),
    )
    conn.close()
    with Store.open(db_path) as store:
        assert store.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        (run,) = store.runs()
        assert run.kind == "benchmark" and store.latest_run_id() == 1 and store.latest_run_id("profile") is None
        profile_run = store.create_run(PLAN, "fwbench profile", {}, "0", kind="profile")
        assert store.latest_run_id() == 1 and store.latest_run_id("profile") == profile_run
        assert store.profiles() == [] and store.results([profile_run]) == []
        with pytest.raises(sqlite3.IntegrityError):  # the kind is a closed set
            store.create_run(PLAN, "fwbench x", {}, "0", kind="other")


def old_schema_store(db_path: Path, version: int) -> None:
    """A database at schema ``version`` holding one run and one result row (PLAN's first cell, 10 ms)."""
    db_path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(db_path, isolation_level=None)
    assert migrate(conn, MIGRATIONS[:version]) == version
    conn.execute(
        "INSERT INTO runs (created, command, settings_json, plan_json, environment_json, fwbench_version) "
        "VALUES ('2026-01-01', 'fwbench run', '{}', ?, '{}', '0')",
        (PLAN.to_json(),),
    )
    conn.execute(
        "INSERT INTO results (run_id, case_key, created, model, runtime, phase, batch_size, dtype, device, status, "
        "samples_json, n_samples, median_s) VALUES (1, ?, '', 'mlp', 'torch:eager', 'inference', 1, 'fp32', 'cpu', "
        "'ok', '[0.01]', 1, 0.01)",
        (PLAN.cases[0].key,),
    )
    conn.close()


def test_migration_4_adds_the_worker_count_of_data_cells(db_path: Path) -> None:
    """A database of schema 3 gains results.workers: its rows read as None (not a data cell), and a data cell's
    worker count is stored and read back with its key."""
    old_schema_store(db_path, 3)
    data_case = Case("images-256", "torch:dataloader", "data", 32, workers=2)
    with Store.open(db_path) as store:
        assert store.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 7
        (old,) = store.results([1])  # stored before the migration: kept, no worker count
        run_id = store.create_run(PLAN, "fwbench run", {}, "0")
        with store.transaction():
            store.add_result(run_id, PLAN.cases[0], {"status": "ok"}, [0.01], {})
            store.add_result(run_id, data_case, {"status": "ok"}, [0.2], {})
        plain, data = store.results([run_id])
    assert old.workers is None and old.case_key == PLAN.cases[0].key and old.median_s == 0.01
    assert plain.workers is None and plain.case_key == PLAN.cases[0].key
    assert data.workers == 2 and data.case_key == data_case.key and data.phase == "data"


def test_migration_6_adds_the_processes_of_distributed_cells(db_path: Path) -> None:
    """A database of schema 5 gains results.procs and results.scaling: its rows read as None (one process), and a
    distributed cell's processes, scaling and global batch are stored and read back with its key."""
    old_schema_store(db_path, 5)
    weak = Case("mlp", "torch:ddp", "training", 4, procs=2, scaling="weak")
    strong = Case("mlp", "torch:ddp", "training", 4, procs=2, scaling="strong")
    with Store.open(db_path) as store:
        (old,) = store.results([1])
        run_id = store.create_run(Plan((weak, strong), Settings(threads=2)), "fwbench run", {}, "0")
        with store.transaction():
            store.add_result(run_id, weak, {"status": "ok"}, [0.01], {})
            store.add_result(run_id, strong, {"status": "ok"}, [0.01], {})
        stored = {row.scaling: row for row in store.results([run_id])}
        assert store.mark_mismatch(run_id, "mlp", "torch:ddp", "training", "differs", procs=1) == 0
    assert old.procs is None and old.scaling is None and old.global_batch == 1
    assert stored["weak"].procs == 2 and stored["weak"].global_batch == 8 and stored["weak"].case_key == weak.key
    assert stored["strong"].global_batch == 4 and stored["strong"].case_key == strong.key


def test_migration_7_stores_a_serving_cells_load_points_and_replaces_them_in_place(db_path: Path) -> None:
    """A database of schema 6 gains load_points; a serving cell's points of every round are written with it, an
    extra round's store replaces them, and other cells write none."""
    old_schema_store(db_path, 6)
    case = Case("mlp", "floor:identity", "serving", 4)
    point = LoadPoint("Server", "server@0.50", fraction=0.5, offered_qps=100.0, answered=99, dropped=1, p99_s=0.004,
                  batch_rows={"1": 40, "4": 15})  # fmt: skip
    rounds = [{"capacity_qps": 200.0, "peak_qps": None, "points": [point.to_dict()] * 2}]
    details = {"serving": {"max_batch": 4, "rounds": rounds}}
    with Store.open(db_path) as store:
        assert store.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 7
        with store.transaction():
            assert store.add_result(1, case, {"status": "ok"}, [0.001], details)
            assert add(store, 1, PLAN.cases[1])
        query = "SELECT round, point, label, p99_s, dropped, batch_rows_json FROM load_points"
        rows = [tuple(row) for row in store.conn.execute(query)]
        assert rows == [
            (0, 0, "server@0.50", 0.004, 1, '{"1": 40, "4": 15}'),
            (0, 1, "server@0.50", 0.004, 1, '{"1": 40, "4": 15}'),
        ]
        with store.transaction():
            assert store.add_result(
                1, case, {"status": "ok"}, [0.001], {"serving": {"rounds": rounds * 2}}, replace=True
            )
        assert tuple(store.conn.execute("SELECT COUNT(*), MAX(round) FROM load_points").fetchone()) == (4, 1)
        (record,) = [r for r in store.results() if r.phase == "serving"]
        assert record.serving is not None and len(record.serving.rounds) == 2
        assert record.serving.rounds[0].points[0].batch_rows == {"1": 40, "4": 15}
