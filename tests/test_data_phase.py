"""``fwbench run --phase data``: the plan (dataset as model, workers as a grid axis), bad input, the three loaders
end to end in fresh workers (their batches, worker processes that end), corrupt images, a killed cell whose
loader workers die with it, and fits that read the images through a loader. ``make test`` runs the three loaders
with a worker each, kills a DataLoader cell and fits through torch's loader; the loaders without worker processes,
corrupt images, Grain's killed cell and the other frameworks' fits are the matrix's (``make test-matrix``). The
commands run in this process (``fwbench.cli.main``: no interpreter to start) except where the test is about the
processes a run leaves; each cell's worker is a process of its own all the same."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import uuid
from collections.abc import Mapping
from pathlib import Path

import psutil
import pytest

from conftest import fwbench_here, marked_processes_left, run_args, run_cli
from fwbench.datasets import images
from fwbench.runner.phases import check_case
from fwbench.runner.planner import PlanChoices, resolve_plan, suite_plan
from fwbench.spec import Case, Settings, SpecError
from fwbench.suites import load_suite

LOADERS = ("torch:dataloader", "tensorflow:data", "grain:dataloader")
TINY = ("--crop", "16", "--data-batches", "8", "--batch-sizes", "4", "--rounds", "1", "--threads", "1")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("data") / "images-48"
    images.make_images(folder, n=12, size=48, seed=3)
    return folder


def _rows(db: Path) -> list[dict[str, object]]:
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(row) for row in conn.execute("SELECT * FROM results ORDER BY id")]


def test_a_data_case_has_a_worker_count_and_only_a_data_case() -> None:
    case = Case("images-256", "torch:dataloader", "data", 32, workers=2)
    assert case.key.endswith("|w2") and "w=2" in case.label()
    assert Case("mlp", "torch:eager").key == "mlp|torch:eager|inference|1|-|fp32|cpu"  # other keys unchanged
    with pytest.raises(SpecError, match="^a worker count belongs to phase data cells, and every one of them has one$"):
        check_case(Case("images-256", "torch:dataloader", "data", 32), Settings())
    with pytest.raises(SpecError, match="^a worker count belongs to phase data cells"):
        check_case(Case("mlp", "torch:eager", workers=1), Settings())
    with pytest.raises(SpecError):
        Case("images-256", "torch:dataloader", "data", 32, workers=-1)


def test_the_plan_takes_the_dataset_as_model_and_workers_as_an_axis(dataset: Path) -> None:
    plan = resolve_plan(
        PlanChoices(
            runtimes=",".join(LOADERS),
            batch_sizes="4,8",
            workers="0,2",
            phase="data",
            settings={"data_input": str(dataset)},
        )
    )
    assert len(plan.cases) == 3 * 2 * 2
    assert {case.model for case in plan.cases} == {"images-48"}
    assert {case.workers for case in plan.cases} == {0, 2}
    assert plan.settings.data_input == str(dataset.resolve())
    default = resolve_plan(PlanChoices(phase="data", settings={"data_input": str(dataset)}))  # no --runtimes
    assert {case.runtime for case in default.cases} == set(LOADERS) and {c.batch_size for c in default.cases} == {32}
    with pytest.raises(SpecError, match="phase data reads one dataset, images-48"):
        resolve_plan(
            PlanChoices(models="images-256", runtimes=LOADERS[0], phase="data", settings={"data_input": str(dataset)})
        )


def test_the_data_suite_plans_three_loaders_at_three_worker_counts_and_a_fit_per_framework() -> None:
    plan = suite_plan(load_suite("data"), threads=2)
    data = [case for case in plan.cases if case.phase == "data"]
    assert {(case.runtime, case.workers) for case in data} == {(r, w) for r in LOADERS for w in (0, 1, 2)}
    assert len(data) == 9 and {case.model for case in data} == {"images-256"}
    fits = [case for case in plan.cases if case.phase == "fit"]
    assert {case.runtime for case in fits} == {"torch:eager", "tensorflow:function", "jax:jit"}
    assert {case.model for case in fits} == {"resnet-tiny"} and {case.batch_size for case in plan.cases} == {32}
    assert plan.settings.fit_source == "input" and plan.settings.data_input is not None
    # --workers replaces the data grids' axis only (the fit grid has none)
    flagged = resolve_plan(PlanChoices(suite="data", workers="0,4"))
    assert {case.workers for case in flagged.cases if case.phase == "data"} == {0, 4}
    with pytest.raises(SpecError, match="suite quick has no data grid"):
        resolve_plan(PlanChoices(suite="quick", workers="1"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--workers", "-1"), "--workers '-1': every value must be an integer from 0"),
        (("--input", "/nonexistent/fwbench-data"), "no such folder"),
        (("--workers", "1", "--phase", "inference", "--models", "mlp"), "--workers (loader worker processes) is for"),
    ],
)
def test_bad_data_input_is_one_line_and_exit_2(
    tmp_path: Path, dataset: Path, args: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["run", "--phase", "data", "--runtimes", LOADERS[0], "--db", str(tmp_path / "x.db")]
    if "--input" not in args:
        base += ["--input", str(dataset)]
    code, _, err = fwbench_here(capsys, *base, *args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], err
    assert not (tmp_path / "x.db").exists()  # nothing written


def test_a_text_dataset_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fwbench.datasets import text

    text.make_text(tmp_path / "lines", n=4)
    db = tmp_path / "x.db"
    code, _, err = fwbench_here(
        capsys, "run", "--phase", "data", "--runtimes", LOADERS[0], "--input", str(tmp_path / "lines"), "--db", str(db)
    )
    assert code == 2 and "a text dataset; phase data reads images" in err


@pytest.mark.slow
@pytest.mark.parametrize(
    "workers",
    [1, pytest.param(0, marks=pytest.mark.matrix)],  # make test: with a worker (processes, or tf.data's threads)
    ids=["one-worker", "in-process"],
)
def test_the_three_loaders_run_end_to_end_and_their_workers_end(
    tmp_path: Path, dataset: Path, capsys: pytest.CaptureFixture[str], workers: int
) -> None:
    db = tmp_path / "d.db"
    code, _, err = fwbench_here(
        capsys,
        "run", "--phase", "data", "--runtimes", ",".join(LOADERS), "--workers", str(workers), "--input",
        str(dataset), "--transform", "center-crop", "--db", str(db), *TINY,
    )  # fmt: skip
    assert code == 0, err[-3000:]
    rows = _rows(db)
    assert len(rows) == 3 and {row["status"] for row in rows} == {"ok"}, [row["reason"] for row in rows]
    assert {int(str(row["workers"])) for row in rows} == {workers}
    sums = {}
    for row in rows:
        data = json.loads(str(row["details_json"]))["data"]
        runtime, workers = str(row["runtime"]), int(str(row["workers"]))
        assert row["model"] == "images-48" and row["phase"] == "data" and row["flops"] is None
        assert len(json.loads(str(row["samples_json"]))) == 8 and row["calls_per_sample"] == 1
        assert data["timed_batches"] == 8 and data["warmup_batches"] >= max(2, 2 * workers)  # and ≥ 1 s
        layout = json.loads(str(row["details_json"]))["layout"]
        assert data["first_batch"]["shape"] == ([4, 3, 16, 16] if layout == "NCHW" else [4, 16, 16, 3])
        assert data["first_batch"]["dtype"] == "float32"
        # tf.data's workers are threads; the other loaders' are processes, all gone once the cell ended
        assert data["worker_processes"] == (0 if runtime == "tensorflow:data" else workers)
        assert len(data["worker_pids"]) == data["worker_processes"] and data["workers_left_running"] == 0
        assert not any(
            psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie" for pid in data["worker_pids"]
        )
        assert data["pss_peak_bytes"]["total"] >= data["pss_peak_bytes"]["parent"] > 0
        assert (data["pss_peak_bytes"]["workers"] > 0) == (data["worker_processes"] > 0)
        # CPU time comes in clock ticks (10 ms): 8 tiny batches may take less than one, so only its sign is certain
        assert data["cpu_cores_busy"] >= 0 and data["cpu_s"] >= 0 and data["corrupt_files"] == 0
        assert 0 < float(str(row["first_call_s"])) < 300  # the time to the first batch
        sums[runtime] = data["first_batch"]["sum"]
    # center-crop, the files in order (each loader keeps their order, however many workers): the same 4 images in
    # every loader; a sum does not depend on the layout
    values = list(sums.values())
    assert max(values) - min(values) <= 1e-3 * 4 * 16 * 16 * 3, sums
    code, out, _ = fwbench_here(capsys, "report", "--db", str(db), "--run", "latest")
    assert code == 0 and "workers" in out and "images-48" in out


@pytest.mark.slow
@pytest.mark.matrix
def test_a_corrupt_image_fails_the_cell_naming_it_unless_skipped(tmp_path: Path, dataset: Path) -> None:
    folder = tmp_path / "broken"
    shutil.copytree(dataset, folder)
    bad = images.read_labels(folder)[5][0]
    (folder / bad).write_bytes(b"\xff\xd8\xff\xe0 not a JPEG at all")
    common = ("run", "--phase", "data", "--runtimes", LOADERS[0], "--input", str(folder), *TINY)
    done = run_cli(*common, "--db", str(tmp_path / "a.db"))
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = _rows(tmp_path / "a.db")
    assert row["status"] == "error" and bad in str(row["reason"]) and "--skip-corrupt" in str(row["reason"])
    done = run_cli(*common, "--skip-corrupt", "--db", str(tmp_path / "b.db"))
    (row,) = _rows(tmp_path / "b.db")
    assert row["status"] == "ok", row["reason"]
    data = json.loads(str(row["details_json"]))["data"]
    assert data["corrupt_files"] == 1 and data["corrupt"][0]["file"] == bad


@pytest.mark.slow
@pytest.mark.parametrize("loader", ["torch:dataloader", pytest.param("grain:dataloader", marks=pytest.mark.matrix)])
def test_a_killed_data_cell_leaves_no_loader_process(tmp_path: Path, dataset: Path, loader: str) -> None:
    marker = uuid.uuid4().hex
    env = {**os.environ, "FWBENCH_TEST_MARKER": marker}  # every process the run starts inherits it
    done = run_cli(
        *run_args(
            "--phase", "data", "--runtimes", loader, "--workers", "2", "--input", str(dataset),
            "--crop", "16", "--batch-sizes", "4", "--data-batches", "100000000", "--timeout", "8",
            db=tmp_path / "k.db", threads=None, max_time=1,
        ),
        env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = _rows(tmp_path / "k.db")
    assert row["status"] == "timeout"
    assert marked_processes_left(marker) == []


def _fit_from_images(
    tmp_path: Path, dataset: Path, runtimes: Mapping[str, str | None], models: str, capsys: pytest.CaptureFixture[str]
) -> dict:
    """Run ``--phase fit --input`` for ``runtimes`` (runtime → the loader its fit reads, None: skipped) and check
    each fit's record; returns the rows by (model, runtime)."""
    db = tmp_path / "f.db"
    code, _, err = fwbench_here(
        capsys,
        *run_args(
            "--phase", "fit", "--input", str(dataset), "--models", models, "--runtimes", ",".join(runtimes),
            "--batch-sizes", "4", "--epochs", "2", db=db,
        ),
    )  # fmt: skip
    assert code == 0, err[-3000:]
    rows = {(row["model"], row["runtime"]): row for row in _rows(db)}
    for runtime, loader in runtimes.items():
        row = rows[("resnet-tiny", runtime)]
        if loader is None:
            assert row["status"] == "skipped" and "does not read --input images" in str(row["reason"])
            continue
        assert row["status"] == "ok", row["reason"]
        fit = json.loads(str(row["details_json"]))["fit"]
        assert fit["source"] == "input" and fit["samples"] == 12 and fit["steps_per_epoch"] == 3
        waits = fit["input"]
        assert waits["loader"] == loader and waits["crop"] == 64 and waits["workers"] == 1
        assert waits["workers_left_running"] == 0  # the loader's worker processes ended with the fit
        assert fit["final_loss"] > 0 and 0 <= fit["final_accuracy"] <= 1 and len(fit["epoch_s"]) == 2
        if runtime.startswith("keras:"):  # model.fit fetches inside its own step: no separate wait
            assert waits["wait_fraction"] is None and "not separable" in waits["measured_as"]
            continue
        pairs = zip(waits["epoch_wait_s"], fit["epoch_s"])
        assert len(waits["epoch_wait_s"]) == 2 and all(0 <= wait <= epoch for wait, epoch in pairs)
        assert 0 <= waits["wait_fraction"] <= 1
    return rows


