"""The scheduler (fwbench.runner.scheduler): comparison groups run interleaved in rounds, checked without timing
anything — the order and non-overlap of blocks from their recorded start times, the CPU idle workers use, a
worker that dies mid-group, resuming an interleaved run, and the statistics stored with each cell."""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from conftest import load_fake_runtimes
from fwbench.cli.common import duration, non_negative_duration
from fwbench.measure.noise import OTHER_CPU_LIMIT_CORES, NoiseTotals, contention
from fwbench.measure.rounds import blocks_by_round
from fwbench.measure.settle import QUIET_S, settle
from fwbench.messages import Job
from fwbench.models import get_model
from fwbench.models.weights_io import load_weights
from fwbench.runner import cell_rounds, interleave, interleave_start, manager, scheduler, tempfolders
from fwbench.runner.manager import CellOutcome, execute
from fwbench.runner.process import WorkerProcess, worker_cpus
from fwbench.runner.scheduler import comparison_groups, group_key, order_generator
from fwbench.spec import Case, Plan, Settings, SpecError
from fwbench.store import ResultRecord, Store

FAST = Settings(threads=1, max_time_s=0.3, timeout_s=60, rounds=2, min_block_s=0.02, settle_s=0.03)


def fake(mode: str, batch_size: int = 1) -> Case:
    return Case("mlp", f"fake:{mode}", batch_size=batch_size)


def run(db_path: Path, plan: Plan) -> int:
    with Store.open(db_path) as store:
        run_id = store.create_run(plan, "test", {}, "0")
        execute(store, run_id, plan)
    return run_id


def test_groups_are_cells_that_differ_only_by_runtime() -> None:
    cases = [fake("sleep", 1), fake("slowsync", 1), fake("sleep", 2), Case("mlp", "fake:sleep", phase="training")]
    groups = comparison_groups(cases)
    assert groups == [[cases[0], cases[1]], [cases[2]], [cases[3]]]
    assert group_key(cases[0]) == group_key(cases[1]) != group_key(cases[2])


