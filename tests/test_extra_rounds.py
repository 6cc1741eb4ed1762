"""Extra rounds where the verdict is still open (fwbench.runner.extra_rounds): which group gets the next round,
why each stops, and a run with a budget storing every round and the stop reason with its cells."""

from __future__ import annotations

import dataclasses
import errno
import os
from pathlib import Path

import pytest

from fwbench.cli.run import print_budget
from fwbench.details import RoundsStop
from fwbench.diskfull import DiskFull, disk_full_report
from fwbench.measure.rounds import Block, blocks_by_round, paired_log_ratios, paired_speedup, time_estimate
from fwbench.runner.cell_rounds import CellRounds, merge_rounds
from fwbench.runner.extra_rounds import choose, group_widest, minimum_only
from fwbench.runner.manager import CellOutcome, Recorder, execute
from fwbench.runner.scheduler import GroupRun
from fwbench.spec import Case, Plan, Settings
from fwbench.speedups import relative_half_width
from fwbench.store import ResultRecord, Store

FAST = Settings(threads=1, max_time_s=0.3, timeout_s=60, rounds=3, min_block_s=0.01, settle_s=0.01)


def group(batch_size: int, rounds_wall_s: list[float]) -> GroupRun:
    """A group of two runtimes that has run rounds costing ``rounds_wall_s`` (nothing runs here)."""
    cases = [Case("mlp", "torch:eager", batch_size=batch_size), Case("mlp", "jax:jit", batch_size=batch_size)]
    made = GroupRun(cases, FAST, {})
    made.round_wall_s = list(rounds_wall_s)
    return made


def test_the_widest_group_against_the_target_gets_the_round_and_the_others_say_why_they_stop() -> None:
    settings = dataclasses.replace(FAST, budget_s=100.0, target_ci=0.05, max_rounds=5)
    met, wide, wider, at_limit, costly = (
        group(1, [5, 2, 2]),
        group(2, [5, 2, 2]),
        group(4, [5, 2, 2]),
        group(8, [5, 2, 2, 2, 2]),
        group(16, [5, 2, 30]),
    )
    widest = {met.key: 0.05, wide.key: 0.08, wider.key: 0.2, at_limit.key: 0.5, costly.key: 0.9}
    choice = choose([met, wide, wider, at_limit, costly], widest, settings, left_s=20.0)
    assert choice.group is wider
    assert choice.stops == {
        met.key: RoundsStop("target", 3, 0.05, 0.05),
        at_limit.key: RoundsStop("max-rounds", 5, 0.5, 0.05),
        costly.key: RoundsStop("budget", 3, 0.9, 0.05),  # its last round took 30 s: it would end after the budget
    }
    # a group with no CI yet comes first; of two as wide, the cheaper round; a failed extra round stops a group
    assert choose([wide, met], {wide.key: 0.08, met.key: None}, settings, 20.0).group is met
    cheap = group(32, [5, 2, 1])
    assert choose([wide, cheap], {wide.key: 0.08, cheap.key: 0.08}, settings, 20.0).group is cheap
    wide.cells[wide.cases[0].key].extra_failure = (3, CellOutcome(wide.cases[0], "timeout", "slow"))
    assert choose([wide], widest, settings, 20.0).stops[wide.key].reason == "failure"


def test_which_runs_give_no_extra_rounds_and_why() -> None:
    budget = dataclasses.replace(FAST, budget_s=100.0)
    assert minimum_only(budget, local=True) is None
    assert minimum_only(FAST, local=True) == "no-budget"
    assert minimum_only(budget, local=False) == "cluster" and minimum_only(FAST, local=False) == "no-budget"
    assert minimum_only(dataclasses.replace(budget, rounds=2), local=True) == "no-ci"
    assert minimum_only(dataclasses.replace(budget, protocol="hf2019"), local=True) == "protocol"
    assert minimum_only(dataclasses.replace(budget, max_rounds=3), local=True) == "max-rounds"