@pytest.mark.slow
@pytest.mark.parametrize(
    "loops",
    [
        {"torch:eager": "torch:dataloader"},
        pytest.param(
            {"tensorflow:function": "tensorflow:data", "jax:jit": "grain:dataloader"}, marks=pytest.mark.matrix
        ),
    ],
    ids=["torch", "tensorflow-jax"],
)
def test_fit_reads_the_images_through_each_frameworks_loader(
    tmp_path: Path, dataset: Path, loops: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """resnet-tiny fits from the dataset's images (cropped to its 64 px) through DataLoader, tf.data and Grain
    in the manual loops, each saying how long it waited for data; a model that takes no images is skipped."""
    rows = _fit_from_images(tmp_path, dataset, loops, "resnet-tiny,mlp", capsys)
    assert {rows[("mlp", runtime)]["status"] for runtime in loops} == {"skipped"}


@pytest.mark.slow
@pytest.mark.matrix
def test_the_high_level_fit_apis_read_the_images_too(
    tmp_path: Path, dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    apis = {
        "torch:lightning": "torch:dataloader",
        "keras:tensorflow": "tensorflow:data",
        "keras:jax": "grain:dataloader",
        "keras:torch": None,
    }
    _fit_from_images(tmp_path, dataset, apis, "resnet-tiny", capsys)


def _data_store(path: Path, inference: bool = False) -> Path:
    """A run of three loaders at 0, 1 and 2 workers (batch 32), three rounds each, torch:dataloader slowest
    (``inference``: and mlp in torch:eager and jax:jit, jax twice as fast)."""
    from fwbench.runner.scheduler import group_key
    from fwbench.spec import Plan, Settings
    from fwbench.store import Store
    from report_store import blocks_of

    cases = [Case("images-256", loader, "data", 32, workers=w) for loader in LOADERS for w in (0, 1, 2)]
    cases += [Case("mlp", runtime) for runtime in ("torch:eager", "jax:jit")] if inference else []
    speed = {"torch:dataloader": 1.0, "tensorflow:data": 0.5, "grain:dataloader": 0.8, "torch:eager": 1, "jax:jit": 0.5}
    with Store.open(path) as store:
        run_id = store.create_run(Plan(tuple(cases), Settings(threads=2)), "fwbench run --suite data", {}, "0")
        for case in cases:
            median = 0.1 * speed[case.runtime] / (1 + (case.workers or 0))
            samples = [median * (1 + 0.001 * i) for i in range(24)]
            fields = {
                "status": "ok",
                "median_s": median,
                "first_call_s": 0.2,
                "calls_per_sample": 8,
                "group_key": group_key(case),
                "schedule": "sequential",
                "rounds": 3,
            }
            store.add_result(
                run_id, case, fields, samples, {"data": {"workers_left_running": 0}}, blocks_of(samples, 3, 8)
            )
        store.finish_run(run_id)
    return path


def test_reports_show_the_worker_count_of_data_cells(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fwbench.report.export import spreadsheet_tables, to_csv
    from fwbench.report.html import to_html
    from fwbench.speedups import compare_cells
    from fwbench.store import Store

    with Store.open(_data_store(tmp_path / "d.db"), readonly=True) as store:
        results = store.results()
        page = to_html(store.runs(), results, baseline="torch:dataloader", source="d.db")
    cells = compare_cells(results, "torch:dataloader", "tensorflow:data")
    assert len(cells) == 3 and [c.workers for c in cells] == [0, 1, 2]  # matched worker count by worker count
    assert all(c.ratio == pytest.approx(2.0) for c in cells)
    assert "<th>workers</th>" in page and page.count("<img") == 2  # the full table's column; heat map, lines
    tables = spreadsheet_tables(results)
    assert tables["images-256_tensorflow_data.csv"][0] == ["batch_size\\workers", "0", "1", "2"]
    assert to_csv(results).splitlines()[0].split(",")[:7] == [
        "run_id", "model", "runtime", "phase", "batch_size", "seq_len", "workers",
    ]  # fmt: skip
    code, out, _ = fwbench_here(capsys, "report", "--db", str(tmp_path / "d.db"), "--run", "latest")
    assert code == 0 and "workers" in out and "phase data" in out
    assert "2.00×" in out and "cores busy" in out and "PSS (workers)" in out


def test_a_fit_from_the_default_images_writes_them_first(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`--phase fit --fit-source input` without --input reads the default dataset: run writes it if missing, as for
    phase data; a fit's FLOPs are unknown (None), not a crash, when the folder cannot be read."""
    import fwbench.cli.run as run_cli_module
    from fwbench.models import get_model
    from fwbench.runner.phases import get_phase

    monkeypatch.setenv("FWBENCH_DATA_CACHE", str(tmp_path / "cache"))
    written: list[Path] = []
    monkeypatch.setattr(run_cli_module, "ensure_default", written.append)
    plan = resolve_plan(
        PlanChoices(models="resnet-tiny", runtimes="torch:eager", phase="fit", settings={"fit_source": "input"})
    )
    run_cli_module.check_dataset(plan)
    assert written == [tmp_path.joinpath("cache").resolve() / "images-256-n2048-seed0"]
    case = plan.cases[0]
    assert get_phase("fit").flops_per_call(get_model("resnet-tiny"), case, plan.settings) is None  # not written


def test_loaders_beside_other_phases_are_compared_with_their_own_baseline(tmp_path: Path) -> None:
    """A run with torch:eager rows and data rows: the report's default baseline (torch:eager) has no data cell,
    so the loaders are compared with their first, torch:dataloader; an asked-for baseline is kept strictly."""
    from fwbench.report.table import report_tables
    from fwbench.speedups import grouped_pairs
    from fwbench.store import Store

    with Store.open(_data_store(tmp_path / "d.db", inference=True), readonly=True) as store:
        results = store.results()
    pairs = grouped_pairs(results, "torch:eager", fallback=True)
    assert {(p.phase, p.baseline, p.summary.runtime) for p in pairs} == {
        ("inference", "torch:eager", "jax:jit"),
        ("data", "torch:dataloader", "tensorflow:data"),
        ("data", "torch:dataloader", "grain:dataloader"),
    }
    assert {p.phase for p in grouped_pairs(results, "torch:eager")} == {"inference"}  # asked for: strict
    tables, _ = report_tables(results)
    headers = {table.title: table.headers for table in tables}
    assert any("vs torch:dataloader" in h for title, h in headers.items() if title and "images-256" in title)
    assert sum(1 for title in headers if title and title.startswith("speed-up over")) == 2
