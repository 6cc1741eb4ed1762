"""Reports: JSON shape, CSV layout, and store strings never interpreted as markup."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from fwbench.cli import main
from fwbench.report.export import CSV_COLUMNS, spreadsheet_tables, to_csv, to_json, write_csv_dir
from fwbench.report.table import PIPE_WIDTH, markdown_report, print_results
from fwbench.spec import Case
from fwbench.store import ResultRecord, Store
from fwbench.units import format_bytes, format_seconds, format_seconds_noise, parse_bytes, significant_digits
from report_store import Cell, add_run, timed


def row(**extra: object) -> ResultRecord:
    base: dict[str, object] = dict(
        id=1,
        case_key="mlp-b2",
        created="2026-01-01T00:00:00+00:00",
        run_id=1,
        model="mlp",
        runtime="torch:eager",
        phase="inference",
        batch_size=2,
        seq_len=None,
        dtype="fp32",
        device="cpu",
        status="ok",
        reason=None,
        protocol="adaptive",
        n_samples=3,
        calls_per_sample=4,
        median_s=2e-5,
        ci_low_s=1.9e-5,
        ci_high_s=2.1e-5,
        mean_s=2e-5,
        stdev_s=1e-6,
        min_s=1.9e-5,
        first_call_s=0.03,
        peak_memory_bytes=3 * 2**20,
        allocator_peak_bytes=None,
        threads=2,
        interop_threads=1,
        flops=100,
        wall_s=1.0,
        samples=[1.9e-5, 2e-5, 2.1e-5],
        details={},
    )
    base.update(extra)
    return ResultRecord.from_row(base)


def test_units() -> None:
    assert format_seconds(2.13e-5) == "21.3 µs" and format_seconds(1.5) == "1.5 s" and format_seconds(None) == "—"
    assert format_seconds(0.99963) == "1 s" and format_seconds(9.9996e-4) == "1 ms"  # never "1e+03 ms"
    assert format_bytes(1536) == "1.5 KiB" and format_bytes(512) == "512 B"
    assert parse_bytes("2G") == 2 * 2**30 and parse_bytes("512m") == 512 * 2**20 and parse_bytes("100") == 100


def test_csv_layout() -> None:
    text = to_csv([row(), row(status="oom", reason="killed", median_s=None, samples=[], n_samples=0)])
    rows = list(csv.reader(io.StringIO(text)))
    assert tuple(rows[0]) == CSV_COLUMNS
    first = dict(zip(rows[0], rows[1]))
    assert first["seq_len"] == "" and first["median_s"] == "2e-05" and first["samples"] == "1.9e-05 2e-05 2.1e-05"
    second = dict(zip(rows[0], rows[2]))
    assert second["status"] == "oom" and second["median_s"] == "" and second["samples"] == ""


def test_json_shape() -> None:
    data = json.loads(to_json([], [row()]))
    assert set(data) == {"runs", "results"}
    assert data["results"][0]["samples"] == [1.9e-5, 2e-5, 2.1e-5]


def test_time_to_first_result_sums_the_stages_before_the_first_outputs() -> None:
    """Start-up, import, build, compile (export and load) and the first call; never the timing. The table shows
    it only next to a deployment cell (one whose compile report has export seconds); JSON and CSV always."""
    stages = {"start": 0.25, "import": 2.0, "build": 0.5, "compile": 4.0, "first_call": 0.125, "timing": 9.0}
    exported = row(runtime="onnxruntime:torch", details={"stage_seconds": stages, "compile_report": {"export_s": 3.5}})
    assert exported.time_to_first_result_s == 6.875 and exported.exported
    eager = row(details={"stage_seconds": {**stages, "compile": 0.0}})
    assert eager.time_to_first_result_s == 2.875 and not eager.exported
    assert row(status="error", details={"stage_seconds": {"start": 0.1, "import": 2.0}}).time_to_first_result_s is None
    assert json.loads(to_json([], [exported]))["results"][0]["time_to_first_result_s"] == 6.875
    assert dict(zip(*csv.reader(io.StringIO(to_csv([eager])))))["time_to_first_result_s"] == "2.875"
    for rows, shown in (([eager], False), ([eager, exported], True)):
        console = Console(record=True, width=400)
        print_results(rows, console)
        text = console.export_text()
        assert ("to first result" in text) == shown
        assert ("6.88 s" in text) == shown


def test_table_shows_markup_in_reasons_literally() -> None:
    console = Console(record=True, width=300)
    print_results([row(status="error", reason="RuntimeError: [bold]boom[/bold] x[0]", median_s=None)], console)
    text = console.export_text()
    assert "[bold]boom[/bold] x[0]" in text
    assert "21.3" not in text and "error" in text


def test_digits_follow_the_noise() -> None:
    assert significant_digits(21.34, 0.064) == 4 and significant_digits(21.34, 1.1) == 2
    assert significant_digits(21.34, None) == 3 and significant_digits(21.34, 1e-9) == 4  # clamped
    assert format_seconds_noise(2.1337e-5, 2.1337e-5 - 6.4e-8, 2.1337e-5 + 6.4e-8) == "21.34 µs"
    assert format_seconds_noise(2.1337e-5, 2.02e-5, 2.24e-5) == "21 µs"
    assert format_seconds_noise(2.134e-4, 2.12e-4, 2.15e-4) == "213 µs"  # never an exponent
    assert format_seconds_noise(None, None, None) == "—"


def sheet_rows() -> list[Cell]:
    """The spreadsheet fixture: bert-tiny in two runtimes over batch {1, 2} × seq {8, 16}, and the MLP."""

    def bert(runtime: str, batch: int, seq: int) -> Case:
        return Case("bert-tiny", runtime, batch_size=batch, seq_len=seq)

    return [
        Cell(bert("torch:eager", 1, 8), [0.001]),
        Cell(bert("torch:eager", 1, 16), [0.002]),
        Cell(bert("torch:eager", 2, 8), [0.003]),
        Cell(bert("torch:eager", 2, 16), status="oom", reason="2 GiB"),
        Cell(bert("jax:jit", 1, 8), [0.0005]),
        Cell(bert("jax:jit", 2, 16), [0.004]),
        Cell(Case("mlp", "torch:eager", batch_size=1), [1e-5]),
        Cell(Case("mlp", "torch:eager", batch_size=4), status="error", reason="boom"),
    ]


EXPECTED_SHEETS = {
    "bert-tiny_torch_eager.csv": "batch_size\\seq_len,8,16\n1,0.001,0.002\n2,0.003,N/A\n",
    "bert-tiny_jax_jit.csv": "batch_size\\seq_len,8,16\n1,0.0005,N/A\n2,N/A,0.004\n",  # N/A where not run
    "mlp_torch_eager.csv": "batch_size,median_s\n1,1e-05\n4,N/A\n",
}


def test_spreadsheet_layout_against_a_hand_computed_fixture(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    with Store.open(db) as store:
        add_run(store, sheet_rows())
        results = store.results()
    out = tmp_path / "sheets"
    assert main(["report", "--db", str(db), "--csv", str(out), "--format", "json"]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted([*EXPECTED_SHEETS, "results.csv"])
    for name, text in EXPECTED_SHEETS.items():
        assert (out / name).read_text() == text, name
    assert (out / "results.csv").read_text() == to_csv(results)  # the long format, every result


def test_spreadsheet_names_the_dtype_and_run_when_they_vary() -> None:
    rows = [row(dtype="fp32"), row(dtype="bf16", median_s=1e-5), row(run_id=2, median_s=3e-5)]
    tables = spreadsheet_tables(rows)
    assert sorted(tables) == [
        "mlp_torch_eager_run1_bf16.csv",
        "mlp_torch_eager_run1_fp32.csv",
        "mlp_torch_eager_run2_fp32.csv",
    ]
    assert tables["mlp_torch_eager_run1_bf16.csv"] == [["batch_size", "median_s"], ["2", "1e-05"]]
    assert list(spreadsheet_tables([row(runtime="../../x:y")])) == ["mlp_x_y.csv"]  # store strings stay in DIR


def test_csv_dir_that_is_a_file_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    with Store.open(db) as store:
        add_run(store, sheet_rows())
    assert main(["report", "--db", str(db), "--csv", str(db)]) == 2
    assert capsys.readouterr().err.strip() == f"fwbench: error: --csv {db} is not a folder"
    assert write_csv_dir([], tmp_path / "empty") == [tmp_path / "empty" / "results.csv"]


def comparison_store(path: Path) -> None:
    """torch:eager against jax:jit (2× faster, a tie, a noisy cell) and tensorflow:function (one oom, one error
    whose reason holds markup and a pipe)."""

    def bert(runtime: str, batch: int) -> Case:
        return Case("bert-tiny", runtime, batch_size=batch, seq_len=8)

    parity = {"parity": {"ok": True, "outputs": {"last_hidden_state": {"rel_l2": 3.2e-7, "max_abs": 1e-6}}}}
    with Store.open(path) as store:
        add_run(
            store,
            [
                Cell(bert("torch:eager", 1), timed(2e-3, seed=1), details=parity),
                Cell(bert("torch:eager", 2), timed(4e-3, seed=2)),
                Cell(bert("torch:eager", 4), timed(8e-3, seed=3, noise=0.2)),
                Cell(
                    bert("jax:jit", 1),
                    timed(1e-3, seed=4),
                    details={**parity, "compile_health": {"flags": ["traces +3 in timed loop"]}},
                ),
                Cell(bert("jax:jit", 2), timed(4e-3, seed=5)),
                Cell(bert("jax:jit", 4), timed(4e-3, seed=6)),
                Cell(bert("tensorflow:function", 1), status="oom", reason="resident 2.1 GiB over --memory-limit 2 GiB"),
                Cell(bert("tensorflow:function", 2), status="error", reason="ValueError: [bold]x[/bold] | <b>y</b>"),
                Cell(bert("tensorflow:function", 4), timed(4e-3, seed=7)),
            ],
        )


def test_table_shows_speedups_na_and_the_pair_summary(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    comparison_store(db)
    with Store.open(db, readonly=True) as store:
        rows = store.results()
    console = Console(record=True, width=PIPE_WIDTH)
    print_results(rows, console, title="t")
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= PIPE_WIDTH
    lines = {
        line.split("│")[3].strip() + " b" + line.split("│")[1].strip(): line
        for line in text.splitlines()
        if line.count("│") > 10
    }
    assert (
        "2.0" in lines["jax:jit b1"] and "×" in lines["jax:jit b1"] and "traces +3 in timed loop" in lines["jax:jit b1"]
    )
    assert "≈1.0" in lines["jax:jit b2"]  # a tie: not significant
    assert "N/A oom" in lines["tensorflow:function b1"] and "resident 2.1 GiB" in text
    assert "N/A error" in lines["tensorflow:function b2"] and "[bold]x[/bold]" in text  # markup shown literally
    assert "noisy" in lines["torch:eager b4"] and "baseline" in lines["torch:eager b4"]
    assert "3e-07" in lines["torch:eager b1"] and "3e-07" in lines["torch:eager b2"]  # parity of the pair
    summary = [line for line in text.splitlines() if line.startswith("│ jax:jit") or line.startswith("│ tensorflow")]
    assert len(summary) == 2
    assert "error 1, oom 1" in summary[1] and summary[1].split("│")[2].strip() == "1"  # one cell both ran ok


def test_markdown_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "db.sqlite"
    comparison_store(db)
    assert main(["report", "--db", str(db), "--format", "markdown", "--baseline", "jax:jit"]) == 0
    text = capsys.readouterr().out
    with Store.open(db, readonly=True) as store:
        assert text == markdown_report(store.results(), f"fwbench results in {db}", None, "jax:jit")
    assert text.startswith("### fwbench results in ")
    assert "| batch | seq | runtime | median ±95% CI | vs jax:jit | GFLOP/s |" in text
    assert "|---:|---:|---|---:|---|---:|" in text
    assert "ValueError: \\[bold\\]x\\[/bold\\] \\| &lt;b&gt;y&lt;/b&gt;" in text  # escaped, the table intact
    assert all(line.count("|") - line.count("\\|") == 12 for line in text.splitlines() if line.startswith("| 1 |"))
    assert "### speed-up over jax:jit: geometric mean" in text and "| torch:eager | 3 |" in text
    out = tmp_path / "report.md"
    assert main(["report", "--db", str(db), "--format", "markdown", "--baseline", "jax:jit", "--out", str(out)]) == 0
    assert out.read_text() == text


def test_unknown_baseline_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "db.sqlite"
    comparison_store(db)
    assert main(["report", "--db", str(db), "--baseline", "keras:jax"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "fwbench: error: --baseline keras:jax is not in these results; runtimes there: torch:eager, "
        "jax:jit, tensorflow:function"
    ]


def test_each_phase_gets_the_sections_it_names_and_serving_no_speed_ups(tmp_path: Path) -> None:
    """Inference rows are compared by speed-up; serving rows (phase serving: compared_by_speedup False, its own
    "serving" section) stay out of the summary, the heat maps and the "vs" column, in the tables and on the page,
    whatever runtime is the baseline."""
    from fwbench.report.html import to_html
    from fwbench.report.phases import compared_rows, section_rows, sections_of
    from fwbench.report.table import report_tables

    runtimes = ("torch:eager", "jax:jit")
    cells = [Cell(Case("mlp", rt, batch_size=1), timed(1e-3 * (i + 1), seed=i)) for i, rt in enumerate(runtimes)]
    cells += [
        Cell(Case("mlp", rt, "serving", batch_size=4), timed(2e-3 * (i + 1), seed=10 + i))
        for i, rt in enumerate(("floor:identity", *runtimes))
    ]
    with Store.open(tmp_path / "mixed.db") as store:
        add_run(store, cells)
        rows = store.results()
    assert {r.phase for r in compared_rows(rows)} == {"inference"} and sections_of(rows) == ["serving"]
    assert [r.runtime for r in section_rows(rows, "serving")] == ["floor:identity", *runtimes]
    tables, _ = report_tables(rows)
    summary = [t for t in tables if "speed-up over torch:eager" in (t.title or "")]
    assert len(summary) == 1 and [row[0] for row in summary[0].rows] == ["jax:jit"]  # the floor is never a runtime
    (model,) = [t for t in tables if "vs torch:eager" in t.headers]  # one model: one table, both phases in it
    phase, runtime, vs = (model.headers.index(name) for name in ("phase", "runtime", "vs torch:eager"))
    speedups = {(row[phase], row[runtime]): row[vs] for row in model.rows}
    assert "baseline" in speedups[("inference", "torch:eager")] and "×" in speedups[("inference", "jax:jit")]
    assert {speedups[("serving", rt)] for rt in ("floor:identity", *runtimes)} == {"—"}
    serving_only = [r for r in rows if r.phase == "serving"]
    tables, _ = report_tables(serving_only)
    assert not any("speed-up over" in (t.title or "") for t in tables)
    assert all(not any(h.startswith("vs ") for h in t.headers) for t in tables)
    page = to_html([], serving_only, baseline="torch:eager")
    assert 'id="summary"' not in page and 'id="models"' not in page and "Baseline:" not in page
    mixed = to_html([], rows, baseline="torch:eager")
    assert mixed.count("<img") == 2  # the inference group's heat map and line plot; no serving cell in them
