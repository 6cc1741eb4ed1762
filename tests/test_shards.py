"""Sweeps over several machines without Ray: `run --shard I/N`, `fwbench merge`, machine identity in every result,
and reports that never compute a speed-up across two machines (`report --by machine`, `compare`'s warning)."""

from __future__ import annotations

import json
import os
import platform
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fwbench.cli import main
from fwbench.measure.environment import hardware_record, machine_ids, machine_record, physical_core_count, record_id
from fwbench.report.compare import compare_runs
from fwbench.report.export import spreadsheet_tables
from fwbench.spec import Case, Plan, Settings, ShardSpec, SkippedCase, SpecError, group_key
from fwbench.speedups import grouped_pairs
from fwbench.store import Store, StoreError
from fwbench.store.merge import merge_stores
from report_store import Cell, add_run, timed

RUNTIMES = ("torch:eager", "jax:jit", "tensorflow:function")


def plan_of(models: list[str], batches: list[int], runtimes: list[str], skip_every: int = 0) -> Plan:
    cases = [Case(m, r, batch_size=b) for m in models for b in batches for r in runtimes]
    skipped = tuple(SkippedCase(c, "test") for i, c in enumerate(cases) if skip_every and i % skip_every == 0)
    held = {s.case.key for s in skipped}
    return Plan(tuple(c for c in cases if c.key not in held), Settings(threads=1), skipped)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)  # seeded: the same plans every run
@given(
    models=st.lists(st.sampled_from(["mlp", "bert-tiny", "gpt2-tiny", "resnet-tiny"]), min_size=1, unique=True),
    batches=st.lists(st.integers(1, 64), min_size=1, max_size=6, unique=True),
    runtimes=st.lists(st.sampled_from(RUNTIMES), min_size=1, unique=True),
    count=st.integers(1, 9),
    skip_every=st.integers(0, 4),
)
def test_shards_are_disjoint_cover_the_plan_and_never_split_a_group(
    models: list[str], batches: list[int], runtimes: list[str], count: int, skip_every: int
) -> None:
    plan = plan_of(models, batches, runtimes, skip_every)
    shards = [plan.shard(ShardSpec.one(i, count)) for i in range(1, count + 1)]
    keys = [[c.key for c in s.cases] + [k.case.key for k in s.skipped] for s in shards]
    flat = [key for part in keys for key in part]
    assert len(flat) == len(set(flat)) == plan.size  # disjoint, and together every cell
    assert set(flat) == {c.key for c in plan.cases} | {s.case.key for s in plan.skipped}
    groups = [{group_key(c) for c in s.cases} | {group_key(k.case) for k in s.skipped} for s in shards]
    for a in range(count):
        for b in range(a + 1, count):
            assert not groups[a] & groups[b]  # a group is never split
    sizes = [len(g) for g in groups]
    assert max(sizes) - min(sizes) <= 1  # dealt round-robin
    order = [c.key for c in plan.cases]
    for shard in shards:  # plan order kept, so the shard's cells run as the whole plan would run them
        positions = [order.index(c.key) for c in shard.cases]
        assert positions == sorted(positions)
    again = plan_of(models, batches, runtimes, skip_every).shard(ShardSpec.one(1, count))
    assert again == shards[0]  # deterministic
    assert plan.shard(ShardSpec(frozenset(range(1, count + 1)), count)) == plan


