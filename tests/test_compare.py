"""`fwbench compare RUN_A RUN_B`: per-cell B/A ratios, the summary, environment differences, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from conftest import run_cli
from fwbench.cli import main
from fwbench.measure.rounds import unpaired_ratio
from fwbench.report.compare import compare_results
from fwbench.report.export import to_json
from fwbench.spec import Case, Settings
from fwbench.speedups import holm
from fwbench.store import ResultRecord, Store
from report_store import Cell, add_run, blocks_of, timed

ENV_A = {"cpu_model": "AMD EPYC", "physical_cores": 2, "version_torch": "2.13.0+cpu"}
ENV_B = {"cpu_model": "Intel Xeon", "physical_cores": 2, "version_torch": "2.13.0+cpu"}


def cells(
    scale: dict[tuple[str, int], float] | None = None,
    seed: int = 0,
    broken: tuple[str, int] | None = None,
    version: str = "2.13.0",
) -> list[Cell]:
    """bert-tiny in torch:eager and jax:jit at batch 1, 2, 4, times multiplied by ``scale[(runtime, batch)]``."""
    out = []
    for i, (runtime, batch) in enumerate((rt, b) for rt in ("torch:eager", "jax:jit") for b in (1, 2, 4)):
        case = Case("bert-tiny", runtime, batch_size=batch, seq_len=8)
        versions = {"versions": {"torch": version} if runtime.startswith("torch") else {"jax": "0.10.2"}}
        if (runtime, batch) == broken:
            out.append(Cell(case, status="oom", reason="killed", details=versions))
            continue
        median = 1e-3 * batch * (scale or {}).get((runtime, batch), 1.0)
        out.append(Cell(case, timed(median, seed=seed * 100 + i), details=versions))
    return out


def compare(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["compare", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """Run 1; run 2 the same distributions (other seeds); run 3 jax:jit b=2 20% slower; run 4 torch b=4 broken."""
    path = tmp_path / "a.db"
    with Store.open(path) as store:
        add_run(store, cells(seed=1), ENV_A)
        add_run(store, cells(seed=2), ENV_A)
        add_run(store, cells({("jax:jit", 2): 1.2}, seed=3), ENV_A)
        add_run(store, cells(seed=4, broken=("torch:eager", 4)), ENV_A)
    return path


def test_no_regression_exits_0(capsys: pytest.CaptureFixture[str], db: Path) -> None:
    code, out, err = compare(capsys, "1", "2", "--db", str(db))
    assert code == 0, out + err
    assert "0 significant regressions beyond 5%, 0 cells broken" in out and out.rstrip().endswith("exit 0")
    verdicts = {line.split("│")[-2].strip() for line in out.splitlines() if line.count("│") == 10}
    assert verdicts <= {"not significant", "within threshold"} and len(verdicts) >= 1, verdicts


def test_a_significant_regression_beyond_the_threshold_exits_1(capsys: pytest.CaptureFixture[str], db: Path) -> None:
    code, out, _ = compare(capsys, "1", "3", "--db", str(db))
    assert code == 1
    (row,) = [line for line in out.splitlines() if line.count("│") == 10 and "regression" in line]
    assert "jax:jit" in row and "│     2 │" in row and "1.2" in row
    assert "1 significant regressions beyond 5%" in out and out.rstrip().endswith("exit 1")
    # the same slow-down is within a 25% threshold
    code, out, _ = compare(capsys, "1", "3", "--db", str(db), "--threshold", "0.25")
    assert code == 0 and "within threshold" in out


def test_a_cell_that_broke_exits_1(capsys: pytest.CaptureFixture[str], db: Path) -> None:
    code, out, _ = compare(capsys, "1", "4", "--db", str(db))
    assert code == 1 and "broken: ok → oom" in out and "1 cells broken" in out
    code, out, _ = compare(capsys, "4", "1", "--db", str(db))  # the other way round it was fixed
    assert code == 0 and "fixed: oom → ok" in out


def test_every_runtime_moving_together_is_flagged_as_the_machine(capsys: pytest.CaptureFixture[str], db: Path) -> None:
    """All cells 1.7× slower (a machine that changed speed): still regressions, with a warning that every runtime moved
    the same way; one runtime slower (run 3) or nothing slower (run 2) gets none."""
    everything = {(runtime, batch): 1.7 for runtime in ("torch:eager", "jax:jit") for batch in (1, 2, 4)}
    with Store.open(db) as store:
        slower = add_run(store, cells(everything, seed=5), ENV_A)
    code, out, err = compare(capsys, "1", str(slower), "--db", str(db), "--format", "json")
    shift = json.loads(out)["shift_warning"]
    assert code == 1 and shift is not None and f"fwbench: {shift}" in err
    assert shift.startswith("warning: every runtime moved the same way between the runs (B/A 1.70× over 6 cells")
    for other in ("2", "3"):
        code, out, err = compare(capsys, "1", other, "--db", str(db), "--format", "json")
        assert json.loads(out)["shift_warning"] is None and "moved the same way" not in err


def test_statistics_of_the_comparison(db: Path) -> None:
    with Store.open(db, readonly=True) as store:
        a, b = store.results([1]), store.results([3])
    comparison = compare_results(a, b, 1, 3)
    assert len(comparison.cells) == 6 and not comparison.only_a and not comparison.only_b
    for cell, row_a, row_b in zip(comparison.cells, a, b):
        # B/A (> 1: B is slower), each side's variance moderated over its own run's six cells
        assert row_a.priors is not None and row_b.priors is not None and row_a.priors.times is not None
        priors = (row_b.priors.times, row_a.priors.times)
        estimate = unpaired_ratio(row_b.round_samples, row_a.round_samples, priors)
        assert estimate is not None and (cell.ratio, cell.ci_low, cell.ci_high, cell.p_value) == (
            estimate.value,
            estimate.ci_low,
            estimate.ci_high,
            estimate.p_value,
        )
    p_values = [c.p_value for c in comparison.cells if c.p_value is not None]
    assert len(p_values) == 6 and [c.p_adjusted for c in comparison.cells] == pytest.approx(holm(p_values))
    every = comparison.summaries[-1]
    assert every.runtime == "all" and every.n_common == 6
    assert every.geomean_ratio == pytest.approx(stats.gmean([c.ratio for c in comparison.cells]))
    assert [s.runtime for s in comparison.summaries] == ["torch:eager", "jax:jit", "all"]
    assert comparison.summaries[1].geomean_ratio == pytest.approx(1.2 ** (1 / 3), rel=0.02)


def test_runs_from_two_databases_and_environment_differences(
    capsys: pytest.CaptureFixture[str], db: Path, tmp_path: Path
) -> None:
    other = tmp_path / "b.db"
    with Store.open(other) as store:
        extra = [Cell(Case("mlp", "torch:eager", batch_size=1), timed(2e-5))]
        add_run(store, cells(seed=5, version="2.14.0") + extra, ENV_B, Settings(threads=1))
    code, out, _ = compare(capsys, "1", "1", "--db", str(db), "--db-b", str(other))
    assert code == 0
    assert f"A = run 1 of {db}, B = run 1 of {other}" in " ".join(out.split())
    env = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") == 4}
    assert "AMD EPYC" in env["environment.cpu_model"] and "Intel Xeon" in env["environment.cpu_model"]
    assert "2.13.0" in env["versions.torch"] and "2.14.0" in env["versions.torch"]
    assert "settings.threads" in env and "versions.jax" not in env
    assert "1 cells only run B has" in out and "0 only in A, 1 only in B" in out
    code, out, _ = compare(capsys, "latest", "latest", "--db", str(db), "--db-b", str(other), "--format", "json")
    data = json.loads(out)
    assert code == 0 and data["run_a"] == 4 and data["run_b"] == 1 and data["failed"] is False
    assert [d["key"] for d in data["environment"]] == ["environment.cpu_model", "settings.threads", "versions.torch"]
    assert data["only_b"] == [
        {
            "model": "mlp",
            "runtime": "torch:eager",
            "phase": "inference",
            "batch_size": 1,
            "seq_len": None,
            "dtype": "fp32",
            "device": "cpu",
            "workers": None,
            "procs": None,
            "scaling": None,
            "status": "ok",
            "reason": None,
        }
    ]
    assert {c["verdict"] for c in data["cells"]} <= {"not significant", "within threshold", "fixed"}


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["1", "9"], "RUN_B 9 is not in"),
        (["7", "1"], "RUN_A 7 is not in"),
        (["1", "2", "--threshold", "-0.1"], "must be a non-negative finite number"),
        (["1", "2", "--threshold", "nan"], "must be a non-negative finite number"),
        (["1"], "the following arguments are required: RUN_B"),
        (["one", "2"], "is not a positive integer"),
    ],
)
def test_bad_input_exits_2(capsys: pytest.CaptureFixture[str], db: Path, argv: list[str], fragment: str) -> None:
    code, out, err = compare(capsys, *argv, "--db", str(db))
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and fragment in lines[0] and "Traceback" not in err, err
    assert out == ""


def test_bad_databases_exit_2(capsys: pytest.CaptureFixture[str], db: Path, tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_bytes(b"not a database")
    for argv, fragment in [
        (["--db", str(tmp_path / "none.db")], "does not exist"),
        (["--db", str(db), "--db-b", str(notes)], "is not an SQLite database"),
        (["--db", str(db), "--db-b", str(tmp_path)], "is a directory"),
    ]:
        code, _, err = compare(capsys, "1", "1", *argv)
        assert code == 2 and len(err.strip().splitlines()) == 1 and fragment in err, err
    assert notes.read_bytes() == b"not a database"
    disjoint = tmp_path / "c.db"
    with Store.open(disjoint) as store:
        add_run(store, [Cell(Case("mlp", "jax:jit", batch_size=3), timed(1e-5))])
    code, _, err = compare(capsys, "1", "1", "--db", str(db), "--db-b", str(disjoint))
    assert code == 2 and "have no cell in common" in err


def test_compare_help_and_exit_status_from_a_subprocess(db: Path) -> None:
    assert "RUN_A" in run_cli("compare", "--help").stdout
    result = run_cli("compare", "1", "3", "--db", str(db))
    assert result.returncode == 1 and "regression" in result.stdout and result.stderr == ""


def test_ratio_orientation_on_fixed_samples() -> None:
    a = np.full(5, 2.0) * np.array([1.0, 1.01, 0.99, 1.02, 0.98])
    row = {
        "id": 1,
        "run_id": 1,
        "case_key": "m",
        "created": "",
        "model": "m",
        "runtime": "r",
        "phase": "inference",
        "batch_size": 1,
        "seq_len": None,
        "dtype": "fp32",
        "device": "cpu",
        "status": "ok",
    }
    a = np.concatenate([a, a * 1.01, a * 0.99])  # three rounds of five blocks
    rows_a = [ResultRecord.from_row({**row, "samples": list(a), "median_s": 2.0, "blocks": blocks_of(a, 3, 1)})]
    rows_b = [ResultRecord.from_row({**row, "run_id": 2, "samples": list(a * 1.5), "blocks": blocks_of(a * 1.5, 3, 1)})]
    (cell,) = compare_results(rows_a, rows_b, 1, 2).cells
    assert cell.ratio == pytest.approx(1.5) and cell.median_a_s == pytest.approx(2.0)
    expected = unpaired_ratio([a[5 * r : 5 * r + 5] * 1.5 for r in range(3)], [a[5 * r : 5 * r + 5] for r in range(3)])
    assert expected is not None and cell.verdict == "regression" and cell.p_value == pytest.approx(expected.p_value)


def test_runs_of_one_round_get_no_verdict_and_say_so(tmp_path: Path) -> None:
    """A speed-up needs 3 rounds a side for a CI: runs of one round compare without any verdict, and the
    closing line says how many cells that is, so a CI gate on them is not mistaken for a pass on evidence."""
    from fwbench.report.compare import verdict_line

    with Store.open(tmp_path / "one.db") as store:
        one = [Cell(c.case, c.samples, c.status, c.reason, c.details, rounds=0) for c in cells(seed=1)]
        slower = [
            Cell(c.case, [2 * s for s in c.samples], c.status, c.reason, c.details, rounds=0) for c in cells(seed=2)
        ]
        add_run(store, one, ENV_A)
        add_run(store, slower, ENV_A)
        comparison = compare_results(store.results([1]), store.results([2]), 1, 2)
    assert all(
        c.ratio is not None and c.ratio > 1.9 and c.p_value is None and not c.significant for c in comparison.cells
    )
    assert not comparison.failed
    assert "; 6 of them without a verdict (fewer than 3 rounds on a side: run with --rounds 3 or more); exit 0" in (
        verdict_line(comparison)
    )


def test_the_json_export_carries_the_priors_each_run_was_moderated_with(db: Path) -> None:
    with Store.open(db, readonly=True) as store:
        runs, rows = store.runs([1]), store.results([1])
    (entry,) = json.loads(to_json(runs, rows))["runs"][0]["variance_priors"]
    prior = rows[0].priors.times if rows[0].priors is not None else None
    assert prior is not None and entry["times"]["cells"] == prior.cells == 6
    assert entry["times"]["intercept"] == prior.intercept and entry["times"]["slope"] == prior.slope
    assert entry["hardware_id"] == rows[0].hardware_id


def _serving_record(run_id: int, runtime: str, capacity: float, p99_s: float) -> ResultRecord:
    """A serving cell of one round: its capacity, its 50% point's p99, a peak at 80% of the capacity."""
    point = {"scenario": "Server", "label": "server@0.50", "fraction": 0.5, "offered_qps": capacity / 2,
             "p99_s": p99_s, "answered": 100}  # fmt: skip
    serving = {"max_batch": 8, "rounds": [{"capacity_qps": capacity, "peak_qps": 0.8 * capacity, "points": [point]}]}
    return ResultRecord.from_row(
        {"id": run_id, "case_key": runtime, "created": "", "run_id": run_id, "model": "mlp", "runtime": runtime,
         "phase": "serving", "batch_size": 8, "seq_len": None, "dtype": "fp32", "device": "cpu", "status": "ok",
         "samples": [0.001], "details": {"serving": serving}}
    )  # fmt: skip


def test_compare_puts_the_serving_figures_of_both_runs_side_by_side() -> None:
    """Serving cells of both runs: capacity, p99 at 50% and peak in A and B with B/A; a cell of one run only is
    left out; descriptive (no verdict comes from it)."""
    from fwbench.report.compare import serving_change_table
    from fwbench.report.serving import serving_changes

    a = [_serving_record(1, "torch:eager", 1000.0, 0.010), _serving_record(1, "jax:jit", 800.0, 0.012)]
    b = [_serving_record(2, "torch:eager", 500.0, 0.020)]
    (change,) = serving_changes(a, b)
    assert change.runtime == "torch:eager"  # geometric means: exp(log x) is x within an ulp
    assert change.capacity_a == pytest.approx(1000.0) and change.capacity_b == pytest.approx(500.0)
    assert change.p99_half_a == pytest.approx(0.010) and change.p99_half_b == pytest.approx(0.020)
    assert change.peak_a == pytest.approx(800.0) and change.peak_b == pytest.approx(400.0)
    (row,) = serving_change_table([change]).rows
    assert row[4:7] == ["1000", "500", "0.50×"] and row[9] == "2.00×" and row[12] == "0.50×"
