"""Where a run's wall time went (fwbench/report/walltime.py): the timed blocks' seconds against the comparison groups'
wall time, and the workers' stage seconds, summed by construction from hand-built stored cells."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fwbench.details import STOP_REASONS
from fwbench.report.export import to_json
from fwbench.report.table import report_tables
from fwbench.report.walltime import STOP_PHRASES, WallTime, rounds_stop_line, wall_time, wall_time_line
from fwbench.spec import Case
from fwbench.store import Store
from report_store import Cell, add_run

STAGES = {"start": 0.5, "import": 2.0, "build": 0.25, "compile": 1.0, "first_call": 0.125, "warmup": 0.5}


def _round(timing_s: float) -> dict[str, object]:
    return {"first_call_s": 0.125, "calls_per_sample": 4, "stage_seconds": {**STAGES, "timing": timing_s}}


def test_the_blocks_and_the_stages_add_up(tmp_path: Path) -> None:
    samples = [0.01] * 6  # 2 rounds × 3 blocks of 4 calls: 6 × 0.04 s = 0.24 s measured
    cells = [
        Cell(
            Case("mlp", runtime, batch_size=1),
            samples,
            rounds=2,
            details={"round_details": [_round(3.0), _round(5.0)]},
            fields={"wall_s": 10.0},
        )
        for runtime in ("torch:eager", "jax:jit")
    ]
    failed = Cell(Case("mlp", "tensorflow:function"), status="error", reason="boom", fields={"wall_s": 10.0}, rounds=0)
    with Store.open(tmp_path / "x.db") as store:
        run_id = add_run(store, [*cells, failed])
        results = store.results([run_id])
        runs = store.runs([run_id])
    wall = wall_time(results)
    assert wall.wall_s == pytest.approx(30.0)  # the failed cell's share of the group counts too
    assert wall.measured_s == pytest.approx(2 * 6 * 4 * 0.01)
    assert wall.measured_fraction == pytest.approx(0.48 / 30.0)
    assert wall.stage_s == pytest.approx(
        {
            "start-up and import": 4 * 2.5,  # 2 cells × 2 rounds
            "build": 4 * 0.25,
            "compile": 4 * 1.0,
            "first call": 4 * 0.125,
            "warm-up": 4 * 0.5,
            "timing": 2 * (3.0 + 5.0),
        }
    )
    line = wall_time_line(wall)
    assert line is not None and line.startswith("measured 480 ms of 30 s of the comparison groups' wall time (2%)")
    assert line in report_tables(results)[1]  # the terminal and Markdown reports end with it
    exported = json.loads(to_json(runs, results))["runs"][0]["wall_time"]
    assert exported["measured_s"] == pytest.approx(0.48) and exported["wall_s"] == pytest.approx(30.0)


def test_without_a_stored_wall_time_there_is_no_line() -> None:
    assert wall_time_line(WallTime(None, 1.0)) is None
    assert wall_time([]) == WallTime(None, 0.0, {})


def test_the_legend_counts_why_each_group_stopped_adding_rounds(tmp_path: Path) -> None:
    """One line over comparison groups (not cells): two groups met the target, one stopped on the budget."""

    def stop(reason: str, rounds: int) -> dict[str, object]:
        return {"rounds_stop": {"reason": reason, "rounds": rounds, "widest": 0.04, "target": 0.05}}

    cells = [
        Cell(Case("mlp", runtime, batch_size=batch), [0.01] * 6, rounds=rounds, details=stop(reason, rounds))
        for batch, reason, rounds in ((1, "target", 3), (2, "target", 5), (4, "budget", 7))
        for runtime in ("torch:eager", "jax:jit")
    ]
    with Store.open(tmp_path / "x.db") as store:
        results = store.results([add_run(store, cells)])
    line = rounds_stop_line(results)
    assert line == (
        "rounds per comparison group 3–7 (target: the widest speed-up CI within ±5%): 2 groups met it, "
        "1 group stopped on the budget"
    )
    assert line in report_tables(results)[1]
    assert rounds_stop_line(results[:1]) is not None and rounds_stop_line([]) is None
    assert set(STOP_PHRASES) == set(STOP_REASONS)  # every stored reason is counted in the line