def stored_group(db_path: Path, per_call_s: dict[str, list[float]]) -> list[ResultRecord]:
    """One interleaved comparison group stored by hand: each runtime's rounds (one value a round), 4 blocks a
    round of exactly that time, every runtime's blocks in the same cycles."""
    cases = {runtime: Case("mlp", runtime) for runtime in per_call_s}
    with Store.open(db_path) as store:
        run_id = store.create_run(Plan(tuple(cases.values()), FAST), "test", {}, "0")
        for runtime, rounds in per_call_s.items():
            blocks = [
                Block(r, i, r * 4 + i, None, 10, 10 * seconds) for r, seconds in enumerate(rounds) for i in range(4)
            ]
            estimate = time_estimate(blocks_by_round(blocks))
            assert estimate is not None
            fields = {"status": "ok", "median_s": estimate.value, "ci_low_s": estimate.ci_low}
            fields.update(ci_high_s=estimate.ci_high, group_key="g", schedule="interleaved", rounds=len(rounds))
            store.add_result(run_id, cases[runtime], fields, [b.per_call_s for b in blocks], {}, blocks)
        return store.results([run_id])


def test_a_group_is_as_open_as_its_widest_speedup_over_its_baseline(db_path: Path) -> None:
    """torch:eager is the baseline wherever it stands in the group; the widest speed-up's CI decides; a group of one
    runtime is as open as its time's CI."""
    rows = stored_group(
        db_path, {"jax:jit": [1.0, 1.1, 0.9], "torch:eager": [2.0, 2.0, 2.0], "tensorflow:function": [3.0, 3.0, 3.03]}
    )
    base = rows[1]
    expected: list[float] = []
    for other in (rows[0], rows[2]):
        estimate = paired_speedup(paired_log_ratios(base.blocks, other.blocks))
        width = None if estimate is None else relative_half_width(estimate.value, estimate.ci_low, estimate.ci_high)
        assert width is not None
        expected.append(width)
    assert group_widest(rows) == pytest.approx(expected[0]) and expected[0] > 10 * expected[1]  # jax:jit's, the noisy
    alone = rows[0]
    own = relative_half_width(alone.median_s, alone.ci_low_s, alone.ci_high_s)
    assert own is not None and own > 0.05 and group_widest([alone]) == own
    # a baseline that did not end ok shows no speed-up: the group is as open as its cells' times
    failed = [dataclasses.replace(rows[1], status="error"), rows[0], rows[2]]
    assert group_widest(failed) == pytest.approx(own)
    assert relative_half_width(2.0, 1.8, 2.2) == pytest.approx(0.1)
    assert relative_half_width(None, 1.0, 2.0) is None and group_widest([]) is None


@pytest.mark.usefixtures("plugin_env")
def test_a_budgeted_run_gives_open_groups_rounds_until_the_limit_and_stores_why(db_path: Path) -> None:
    """A target no group can meet: both groups (one of two runtimes, one of one) run to --max-rounds, every round's
    blocks stored with the cells, one line heard per extra round, and the stop stored with every cell."""
    cases = (Case("mlp", "fake:sleep"), Case("mlp", "fake:slowsync"), Case("mlp", "fake:sleep", batch_size=2))
    settings = dataclasses.replace(FAST, budget_s=600.0, target_ci=1e-9, max_rounds=4)
    heard: list[str] = []
    with Store.open(db_path) as store:
        run_id = store.create_run(Plan(cases, settings), "test", {}, "0")
        execute(store, run_id, Plan(cases, settings), hear=heard.append)
        rows = store.results([run_id])
    assert [row.status for row in rows] == ["ok"] * 3, [row.reason for row in rows]
    assert heard[:3] == [f"round {index} of 3, 2 comparison groups in turn" for index in (1, 2, 3)], heard
    extra = heard[3:]
    assert len(extra) == 2 and all(line.startswith("extra round 4 of mlp inference") for line in extra), heard
    for row in rows:
        assert row.round_count == 4 and sorted({block.round for block in row.blocks}) == [0, 1, 2, 3]
        assert len(row.interleaving.rounds) == 4
        stop = row.interleaving.stop
        assert stop is not None and stop.reason == "max-rounds" and stop.rounds == 4 and stop.target == 1e-9
        assert stop.widest is not None and stop.widest > 0
    assert rows[0].wall_s is not None and rows[0].wall_s > 0


@pytest.mark.usefixtures("plugin_env")
def test_without_a_budget_each_group_runs_its_rounds_and_says_so(db_path: Path) -> None:
    cases = (Case("mlp", "fake:sleep"), Case("mlp", "fake:slowsync"))
    settings = dataclasses.replace(FAST, target_ci=1e-9, rounds=1)
    with Store.open(db_path) as store:
        run_id = store.create_run(Plan(cases, settings), "test", {}, "0")
        execute(store, run_id, Plan(cases, settings))
        rows = store.results([run_id])
    assert [row.round_count for row in rows] == [1, 1]
    assert [row.interleaving.stop for row in rows] == [RoundsStop("no-budget", 1)] * 2


