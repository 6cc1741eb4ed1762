"""``fwbench profile`` end to end: every framework's profiler in a fresh worker (torch's, TensorFlow's and JAX's on
the mlp and bert-tiny, the compiled modes and Keras on the mlp), the tables it prints, the profile run in the store
(never among benchmark results), ``report --profile``. ``make test`` profiles torch:eager on the mlp; its bert-tiny,
the other frameworks and modes, and a runtime without a profiler are the matrix's (``make test-matrix``). The
commands run in this process (``fwbench.cli.main``: no interpreter to start); each profiled cell's worker is a process
of its own all the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import fwbench_here, require
from fwbench.cli import main
from fwbench.profile.categories import CATEGORIES
from fwbench.profile.cells import ProfiledCell
from fwbench.profile.summary import OpRow, ProfileSummary
from fwbench.spec import Case, Plan, Settings
from fwbench.store import ProfileRecord, Store
from headless_chromium import chromium_path, inspect_page

# One framework's profiler in the default run; the other frameworks' (TensorFlow, JAX) on both models, the compiled
# modes (torch:compile, tensorflow:xla) and Keras on each backend on the MLP, under the matrix marker.
DEFAULT_RUNTIMES = ("torch:eager",)
MATRIX_RUNTIMES = ("tensorflow:function", "jax:jit")
MATRIX_MLP_RUNTIMES = ("torch:compile", "tensorflow:xla", "keras:tensorflow", "keras:jax", "keras:torch")
NO_PROFILER = "onnxruntime:torch"  # an engine: fwbench profiles no engine
XLA_RUNTIMES = {"tensorflow:xla", "jax:jit", "keras:jax"}  # one compiled program of fusions and library calls
CLOCK_SLACK_S = 1e-4  # the profiler's clock against the worker's perf_counter, per call


def profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], runtimes: tuple[str, ...], models: str = "mlp,bert-tiny"
) -> list[ProfileRecord]:
    db, out = tmp_path / "p.db", tmp_path / "traces"
    code, stdout, stderr = fwbench_here(
        capsys,
        "profile",
        *("--models", models, "--runtimes", ",".join(runtimes)),
        *("--batch-sizes", "2", "--seq-lens", "16", "--threads", "1", "--calls", "2"),
        *("--db", str(db), "--out", str(out)),
    )
    assert code == 0, stderr
    assert "overhead (wall − busy)" in stdout and "top 10 ops" in stdout, stdout
    with Store.open(db, readonly=True) as store:
        assert store.results() == [] and store.latest_run_id() is None  # never benchmark results
        (run,) = store.runs()
        assert run.kind == "profile" and store.latest_run_id("profile") == run.id
        return store.profiles([run.id])


def check_profiles(
    records: list[ProfileRecord],
    runtimes: tuple[str, ...],
    tmp_path: Path,
    models: tuple[str, ...] = ("mlp", "bert-tiny"),
) -> None:
    assert {(r.model, r.runtime) for r in records} == {(m, rt) for m in models for rt in runtimes}
    for record in records:
        assert record.status == "ok", (record.runtime, record.model, record.reason)
        cell = record.cell
        assert cell is not None and cell.summary.calls == 2
        summary = cell.summary
        assert summary.ops, (record.runtime, record.model)  # a non-empty op table
        assert 0 < summary.busy_s <= summary.wall_s + CLOCK_SLACK_S, summary
        assert summary.overhead_s == pytest.approx(max(0.0, summary.wall_s - summary.busy_s))
        assert sum(summary.categories_s.values()) == pytest.approx(sum(op.self_s_per_call for op in summary.ops))
        assert cell.unprofiled_median_s > 0 and cell.profiled_median_s > 0
        assert Path(cell.trace).is_file() and Path(cell.trace).is_relative_to(tmp_path / "traces" / record.model)
        if record.runtime not in XLA_RUNTIMES:  # runtimes whose ops the profiler sees one by one: matmuls too
            assert summary.categories_s["matmul/conv"] > 0, summary.ops


@pytest.mark.parametrize(
    "model",
    ["mlp", pytest.param("bert-tiny", marks=pytest.mark.matrix)],  # make test: torch's profiler, on the mlp
)
def test_torch_profiles_the_mlp_and_bert_tiny(tmp_path: Path, capsys: pytest.CaptureFixture[str], model: str) -> None:
    records = profile(tmp_path, capsys, DEFAULT_RUNTIMES, models=model)
    check_profiles(records, DEFAULT_RUNTIMES, tmp_path, models=(model,))
    # the tables again, from the store
    page = tmp_path / "profiles.html"
    code, _, err = fwbench_here(
        capsys,
        *("report", "--profile", "--db", str(tmp_path / "p.db"), "--html", str(page), "--out", str(tmp_path / "p.txt")),
    )
    assert code == 0, err
    text = (tmp_path / "p.txt").read_text()
    assert "profiler overhead" in text and all(runtime in text for runtime in DEFAULT_RUNTIMES) and model in text
    html = page.read_text()
    assert "<h2>Profiles side by side</h2>" in html and html.count("top ops by self time") == len(records)
    code, _, err = fwbench_here(capsys, "report", "--db", str(tmp_path / "p.db"), "--run", "1")
    assert code == 2 and "is a profile run, not a benchmark run" in err


@pytest.mark.matrix
def test_the_other_frameworks_compiled_modes_and_keras_profile_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """TensorFlow's and JAX's profilers on both models, the compiled modes and Keras on the MLP; in the same sweep a
    runtime without a profiler (onnxruntime:torch) is an error and the sweep goes on."""
    require("onnxruntime")
    for folder in ("both", "mlp"):
        (tmp_path / folder).mkdir()
    records = profile(tmp_path / "both", capsys, MATRIX_RUNTIMES)
    check_profiles(records, MATRIX_RUNTIMES, tmp_path / "both")
    records = profile(tmp_path / "mlp", capsys, (NO_PROFILER, *MATRIX_MLP_RUNTIMES), models="mlp")
    (without,) = [record for record in records if record.runtime == NO_PROFILER]
    assert without.status == "error" and "has no profiler in fwbench" in (without.reason or ""), without.reason
    profiled = [record for record in records if record.runtime != NO_PROFILER]
    check_profiles(profiled, MATRIX_MLP_RUNTIMES, tmp_path / "mlp", models=("mlp",))


def stored_profile_run(path: Path, matmul_s: float = 3e-4) -> ProfiledCell:
    """A profile run in the store at ``path`` with two cells: one profiled (returned; its matmuls take
    ``matmul_s`` per call), one timed out."""
    ops = [OpRow("aten::addmm", "matmul/conv", 2.0, matmul_s), OpRow("MyOp", "other", 1.0, 1e-5)]
    categories = dict.fromkeys(CATEGORIES, 0.0) | {"matmul/conv": matmul_s, "other": 1e-5}
    busy = matmul_s + 1e-5
    summary = ProfileSummary(2, busy + 1.9e-4, busy, 0.0, 1.9e-4, categories, ops, ["MyOp"])
    cell = ProfiledCell(summary, "/t/trace.json", "torch.profiler", 4e-4, 5e-4, "by op")
    case = Case("mlp", "torch:eager", batch_size=2)
    with Store.open(path) as store:
        run = store.create_run(Plan((case,), Settings()), "fwbench profile", {}, "0", kind="profile")
        store.add_profile(run, case, "ok", None, cell, {"profile": {"calls": 2}})
        store.add_profile(run, Case("mlp", "jax:jit", batch_size=2), "timeout", "over 600 s", None, {})
    return cell


def test_store_round_trip(tmp_path: Path) -> None:
    cell = stored_profile_run(tmp_path / "s.db")
    with Store.open(tmp_path / "s.db", readonly=True) as store:
        ok, timed_out = store.profiles()
    assert ok.cell == cell and ok.details == {"profile": {"calls": 2}}
    assert timed_out.cell is None and timed_out.status == "timeout" and timed_out.reason == "over 600 s"
    assert cell.profiler_overhead == pytest.approx(0.25)


def test_report_profile_prints_and_its_page_renders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "s.db"
    stored_profile_run(db)
    assert main(["report", "--profile", "--db", str(db)]) == 0
    text = capsys.readouterr().out
    assert "mlp inference fp32 cpu, batch 2" in text and "timeout: over 600 s" in text
    assert "torch:eager: in 'other': MyOp" in text and "+25%" in text  # the profiler overhead
    assert main(["report", "--profile", "--db", str(db), "--format", "csv"]) == 2
    assert "--profile prints tables (--out, --html); it does not take --format" in capsys.readouterr().err
    page = tmp_path / "profiles.html"
    assert main(["report", "--profile", "--db", str(db), "--html", str(page)]) == 0
    if chromium_path() is None:
        pytest.skip("chromium is not installed (make test installs it): the page was written, not rendered")
    rendered = inspect_page(page, tmp_path / "profiles.png", str(chromium_path()))
    assert rendered.errors == [] and rendered.title == "fwbench profiles"
    assert "Profiles side by side" in rendered.body_text and "aten::addmm" not in rendered.body_text  # folded
    assert "torch:eager" in rendered.body_text and "timeout: over 600 s" in rendered.body_text


def test_compare_profile_runs_category_by_category(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / ("a-folder-with-a-long-name-" * 6) / "s.db"  # longer than any console is wide, whatever TMPDIR
    stored_profile_run(db)  # run 1
    stored_profile_run(db, matmul_s=6e-4)  # run 2: twice the matmul time
    assert main(["compare", "--profile", "1", "latest", "--db", str(db)]) == 0
    text = capsys.readouterr().out
    assert "mlp inference fp32 cpu, batch 2" in text and "torch:eager" in text
    assert "300 µs → 600 µs (2.00×)" in text  # matmul/conv
    # no profile in either run: one line, never broken where the database's path happens to end
    assert f"not compared, in run 1 of {db}: mlp inference fp32 cpu, batch 2: jax:jit (timeout)\n" in text
    assert "no CI" in text
    assert main(["compare", "--profile", "1", "2", "--db", str(db), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (cell,) = data["cells"]
    assert cell["runtime"] == "torch:eager"
    assert cell["seconds"]["matmul/conv"] == {"a": pytest.approx(3e-4), "b": pytest.approx(6e-4)}
    # a profile run is not a benchmark run, and the other way round: one line, exit 2
    assert main(["compare", "1", "2", "--db", str(db)]) == 2
    assert "is a profile run, not a benchmark run" in capsys.readouterr().err
    assert main(["compare", "--profile", "1", "3", "--db", str(db)]) == 2
    assert "RUN_B 3 is not in" in capsys.readouterr().err