@pytest.mark.parametrize("text", ["3/2", "0/2", "1/0", "x", "1-2", "1/"])
def test_a_bad_shard_is_one_line_and_exit_2(text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SpecError):
        ShardSpec.parse(text)
    db = tmp_path / "r.db"
    code = main(["run", "--models", "mlp", "--runtimes", "torch:eager", "--shard", text, "--db", str(db)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--shard" in err and not db.exists()


def _fake_machine(cpu: str, host: str) -> dict[str, Any]:
    hardware = hardware_record({"cpu_model": cpu, "cpu_simd_flags": "avx2", "logical_cpus": 8, "physical_cores": 4})
    software = {"python": "3.11", "version_torch": "2.13.0"}
    return {
        "hostname": host,
        "hardware": hardware,
        "hardware_id": record_id(hardware),
        "software": software,
        "software_id": record_id(software),
    }


MACHINE_A = _fake_machine("CPU A", "host-a")
MACHINE_B = _fake_machine("CPU B", "host-b")


def shard_store(path: Path, plan: Plan, index: int, count: int, machine: dict[str, Any], uid: str | None = None) -> int:
    """A store holding one shard of ``plan`` as `run --shard` leaves it: the full plan, its shard, its cells."""
    spec = ShardSpec.one(index, count)
    with Store.open(path) as store:
        run_id = store.create_run(
            plan, f"fwbench run --shard {spec}", {"hostname": machine["hostname"]}, "0", shard=spec
        )
        part = plan.shard(spec)
        with store.transaction():
            for n, case in enumerate(part.cases):
                fields = {"status": "ok", "median_s": 1e-3 * (n + 1), "machine": machine}
                store.add_result(run_id, case, fields, [1e-3 * (n + 1)] * 3, {}, [])
            for skipped in part.skipped:
                store.add_result(run_id, skipped.case, {"status": "skipped", "reason": skipped.reason}, [], {}, [])
        store.finish_run(run_id)
        if uid is not None:
            store.conn.execute("UPDATE runs SET uid = ? WHERE id = ?", (uid, run_id))
    return run_id


def test_merge_reunites_the_shards_of_a_plan(tmp_path: Path) -> None:
    plan = plan_of(["mlp", "bert-tiny"], [1, 2, 4], list(RUNTIMES), skip_every=5)
    sources = [tmp_path / f"shard{i}.db" for i in (1, 2, 3)]
    for i, path in enumerate(sources, start=1):
        shard_store(path, plan, i, 3, MACHINE_A if i != 2 else MACHINE_B)
    target = tmp_path / "merged.db"
    summary = merge_stores(sources[:2], target)
    assert [run.shard for run in summary.runs] == ["1,2/3"]  # two of three so far
    summary = merge_stores(sources[2:], target)
    assert [run.shard for run in summary.runs] == [None]
    with Store.open(target, readonly=True) as store:
        (run,) = store.runs()
        rows = store.results([run.id])
    assert run.shard is None and run.plan_hash == plan.digest and run.planned == plan
    assert sorted(r.case_key for r in rows) == sorted([c.key for c in plan.cases] + [s.case.key for s in plan.skipped])
    assert [part["shard"] for part in run.sources or []] == ["1/3", "2/3", "3/3"]
    assert {r.hardware_id for r in rows if r.status == "ok"} == {MACHINE_A["hardware_id"], MACHINE_B["hardware_id"]}
    assert {r.hostname for r in rows if r.status == "ok"} == {"host-a", "host-b"}
    # merging a source again is a skipped duplicate, not a second copy
    before = target.read_bytes()
    summary = merge_stores([sources[0]], target)
    assert summary.runs == [] and len(summary.duplicates) == 1 and target.read_bytes() == before


def test_merge_refuses_one_shard_from_two_runs_and_leaves_the_target_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = plan_of(["mlp"], [1, 2, 4, 8], list(RUNTIMES))
    first, again, target = tmp_path / "a.db", tmp_path / "b.db", tmp_path / "m.db"
    shard_store(first, plan, 1, 2, MACHINE_A)
    shard_store(again, plan, 1, 2, MACHINE_A)  # shard 1/2 run a second time: a different run
    assert main(["merge", str(first), "--into", str(target)]) == 0
    before = target.read_bytes()
    capsys.readouterr()
    assert main(["merge", str(again), "--into", str(target)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "shard 1/2" in err and "two different runs" in err
    assert target.read_bytes() == before


def test_merge_refuses_foreign_corrupt_and_missing_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = plan_of(["mlp"], [1], ["torch:eager"])
    good = tmp_path / "good.db"
    shard_store(good, plan, 1, 1, MACHINE_A)
    foreign = tmp_path / "notes.db"
    foreign.write_text("not a database\n")
    other_sqlite = tmp_path / "other.db"
    with sqlite3.connect(other_sqlite) as conn:
        conn.execute("CREATE TABLE t (x)")
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(good.read_bytes()[:3000])
    target = tmp_path / "m.db"
    for bad in (foreign, other_sqlite, corrupt, tmp_path / "missing.db"):
        capsys.readouterr()
        assert main(["merge", str(good), str(bad), "--into", str(target)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and str(bad.name) in err
        assert not target.exists()  # the good source was not merged alone either
    assert main(["merge", str(good), "--into", str(foreign)]) == 2
    assert foreign.read_text() == "not a database\n"
    assert main(["merge", str(good), "--into", str(good)]) == 2


def test_a_result_stores_its_machine_apart_from_its_software(db_path: Path) -> None:
    machine = machine_record()
    assert machine["hardware_id"] == record_id(machine["hardware"]) and "version_torch" in machine["software"]
    assert not set(machine["hardware"]) & set(machine["software"])
    before_fingerprints = {  # the flat record fwbench stored with every result before schema 5, as it made it
        "hostname": "h",
        "machine": platform.machine(),
        "logical_cpus": os.cpu_count(),
        "physical_cores": physical_core_count(),  # of the process's affinity, then
        "memory_total_bytes": machine["memory_total_bytes"],
        "cpu_model": machine["hardware"]["cpu_model"],
        "cpu_simd_flags": machine["hardware"]["cpu_simd_flags"],
    }
    no_accelerators = record_id({**machine["hardware"], "accelerators": []})  # what the old record could not say
    assert machine_ids(before_fingerprints) == ("h", no_accelerators, None)
    plan = plan_of(["mlp"], [1], ["torch:eager"])
    with Store.open(db_path) as store:
        run_id = store.create_run(plan, "fwbench run", {}, "0")
        store.add_result(run_id, plan.cases[0], {"status": "ok", "machine": machine}, [1e-3], {}, [])
        (row,) = store.results([run_id])
        (run,) = store.runs()
    assert (row.hostname, row.hardware_id, row.software_id) == machine_ids(machine)
    assert run.uid and run.plan_hash == plan.digest and run.shard is None


def two_machine_run(store: Store) -> int:
    """One run whose baseline ran on machine A and whose other runtime ran on A for b=1 and on B for b=2."""
    cells = [
        Cell(Case("mlp", "torch:eager", batch_size=1), timed(2e-3, seed=1), fields={"machine": MACHINE_A}),
        Cell(Case("mlp", "jax:jit", batch_size=1), timed(1e-3, seed=2), fields={"machine": MACHINE_A}),
        Cell(Case("mlp", "torch:eager", batch_size=2), timed(2e-3, seed=3), fields={"machine": MACHINE_A}),
        Cell(Case("mlp", "jax:jit", batch_size=2), timed(1e-3, seed=4), fields={"machine": MACHINE_B}),
    ]
    return add_run(store, cells)


def test_reports_never_compute_a_speedup_across_two_machines(db_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with Store.open(db_path) as store:
        two_machine_run(store)
        results = store.results()
    pairs = grouped_pairs(results, "torch:eager")
    compared = [cell for pair in pairs for cell in pair.cells]
    assert [(c.batch_size, c.hardware_id) for c in compared] == [(1, MACHINE_A["hardware_id"])]
    assert main(["report", "--db", str(db_path)]) == 0
    out = capsys.readouterr().out
    assert (
        "machine" in out and MACHINE_B["hardware_id"][:8] in out and "speed-ups pair cells of this machine only" in out
    )
    assert main(["report", "--db", str(db_path), "--by", "machine"]) == 0
    out = capsys.readouterr().out
    assert f"{MACHINE_A['hardware_id'][:8]} median" in out and f"{MACHINE_B['hardware_id'][:8]} median" in out
    assert "vs torch:eager" not in out and "speed-up" not in out.split("no speed-up")[0]
    assert "CPU A" in out and "CPU B" in out
    assert main(["report", "--db", str(db_path), "--by", "machine", "--format", "json"]) == 2
    sheets = spreadsheet_tables(results)  # the 2019 layout: one sheet per machine, never two machines in one
    assert sorted(sheets) == sorted(
        f"mlp_{runtime}_machine{machine['hardware_id'][:8]}.csv"
        for runtime, machine in (("torch_eager", MACHINE_A), ("jax_jit", MACHINE_A), ("jax_jit", MACHINE_B))
    )


def test_compare_warns_when_the_runs_ran_on_different_machines(
    db_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def cells(machine: dict[str, Any], seed: int) -> list[Cell]:
        return [Cell(Case("mlp", "torch:eager", batch_size=1), timed(2e-3, seed=seed), fields={"machine": machine})]

    with Store.open(db_path) as store:
        a, b, c = (
            add_run(store, cells(MACHINE_A, 1)),
            add_run(store, cells(MACHINE_A, 2)),
            add_run(store, cells(MACHINE_B, 3)),
        )
        runs = {run.id: run for run in store.runs()}
        same = compare_runs(runs[a], store.results([a]), runs[b], store.results([b]))
        other = compare_runs(runs[a], store.results([a]), runs[c], store.results([c]))
    assert same.machine_warning is None
    assert other.machine_warning is not None and "CPU A" in other.machine_warning and "CPU B" in other.machine_warning
    capsys.readouterr()
    main(["compare", str(a), str(c), "--db", str(db_path), "--format", "json"])
    captured = capsys.readouterr()
    assert "different machines" in captured.err and json.loads(captured.out)["machine_warning"] == other.machine_warning
    # both runs on both machines, but the one cell on machine A in one run and on B in the other: still warned
    with Store.open(db_path) as store:
        d = add_run(
            store,
            cells(MACHINE_A, 4) + [Cell(Case("mlp", "jax:jit"), timed(1e-3, seed=5), fields={"machine": MACHINE_B})],
        )
        e = add_run(
            store,
            cells(MACHINE_B, 6) + [Cell(Case("mlp", "jax:jit"), timed(1e-3, seed=7), fields={"machine": MACHINE_A})],
        )
        runs = {run.id: run for run in store.runs()}
        crossed = compare_runs(runs[d], store.results([d]), runs[e], store.results([e]))
    assert crossed.machine_warning is not None and crossed.machine_warning.startswith("warning: 2 matched cells")


@pytest.mark.usefixtures("plugin_env")
def test_run_shards_then_merge_reproduce_the_plan(tmp_path: Path) -> None:
    """Real workers (of the numpy fake: sharding and merging are the manager's and the store's, whatever the
    framework): `--shard 1/2` and `--shard 2/2` into two databases, merged, hold exactly the plan's cells."""
    grid = ["--models", "mlp", "--runtimes", "fake:sleep", "--batch-sizes", "1,2,3", "--threads", "1"]
    timing = ["--max-time", "0.2", "--rounds", "1"]
    parts = [tmp_path / "s1.db", tmp_path / "s2.db"]
    for index, path in enumerate(parts, start=1):
        assert main(["run", *grid, *timing, "--shard", f"{index}/2", "--db", str(path)]) == 0
    target = tmp_path / "all.db"
    assert main(["merge", *map(str, parts), "--into", str(target)]) == 0
    with Store.open(target, readonly=True) as store:
        (run,) = store.runs()
        rows = store.results([run.id])
    assert run.shard is None and sorted(r.case_key for r in rows) == sorted(c.key for c in run.plan.cases)
    assert len(rows) == 3 and all(r.status == "ok" and r.hardware_id for r in rows)


def _run_ids(path: Path) -> list[tuple[int, str | None, int]]:
    """(run id, shard, cells) of every run in ``path``."""
    with Store.open(path, readonly=True) as store:
        return [(run.id, run.shard, len(store.results([run.id]))) for run in store.runs()]


def test_merge_adds_what_a_resumed_source_gained_and_reunites_into_a_shard_database(tmp_path: Path) -> None:
    plan = plan_of(["mlp"], [1, 2, 4, 8], list(RUNTIMES))
    first, second = tmp_path / "s1.db", tmp_path / "s2.db"
    shard_store(first, plan, 1, 2, MACHINE_A)
    shard_store(second, plan, 2, 2, MACHINE_A)
    with Store.open(first) as store:  # shard 1 is merged while one of its cells is not stored yet
        (row,) = store.conn.execute("SELECT * FROM results ORDER BY id DESC LIMIT 1").fetchall()
        held = dict(row)
        store.conn.execute("DELETE FROM results WHERE id = ?", (held["id"],))
    target = tmp_path / "all.db"
    merge_stores([first], target)
    cells = plan.shard(ShardSpec.one(1, 2)).size
    assert _run_ids(target) == [(1, "1/2", cells - 1)]
    with Store.open(first) as store:  # ... then resumed: the same run stores its last cell
        store.conn.execute(
            f"INSERT INTO results ({', '.join(held)}) VALUES ({', '.join('?' for _ in held)})", tuple(held.values())
        )
    summary = merge_stores([first], target)
    assert summary.runs[0].cells == 1 and summary.duplicates == [] and _run_ids(target) == [(1, "1/2", cells)]
    # a plain shard database as the target: the other shard joins its run
    summary = merge_stores([second], first)
    assert [(run.shard, run.cells) for run in summary.runs] == [(None, plan.size - cells)]
    assert _run_ids(first) == [(1, None, plan.size)]
    # a merged database merged again elsewhere keeps its parts: merging one of them afterwards is a duplicate
    elsewhere = tmp_path / "elsewhere.db"
    merge_stores([first], elsewhere)
    summary = merge_stores([second], elsewhere)
    assert summary.runs == [] and summary.duplicates == [f"{second} run 1"]
    assert _run_ids(elsewhere) == [(1, None, plan.size)]


def test_merge_leaves_a_cells_unfinished_rounds_to_the_sources_resume(tmp_path: Path) -> None:
    """A cell stored with fewer than the run's --rounds (a --spread window its run was stopped in) is not merged;
    once the source's resume finishes it, the next merge brings it."""
    three = plan_of(["mlp"], [1, 2], list(RUNTIMES))
    plan = Plan(three.cases, Settings(threads=1, rounds=3), three.skipped)
    source, target = tmp_path / "s1.db", tmp_path / "all.db"
    shard_store(source, plan, 1, 1, MACHINE_A)
    with Store.open(source) as store:
        store.conn.execute("UPDATE results SET rounds = 3")
        (last,) = store.conn.execute("SELECT MAX(id) FROM results").fetchone()
        store.conn.execute("UPDATE results SET rounds = 1 WHERE id = ?", (last,))
    assert merge_stores([source], target).runs[0].cells == plan.size - 1
    with Store.open(target) as store:
        assert {row.rounds for row in store.results()} == {3}
    with Store.open(source) as store:  # resumed: the cell now has its 3 rounds
        store.conn.execute("UPDATE results SET rounds = 3 WHERE id = ?", (last,))
    summary = merge_stores([source], target)
    assert summary.runs[0].cells == 1 and _run_ids(target) == [(1, None, plan.size)]


def test_a_failed_merge_leaves_an_older_target_as_it_was(tmp_path: Path) -> None:
    from fwbench.store.schema import MIGRATIONS, migrate

    plan = plan_of(["mlp"], [1, 2], ["torch:eager"])
    good, foreign = tmp_path / "good.db", tmp_path / "x.db"
    shard_store(good, plan, 1, 1, MACHINE_A)
    foreign.write_text("text")
    old = tmp_path / "old.db"
    with sqlite3.connect(old, isolation_level=None) as conn:  # a database of schema 4, before this merge
        conn.execute("PRAGMA journal_mode = WAL")  # as fwbench makes them
        migrate(conn, MIGRATIONS[:4])
    before = old.read_bytes()
    plan2 = plan_of(["mlp"], [4], ["torch:eager"])
    conflict_a, conflict_b = tmp_path / "a.db", tmp_path / "b.db"
    shard_store(conflict_a, plan2, 1, 1, MACHINE_A)
    shard_store(conflict_b, plan2, 1, 1, MACHINE_A)
    with pytest.raises(StoreError, match="two different runs"):
        merge_stores([good, conflict_a, conflict_b], old)  # fails after the migration and the first merges
    assert old.read_bytes() == before
    with sqlite3.connect(old) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 4