def test_a_failed_extra_round_leaves_the_cell_its_rounds_and_says_what_failed() -> None:
    """A worker that fails in an extra round: the round's blocks go, the cell stays ok on its earlier rounds, and its
    details say which round failed and how; in a minimum round the same failure is the cell's status."""
    case = Case("mlp", "fake:sleep")
    cell = CellRounds(case)
    for round_index in range(3):
        cell.rounds.append(CellOutcome(case, "ok", None, fields={"first_call_s": 0.5, "calls_per_sample": 2}))
        cell.blocks += [Block(round_index, i, i, None, 2, 0.002 * (1 + round_index / 10)) for i in range(4)]
    cell.blocks += [Block(3, 0, 0, None, 2, 0.004)]  # the extra round's first block, then its worker died
    cell.fail(CellOutcome(case, "timeout", "no answer in 60 s"), 3, FAST)
    merged = merge_rounds(cell, "g", "interleaved")
    assert merged.status == "ok" and {block.round for block in merged.blocks} == {0, 1, 2}
    assert merged.fields["rounds"] == 3 and merged.fields["ci_low_s"] is not None
    assert merged.details["extra_round_failure"] == {"round": 4, "status": "timeout", "reason": "no answer in 60 s"}
    assert cell.ended and cell.failure is None
    again = merge_rounds(cell, "g", "interleaved")  # merged again (the group stored once more): the same
    assert again.fields == merged.fields and again.details == merged.details

    early = CellRounds(case)
    early.fail(CellOutcome(case, "timeout", "no answer in 60 s"), 1, FAST)
    assert merge_rounds(early, "g", "interleaved").status == "timeout"


def test_a_cell_stored_again_keeps_its_place_and_a_full_disk_stores_nothing(db_path: Path) -> None:
    """Recorder.replace: in place (the run's order unchanged), its blocks replaced; a worker's disk-full report
    stops it before anything is written."""
    cases = (Case("mlp", "torch:eager"), Case("mlp", "jax:jit"), Case("mlp", "torch:eager", batch_size=2))
    plan = Plan(cases, FAST)

    def outcome(case: Case, seconds: float, rounds: int, **details: object) -> CellOutcome:
        blocks = [Block(r, 0, r, None, 1, seconds) for r in range(rounds)]
        fields = {"median_s": seconds, "rounds": rounds}
        return CellOutcome(case, "ok", None, [seconds] * rounds, fields, dict(details), blocks)

    with Store.open(db_path) as store:
        run_id = store.create_run(plan, "test", {}, "0")
        recorder = Recorder(store, run_id, plan, None)
        recorder.record([(outcome(case, 0.001, 3), 1.0) for case in cases], None)
        before = [(row.id, row.case_key) for row in store.results([run_id])]
        recorder.replace([outcome(cases[0], 0.002, 4)], 2.0, None)
        rows = store.results([run_id])
        assert [(row.id, row.case_key) for row in rows] == before
        assert rows[0].median_s == 0.002 and len(rows[0].blocks) == 4 and rows[0].wall_s == 2.0
        assert len(rows[1].blocks) == 3 and [o.fields["rounds"] for o in recorder.in_plan_order()] == [4, 3, 3]

        report = disk_full_report(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/tmp/exports/model.onnx"))
        with pytest.raises(DiskFull):
            recorder.replace([outcome(cases[1], 0.005, 4, disk_full=report)], 3.0, None)
        assert store.results([run_id])[1].median_s == 0.001  # the stored cell as it was


def test_the_run_says_what_its_budget_buys_or_why_it_buys_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    budget = dataclasses.replace(FAST, budget_s=450.0)
    print_budget(budget, ray=False)
    print_budget(dataclasses.replace(budget, rounds=1), ray=False)
    print_budget(budget, ray=True)
    print_budget(FAST, ray=False, flags=["--target-ci"])
    print_budget(FAST, ray=False)  # no budget and no flag: nothing to say
    assert capsys.readouterr().err.splitlines() == [
        "budget 450 s: after 3 rounds each, extra rounds (up to 10) go where a speed-up's 95% CI is wider than ±5%",
        "fwbench: budget 450 s: fewer than 3 rounds give no CI to aim at: no extra rounds",
        "fwbench: budget 450 s: extra rounds are given on this machine only; on Ray each comparison group runs its "
        "--rounds",
        "fwbench: --target-ci acts only with --budget: no extra rounds",
    ]