def test_blocks_alternate_in_the_seeded_order_one_worker_at_a_time(
    plugin_env: dict[str, str], db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per round: the workers come up in a seeded order, then each cycle every worker times one block, in that
    cycle's seeded order; no two blocks overlap, and a quiet pause (:mod:`fwbench.measure.settle`) separates blocks of
    two workers. Only round 1 calibrates: round 2 times blocks of round 1's calls."""
    cases = (fake("sleep"), fake("slowsync"), fake("spike"))
    monkeypatch.setenv("FAKE_HOG_BYTES", str(64 * 2**20))  # spike's 64 MiB, not 1 GiB: a peak all the same
    calibrated: list[tuple[str, int]] = []
    calibrate = interleave._calibrate

    def spy(item: Any, cell: cell_rounds.CellRounds, settings: Settings, round_index: int) -> None:
        calibrated.append((item.case.runtime, round_index))
        calibrate(item, cell, settings, round_index)

    monkeypatch.setattr(interleave, "_calibrate", spy)
    run_id = run(db_path, Plan(cases, FAST))
    assert sorted(calibrated) == sorted((case.runtime, 0) for case in cases)
    with Store.open(db_path, readonly=True) as store:
        rows = {row.runtime: row for row in store.results([run_id])}
    assert all(row.status == "ok" for row in rows.values()), {r.runtime: r.reason for r in rows.values()}
    assert {row.schedule for row in rows.values()} == {"interleaved"} and {row.rounds for row in rows.values()} == {2}
    assert len({row.group_key for row in rows.values()}) == 1
    for round_index in range(FAST.rounds):
        blocks = sorted(
            ((block, runtime) for runtime, row in rows.items() for block in row.blocks if block.round == round_index),
            key=lambda item: item[0].start_unix_s or 0.0,
        )
        rng = order_generator(FAST, group_key(cases[0]), round_index)
        started = [cases[int(i)].runtime for i in rng.permutation(len(cases))]
        cycles = len(blocks) // len(cases)
        expected = [started[int(i)] for _ in range(cycles) for i in rng.permutation(len(cases))]
        assert [runtime for _, runtime in blocks] == expected
        cycle_of = [block.cycle for block, _ in blocks if block.cycle is not None]
        assert len(cycle_of) == len(blocks) and cycle_of == sorted(cycle_of)
        assert len(set(cycle_of)) == cycles  # one block per worker per cycle
        for (block, runtime), (following, next_runtime) in zip(blocks, blocks[1:]):
            assert block.start_unix_s is not None and following.start_unix_s is not None
            gap = following.start_unix_s - (block.start_unix_s + block.seconds)
            # another worker's block: the manager first saw the last worker quiet for QUIET_S (at most settle_s)
            assert gap >= (QUIET_S * 0.9 if runtime != next_runtime else 0.0), (gap, runtime, next_runtime)
    for row in rows.values():
        assert row.round_count == 2 and row.ci_low_s is None  # two rounds: an estimate, no CI
        # round 1 started its workers one at a time; round 2, whose peaks round 1 measured, side by side
        assert [r.started_together for r in row.interleaving.rounds] == [False, True]
        assert row.n_samples == len(row.blocks) and row.noise is not None and row.machine is not None
        assert len({block.calls for block in row.blocks}) == 1, row.blocks  # round 1's calls per block throughout


def test_a_round_whose_blocks_overrun_their_plan_ends_early(
    plugin_env: dict[str, str], db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks that take far longer than calibrated (here: the calibration reported 20 times too fast, as after a
    slowdown) end the round once they took OVERRUN × the plan, after at least MIN_CYCLES cycles, instead of running
    the hundreds of cycles the plan asked for."""
    calibrate = interleave._calibrate

    def too_fast(item: Any, cell: cell_rounds.CellRounds, settings: Settings, round_index: int) -> None:
        calibrate(item, cell, settings, round_index)
        item.block_s /= 20

    monkeypatch.setattr(interleave, "_calibrate", too_fast)
    # two rounds, a round's share 0.6 s: hundreds of cycles planned in round 1 (calibrated) and round 2 (round 1's calls)
    settings = dataclasses.replace(FAST, max_time_s=1.2)
    run_id = run(db_path, Plan((fake("sleep"), fake("slowsync")), settings))
    with Store.open(db_path, readonly=True) as store:
        rows = list(store.results([run_id]))
    assert {row.status for row in rows} == {"ok"}
    for row in rows:
        for blocks in blocks_by_round(row.blocks):
            # planned: ≥ 300 cycles (a share of 0.6 s over blocks reported as ≤ 2 ms); a block takes about its
            # calibrated time, 20 × what was reported, so OVERRUN × the plan is spent after about a tenth of them
            assert interleave.MIN_CYCLES <= len(blocks) < 100, len(blocks)


def test_round_one_gives_every_adaptive_worker_blocks_as_long_as_the_longest() -> None:
    """equal_blocks: a fast worker's calls per block grow until its block lasts as long as the longest one (at most
    a MIN_CYCLES-th of the round's share of max_time_s), and the cell keeps them for later rounds; a rank set, a fit
    and hf2019 keep their own blocks."""
    settings = Settings(max_time_s=6.0, rounds=3)  # a round's share 2 s: blocks of at most 0.4 s
    fast, slow = fake("sleep"), fake("slowsync")
    ranks = Case("mlp", "fake:sleep", phase="training", procs=2, scaling="weak")
    cells = {case.key: cell_rounds.CellRounds(case) for case in (fast, slow, ranks)}

    def live(case: Case, calls: int, block_s: float) -> Any:
        return interleave_start.LiveWorker(case, cast(Any, None), calls, block_s, 0)

    items = [live(fast, 64, 0.05), live(slow, 1, 0.2), live(ranks, 2, 0.01)]
    interleave.equal_blocks(items, cells, settings)
    assert [(item.calls, round(item.block_s, 9)) for item in items] == [(256, 0.2), (1, 0.2), (2, 0.01)]
    assert cells[fast.key].calibration == (256, pytest.approx(0.2)) and cells[ranks.key].calibration is None
    items = [live(fast, 64, 0.05), live(slow, 1, 1.5)]  # a slow block longer than 2 s / MIN_CYCLES
    interleave.equal_blocks(items, cells, settings)
    assert [item.calls for item in items] == [round(64 * 0.4 / 0.05), 1]
    items = [live(fast, 3, 0.05), live(slow, 3, 0.2)]
    interleave.equal_blocks(items, cells, dataclasses.replace(settings, protocol="hf2019"))
    assert [item.calls for item in items] == [3, 3]


def test_a_run_writes_each_models_seeded_weights_once_for_its_workers(
    plugin_env: dict[str, str], db_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The manager draws a model's canonical weights once per run into a safetensors file every group of that
    model hands its workers (bit for bit the values a worker would draw), removed when the run ends; where the file
    cannot be written, the workers draw them themselves."""
    paths: list[str | None] = []

    class Spy(scheduler.GroupRun):
        def __init__(self, cases: Any, settings: Settings, checks: Any, weights_path: str | None = None) -> None:
            paths.append(weights_path)
            assert weights_path is not None
            expected = get_model("mlp").canonical_weights(settings.seed)
            loaded = load_weights(get_model("mlp"), Path(weights_path))
            assert loaded.keys() == expected.keys()
            assert all(np.array_equal(loaded[name], expected[name]) for name in expected)
            super().__init__(cases, settings, checks, weights_path)

    monkeypatch.setattr(manager, "GroupRun", Spy)
    settings = dataclasses.replace(FAST, rounds=1, seed=7)
    run_id = run(db_path, Plan((fake("sleep", 1), fake("sleep", 2)), settings))
    assert len(paths) == 2 and paths[0] == paths[1] and paths[0] is not None and "seed7" in paths[0]
    assert not Path(paths[0]).exists()  # removed with the run
    with Store.open(db_path, readonly=True) as store:
        assert {row.status for row in store.results([run_id])} == {"ok"}
    assert manager.SeededWeights(str(tmp_path / "missing" / "folder"), 0).path("mlp", "inference") is None
    for own in (dataclasses.replace(settings, weights_path=str(tmp_path / "w.safetensors")), Settings(nodes=2)):
        with manager.seeded_weights(own) as weights:  # a file of the run's own; ranks on other machines
            assert weights is None


def test_a_killed_runs_folders_are_removed_by_the_next_run(tmp_path: Path) -> None:
    """Seeded-weights and export folders whose manager is gone (its pid in the name) are removed; a live manager's,
    and folders without a pid, stay. A run's own folders carry its pid."""
    child = subprocess.Popen(["sleep", "0"])
    child.wait()  # a pid that has ended
    stale = [tmp_path / f"{prefix}{child.pid}-abc" for prefix in tempfolders.PREFIXES]
    kept = [tmp_path / f"{prefix}{os.getpid()}-abc" for prefix in tempfolders.PREFIXES]
    kept.append(tmp_path / f"{tempfolders.EXPORTS_PREFIX}abc")  # no pid: not one of ours
    for folder in stale + kept:
        folder.mkdir()
        (folder / "mlp-seed0.safetensors").write_bytes(b"x")
    assert sorted(tempfolders.remove_stale(str(tmp_path))) == sorted(str(path) for path in stale)
    assert not any(path.exists() for path in stale) and all(path.exists() for path in kept)
    with tempfolders.run_folder(tempfolders.EXPORTS_PREFIX) as made:
        assert Path(made).name.startswith(f"{tempfolders.EXPORTS_PREFIX}{os.getpid()}-")


def test_idle_workers_use_no_cpu_while_a_peer_measures(plugin_env: dict[str, str]) -> None:
    """Two real frameworks alive together: during each of torch's blocks TensorFlow's idle worker (its Eigen
    pools included) gains less than 1% of the block's wall time in CPU time, and the other way round."""
    settings = Settings(threads=1, max_time_s=1.0, min_block_s=0.05, settle_s=0.05)
    cases = [Case("mlp", runtime, batch_size=64) for runtime in ("torch:eager", "tensorflow:function")]
    workers = [WorkerProcess(Job(case, settings, check_parity=False, interleaved=True, budget_s=1.0)) for case in cases]
    try:
        for worker in workers:
            worker.await_message({"ready"}, 120)
        calls = []
        for worker in workers:
            worker.command("calibrate")
            calls.append(int(worker.await_message({"calibrated"}, 60)["calls_per_block"]))
        idle_cpu, busy_wall = [0.0, 0.0], [0.0, 0.0]
        for _ in range(6):
            for active in (0, 1):
                idle = 1 - active
                settle(workers[idle].pids, settings.settle_s)  # the last block's worker, as the scheduler waits
                before = workers[idle].cpu_seconds()
                start = time.perf_counter()
                workers[active].command("block", calls=calls[active])
                workers[active].await_message({"block"}, 60)
                busy_wall[active] += time.perf_counter() - start
                after = workers[idle].cpu_seconds()
                assert before is not None and after is not None
                idle_cpu[idle] += after - before
        for idle in (0, 1):
            active = 1 - idle
            assert idle_cpu[idle] < 0.01 * busy_wall[active], (cases[idle].runtime, idle_cpu[idle], busy_wall[active])
    finally:
        for worker in workers:
            worker.close()


def test_a_worker_that_dies_mid_group_costs_its_cell_only(
    plugin_env: dict[str, str], db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_CRASH_AFTER", "20")  # past the first call and warm-up: in calibration or the blocks
    run_id = run(db_path, Plan((fake("late"), fake("sleep")), FAST))
    with Store.open(db_path, readonly=True) as store:
        late, sleep = store.results([run_id])
    assert late.status == "error" and late.blocks == ()
    assert late.reason is not None and "SIGSEGV during timing" in late.reason and "(round 1 of 2)" in late.reason
    assert sleep.status == "ok" and sleep.round_count == 2


def test_an_exception_mid_group_keeps_its_status_and_reason(
    plugin_env: dict[str, str], db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that raises while serving blocks reports it (its result line); the cell keeps that status."""
    monkeypatch.setenv("FAKE_CRASH_AFTER", "20")
    monkeypatch.setenv("FAKE_LATE_RAISE", "1")
    run_id = run(db_path, Plan((fake("late"), fake("sleep")), FAST))  # raised in round 1; kept through round 2
    with Store.open(db_path, readonly=True) as store:
        late, sleep = store.results([run_id])
    assert late.status == "oom", late.reason
    assert late.reason is not None and late.reason.startswith("MemoryError during timing: fake allocation failure")
    assert sleep.status == "ok"


def test_resume_runs_only_the_groups_not_stored(plugin_env: dict[str, str], db_path: Path) -> None:
    """A run stopped after its first group (a listener that raises, as Ctrl-C would) resumes with the second."""
    settings = Settings(threads=1, max_time_s=0.2, timeout_s=60, rounds=1, min_block_s=0.02, settle_s=0.0)
    plan = Plan((fake("sleep", 1), fake("slowsync", 1), fake("sleep", 2)), settings)  # groups of 2 and 1
    heard: list[str] = []

    def stop_after_first_group(outcome: CellOutcome) -> None:
        heard.append(outcome.case.key)
        if len(heard) == 2:
            raise KeyboardInterrupt

    with Store.open(db_path) as store:
        run_id = store.create_run(plan, "test", {}, "0")
        with pytest.raises(KeyboardInterrupt):
            execute(store, run_id, plan, stop_after_first_group)
        first = {row.case_key: row.id for row in store.results([run_id])}
        assert sorted(first) == sorted(c.key for c in plan.cases[:2])
        outcomes = execute(store, run_id, plan)
        assert [o.case.key for o in outcomes] == [c.key for c in plan.cases[2:]]
        rows = store.results([run_id])
    assert len(rows) == 3 and all(row.status == "ok" for row in rows)
    assert {row.case_key: row.id for row in rows if row.case_key in first} == first  # untouched


def first_block_starts(rows: list[Any]) -> dict[tuple[int, int], float]:
    """(batch size, round) → when that group's round timed its first block (unix seconds)."""
    starts: dict[tuple[int, int], float] = {}
    for row in rows:
        for block in row.blocks:
            key = (row.batch_size, block.round)
            starts[key] = min(starts.get(key, np.inf), block.start_unix_s)
    return starts


@dataclasses.dataclass
class StoppedWindow:
    """A window of two comparison groups stopped as its round 2 began (Ctrl-C), then resumed (``execute`` again):
    what the store held and the listeners heard in between and at the end."""

    plan: Plan
    interrupted: bool  # the first execute ended with the KeyboardInterrupt
    first: dict[str, ResultRecord]  # by case key: the cells stored when it stopped
    finished_when_stopped: list[str]  # the cells the listener heard of by then
    done_in_full: set[str]  # the cells with every minimum round, when it stopped
    done_any: set[str]  # the cells with any round, when it stopped
    resumed: float  # when the resume began (unix seconds)
    finished: list[str]  # the cells the listener heard of in all
    heard: list[str]  # the rounds the resume announced
    rows: list[ResultRecord]  # the cells stored at the end


# The tests of one stopped window share its run (and so an xdist process: --dist loadgroup).
shares_the_stopped_window = pytest.mark.xdist_group("interleave-stopped-window")


@pytest.fixture(scope="module")
def stopped_window(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StoppedWindow]:
    """Two groups of one window (the default --spread): sleep and slowsync at batch 1, sleep at batch 2, 3 rounds;
    stopped as round 2 begins, then resumed. The fake runtimes loaded for the module's tests."""
    settings = dataclasses.replace(FAST, rounds=3, max_time_s=0.3)
    plan = Plan((fake("sleep", 1), fake("slowsync", 1), fake("sleep", 2)), settings)
    db_path = tmp_path_factory.mktemp("stopped-window") / "fwbench.db"
    finished: list[str] = []
    heard: list[str] = []

    def stop_at_round_2(line: str) -> None:
        if line.startswith("round 2 of 3"):
            raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as monkeypatch:
        load_fake_runtimes(monkeypatch)
        with Store.open(db_path) as store:
            run_id = store.create_run(plan, "test", {}, "0")
            interrupted = False
            try:
                execute(store, run_id, plan, lambda outcome: finished.append(outcome.case.key), stop_at_round_2)
            except KeyboardInterrupt:
                interrupted = True
            first = {row.case_key: row for row in store.results([run_id])}
            finished_when_stopped = list(finished)
            done_in_full, done_any = store.done_keys(run_id, settings.rounds), store.done_keys(run_id)
            resumed = time.time()
            execute(store, run_id, plan, lambda outcome: finished.append(outcome.case.key), heard.append)
            rows = store.results([run_id])
    yield StoppedWindow(
        plan, interrupted, first, finished_when_stopped, done_in_full, done_any, resumed, finished, heard, rows
    )


@shares_the_stopped_window
def test_a_windows_groups_take_their_rounds_in_turn_in_alternating_order(stopped_window: StoppedWindow) -> None:
    """Two groups of one window (the default --spread), as the resume runs them: round 1 of each in plan order,
    round 2 in the reverse order, round 3 in plan order again, as the blocks' start times show; every cell ends
    with its 3 rounds."""
    rows = stopped_window.rows
    assert all(row.status == "ok" and row.round_count == 3 and row.ci_low_s is not None for row in rows), rows
    starts = first_block_starts(rows)
    assert sorted(starts, key=lambda key: starts[key]) == [(1, 0), (2, 0), (2, 1), (1, 1), (1, 2), (2, 2)]
    assert stopped_window.heard == [f"round {index} of 3, 2 comparison groups in turn" for index in (1, 2, 3)]


@shares_the_stopped_window
def test_a_window_stopped_midway_keeps_its_rounds_and_resume_runs_its_groups_again(
    stopped_window: StoppedWindow,
) -> None:
    """Stopped as round 2 of a window begins (Ctrl-C): every cell is stored with its first round (no CI yet), none
    counts as done, no listener heard of one; --resume runs the window's groups again, storing them in place."""
    keys = sorted(case.key for case in stopped_window.plan.cases)
    first = stopped_window.first
    assert stopped_window.interrupted
    assert stopped_window.finished_when_stopped == [] and sorted(first) == keys
    assert all(row.status == "ok" and row.round_count == 1 and row.ci_low_s is None for row in first.values())
    assert stopped_window.done_in_full == set() and sorted(stopped_window.done_any) == keys
    rows = stopped_window.rows
    assert sorted(stopped_window.finished) == keys
    assert {row.case_key: row.id for row in rows} == {key: row.id for key, row in first.items()}  # in place
    for row in rows:
        assert row.status == "ok" and row.round_count == 3 and row.ci_low_s is not None
        assert sorted({block.round for block in row.blocks}) == [0, 1, 2]
        assert all(
            block.start_unix_s is not None and block.start_unix_s > stopped_window.resumed for block in row.blocks
        )  # afresh
    checked = {row.runtime for row in rows if row.parity is not None}  # each pair checked again, by its first cell
    assert checked == {"fake:sleep", "fake:slowsync"}


def test_a_check_of_a_cells_first_round_stays_when_a_later_round_fails() -> None:
    """The manager settles a pair's parity on a cell's first round (other groups of its window rely on it): when
    the cell fails in a later minimum round, its stored failure keeps that round's parity and precision checks."""
    case = fake("sleep")
    cell = cell_rounds.CellRounds(case)
    checks = {"parity": {"ok": True, "worst_rel_l2": 1e-7}, "precision": {"policy": "fp32"}}
    cell.rounds.append(CellOutcome(case, "ok", None, fields={"first_call_s": 0.1}, details=dict(checks)))
    cell.fail(CellOutcome(case, "timeout", "no answer in 60 s"), 1, dataclasses.replace(FAST, rounds=3))
    merged = cell_rounds.merge_rounds(cell, "g", "interleaved")
    assert merged.status == "timeout" and merged.reason == "no answer in 60 s (round 2 of 3)"
    assert {key: merged.details[key] for key in checks} == checks
    failed_first = cell_rounds.CellRounds(case)
    failed_first.fail(CellOutcome(case, "error", "boom"), 0, FAST)
    assert "parity" not in cell_rounds.merge_rounds(failed_first, "g", "interleaved").details


def test_groups_are_cut_into_windows_of_at_most_the_spread_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Consecutive groups share a window while their estimates add up to --spread; each window has a group at least
    (one longer than --spread alone; --spread 0: every group alone); a group of skipped cells only costs nothing."""
    settings = dataclasses.replace(FAST, rounds=3)
    groups: manager.Pending = [([fake("sleep", size)], []) for size in range(1, 6)]
    each = 40.0  # estimated seconds per cell, whatever its size
    monkeypatch.setattr(manager, "estimate_s", lambda cases, _: each * len(cases))

    def sizes(spread_s: float, pending: manager.Pending = groups) -> list[int]:
        windows = manager.spread_windows(pending, dataclasses.replace(settings, spread_s=spread_s))
        assert [group for window in windows for group in window] == pending  # in order, each once
        return [len(window) for window in windows]

    assert sizes(2.5 * each) == [2, 2, 1]
    assert sizes(0.0) == [1] * 5 and sizes(0.5 * each) == [1] * 5
    assert sizes(100 * each) == [5]
    assert sizes(2.5 * each, [*groups[:2], ([], []), *groups[2:]]) == [3, 2, 1]
    with pytest.raises(SpecError, match="spread must be"):
        dataclasses.replace(settings, spread_s=-1.0)
    assert non_negative_duration("0") == 0 and non_negative_duration("10m") == 600
    with pytest.raises(argparse.ArgumentTypeError):
        duration("0")


def test_sequential_rounds_store_each_rounds_blocks(plugin_env: dict[str, str], db_path: Path) -> None:
    settings = Settings(threads=1, max_time_s=0.2, timeout_s=60, rounds=3, interleave=False, min_block_s=0.02)
    run_id = run(db_path, Plan((fake("sleep"), fake("slowsync")), settings))
    with Store.open(db_path, readonly=True) as store:
        rows = store.results([run_id])
    for row in rows:
        assert row.status == "ok" and row.schedule == "sequential" and row.round_count == 3
        assert all(block.cycle is None for block in row.blocks)  # nothing to pair with
        low, median, high = row.ci_low_s, row.median_s, row.ci_high_s
        assert low is not None and median is not None and high is not None and low <= median <= high


def test_contention_thresholds() -> None:
    quiet = NoiseTotals(wall_s=10.0, other_cpu_s=0.05, steal_s=0.01, machine_s=20.0)
    assert contention(quiet) == []
    busy = NoiseTotals(wall_s=10.0, other_cpu_s=10.0 * OTHER_CPU_LIMIT_CORES * 1.5, steal_s=1.0, machine_s=20.0)
    reasons = contention(busy)
    assert len(reasons) == 2 and "15% of a core" in reasons[0] and "steal 5.0%" in reasons[1]
    assert np.isclose(NoiseTotals.from_dict(busy.to_dict()).other_cpu_s, busy.other_cpu_s)


def test_env_noise_probe_reports_each_probe_and_the_rounds_it_needs(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from fwbench.cli import main
    from fwbench.measure.probe import MAX_ROUNDS, PROBES, recommended_rounds

    assert main(["env", "--noise", "--rounds", "2", "--seconds", "0.3", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [probe["name"] for probe in data["probes"]] == list(PROBES)
    for probe in data["probes"]:
        assert probe["median_s"] > 0 and probe["within_cv"] >= 0 and probe["between_cv"] >= 0
        assert 3 <= probe["recommended_rounds"] <= MAX_ROUNDS and probe["rel_half_width"] is None  # 2 rounds: no CI
    assert data["noise"]["wall_s"] > 0.5
    # no spread between processes: the fewest rounds that give a CI; a huge spread: the cap; more spread, more rounds
    assert recommended_rounds(0.0) == 3 and recommended_rounds(1.0) == MAX_ROUNDS
    assert recommended_rounds(0.01) <= recommended_rounds(0.02) <= recommended_rounds(0.04)
    assert main(["env", "--rounds", "2"]) == 2  # --rounds without --noise: one clear line
    assert "only with env --noise" in capsys.readouterr().err


def test_a_worker_started_beside_others_runs_every_thread_on_its_cells_cpus(plugin_env: dict[str, str]) -> None:
    """A worker given start CPUs (every CPU of the machine) imports torch on them, then moves every thread (BLAS,
    OpenMP and torch's own included) to the cell's CPU before the framework is configured: its result lists no
    thread anywhere else."""
    cell_cpus = worker_cpus(1)
    every_cpu = sorted(range(os.cpu_count() or 1))
    job = Job(Case("mlp", "torch:eager", batch_size=2), Settings(threads=1, max_time_s=0.1), check_parity=False)
    with WorkerProcess(job, start_cpus=every_cpu) as worker:
        result = worker.await_message({"result"}, 120)
    assert result["status"] == "ok", result.get("reason")
    assert result["cpus"] == list(cell_cpus) and result["thread_cpu_lists"] == [str(cell_cpus[0])], result
