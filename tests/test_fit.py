"""Phase fit: the seeded dataset, the planner's and the CLI's refusals, the overhead table's arithmetic, and
`fwbench run --phase fit` of the MLP in every fit runtime (3 epochs, 512 samples, batch 64; interleaved,
the default: the runtimes take turns epoch by epoch; two runs, FIT_RUNTIMES: make test's torch, Lightning, JAX and
Keras on JAX, make test-matrix's TensorFlow and Keras on TensorFlow and torch, each with torch:eager) whose stored
cells must agree with torch:eager's manual loop (fwbench.models.fit's tolerance), with every loss falling, and
whose report has the overhead section;
the same for resnet-tiny in five of them (2 epochs, 256 samples, batch 32: batch norm in training mode during
the epochs, the final evaluation on the running statistics; --interleave off: one cell after another; the
matrix's, make test-matrix), run with --fit-logging so Lightning's CSV log and checkpoint are written there, while
the MLP run (without it, in an empty working directory) writes nothing.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from conftest import run_args
from fwbench.spec import Settings, SpecError
from fwbench.store import FitDetails, ResultRecord
from model_checks import reference_outputs

# The MLP's fit runs: make test's (torch's loop and Lightning, JAX's loop and Keras on it) and the matrix's (the
# others); torch:eager's manual loop, the reference, in both.
FIT_RUNTIMES = {
    "default": ("torch:eager", "torch:lightning", "jax:jit", "keras:jax"),
    "matrix": ("torch:eager", "tensorflow:function", "keras:tensorflow", "keras:torch"),
}
MANUAL_LOOPS = ("torch:eager", "tensorflow:function", "jax:jit")
# resnet-tiny runs where its fit code differs: torch's loop and Lightning, TF's and JAX's loops, Keras once
# (the three Keras backends share one model.fit and one BatchNormalization; the MLP runs all three).
# resnet-tiny's fit run, in the matrix (make test-matrix): torch's two loops (Lightning's logging checked on it), and
# TensorFlow's, JAX's and Keras' loops against torch's.
RESNET_FIT_RUNTIMES = ("torch:eager", "torch:lightning", "tensorflow:function", "jax:jit", "keras:jax")
EPOCHS, SAMPLES, BATCH = 3, 512, 64  # 3 epochs: 2 interleaving cycles
RESNET_EPOCHS, RESNET_SAMPLES, RESNET_BATCH = 2, 256, 32


# -- framework-free -------------------------------------------------------------------------------
def test_fit_dataset_is_seeded_and_learnable() -> None:
    from fwbench.models import get_model
    from fwbench.models.fit import make_fit_dataset

    mlp = get_model("mlp")
    a, b, other = (make_fit_dataset(mlp, 256, seed) for seed in (0, 0, 1))
    assert a.size == 256 and a.inputs["x"].shape == (256, 64) and a.labels.dtype == np.int32
    assert np.array_equal(a.labels, b.labels) and np.array_equal(a.inputs["x"], b.inputs["x"])
    assert not np.array_equal(a.labels, other.labels)
    assert len(np.unique(a.labels)) >= 3  # a teacher, not a constant
    with pytest.raises(NotImplementedError, match="bert-tiny has no fit phase yet"):
        make_fit_dataset(get_model("bert-tiny"), 8, 0)


def test_resnet_tiny_fit_dataset_is_labelled_in_chunks_and_resnet50_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from fwbench.models import fit as fit_module
    from fwbench.models import get_model

    resnet = get_model("resnet-tiny")
    monkeypatch.setattr(fit_module, "TEACHER_CHUNK", 16)
    dataset = fit_module.make_fit_dataset(resnet, 40, 0)  # chunks of 16, 16, 8
    assert dataset.inputs["pixel_values"].shape == (40, 3, 64, 64) and dataset.labels.shape == (40,)
    logits = reference_outputs(resnet, resnet.canonical_weights(1), dataset.inputs)["logits"]  # in one piece
    assert np.array_equal(dataset.labels, (logits - logits.mean(axis=0)).argmax(-1))  # centred per class
    assert len(np.unique(dataset.labels)) >= 5  # centred: not one class for most samples, as the raw teacher
    with pytest.raises(NotImplementedError, match="resnet50 has no fit phase"):
        fit_module.make_fit_dataset(get_model("resnet50"), 8, 0)


def _row(runtime: str, median: float, loss: float, accuracy: float = 0.5) -> ResultRecord:
    fit = {
        "loop": "x",
        "epochs": 3,
        "samples": 64,
        "steps_per_epoch": 4,
        "final_loss": loss,
        "final_accuracy": accuracy,
    }
    return ResultRecord.from_row(
        {
            "id": 1,
            "run_id": 1,
            "case_key": runtime,
            "created": "",
            "model": "mlp",
            "phase": "fit",
            "status": "ok",
            "batch_size": 16,
            "seq_len": None,
            "dtype": "fp32",
            "device": "cpu",
            "runtime": runtime,
            "median_s": median,
            "first_call_s": 1.0,
            "samples": [],
            "details": {"fit": fit},
        }
    )


def test_overhead_table_pairs_each_api_with_its_frameworks_manual_loop() -> None:
    from fwbench.report.fit import overhead_tables

    rows = [
        _row("torch:eager", 0.010, 2.0),
        _row("torch:lightning", 0.030, 2.0 * (1 + 5e-4)),
        _row("keras:torch", 0.020, 2.1),
        _row("keras:jax", 0.5, 2.0),
        _row("jax:jit", 0.25, 2.0, 0.52),
    ]
    (table,) = overhead_tables(rows)
    by = {e["runtime"]: e for e in table["rows"]}
    assert [e["runtime"] for e in table["rows"]][:3] == ["torch:eager", "keras:torch", "torch:lightning"]
    assert by["torch:eager"]["is_manual"] and by["torch:eager"]["ratio"] is None
    assert by["torch:lightning"]["ratio"] == pytest.approx(3.0)
    assert by["torch:lightning"]["per-step overhead"] == pytest.approx(0.005)
    assert by["keras:jax"]["manual"] == "jax:jit" and by["keras:jax"]["ratio"] == pytest.approx(2.0)
    assert by["torch:lightning"]["agreement"]["ok"]
    assert not by["keras:torch"]["agreement"]["ok"]  # 5% off torch:eager's loss
    assert not by["jax:jit"]["agreement"]["ok"]  # same loss, accuracy 0.02 off


# -- refusals ---------------------------------------------------------------------------------------
def test_planner_skips_models_and_runtimes_without_fit() -> None:
    from fwbench.runner.planner import build_plan

    plan = build_plan(["mlp", "bert-tiny"], ["torch:eager", "torch:compile"], [64], [8], Settings(), phase="fit")
    assert [(c.model, c.runtime) for c in plan.cases] == [("mlp", "torch:eager")]
    reasons = {(s.case.model, s.case.runtime): s.reason for s in plan.skipped}
    assert reasons[("mlp", "torch:compile")] == "torch:compile has no fit phase yet"
    assert reasons[("bert-tiny", "torch:eager")] == "bert-tiny has no fit phase yet"
    inference = build_plan(["mlp"], ["torch:eager", "torch:lightning"], [2], [], Settings())
    assert [s.reason for s in inference.skipped] == ["torch:lightning has no inference phase yet"]


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (
            ["--models", "bert-tiny", "--runtimes", "torch:eager", "--seq-lens", "8"],
            "no runnable cell: bert-tiny has no fit phase yet",
        ),
        (["--models", "mlp", "--runtimes", "torch:script"], "no runnable cell: torch:script has no fit phase yet"),
        (
            ["--models", "mlp", "--runtimes", "torch:eager", "--batch-sizes", "3"],
            "batch size 3 does not divide the 4096 fit samples",
        ),
        (["--models", "mlp", "--runtimes", "torch:eager", "--epochs", "1"], "epochs must be at least 2"),
        (
            ["--models", "mlp", "--runtimes", "torch:eager", "--dtype", "bf16"],
            "phase fit with dtype 'bf16' cannot be run",
        ),
    ],
)
def test_bad_fit_input_is_a_one_line_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, extra: list[str], fragment: str
) -> None:
    from fwbench.cli import main

    db = tmp_path / "x.db"
    code = main(["run", "--phase", "fit", "--db", str(db), *extra])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err and fragment in lines[0], err
    assert not db.exists()


def test_settings_refuse_one_epoch() -> None:
    with pytest.raises(SpecError, match="epochs must be at least 2"):
        Settings(epochs=1)


def test_planner_runs_resnet_tiny_fit_and_skips_resnet50() -> None:
    from fwbench.runner.planner import build_plan

    plan = build_plan(["resnet-tiny", "resnet50"], ["torch:lightning"], [32], [], Settings(), phase="fit")
    assert [(c.model, c.runtime) for c in plan.cases] == [("resnet-tiny", "torch:lightning")]
    assert "resnet50 has no fit phase" in plan.skipped[0].reason


def test_fit_logging_must_be_a_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from fwbench.cli import main

    a_file = tmp_path / "file"
    a_file.write_text("x")
    code = main(
        run_args(
            *("--phase", "fit", "--models", "mlp", "--runtimes", "torch:lightning", "--fit-logging", str(a_file)),
            db=tmp_path / "x.db",
            threads=None,
        )
    )
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "is not a directory" in err, err
    with pytest.raises(SpecError, match="fit logging must be a directory path"):
        Settings(fit_logging="")


# -- every fit runtime, end to end ------------------------------------------------------------------
@pytest.fixture(scope="module", params=["default", pytest.param("matrix", marks=pytest.mark.matrix)])
def fit_db(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, tuple[str, ...]]:
    """(database, runtimes) of one MLP fit run in FIT_RUNTIMES[part]."""
    from fwbench.cli import main

    runtimes = FIT_RUNTIMES[request.param]
    db = tmp_path_factory.mktemp(f"fit_{request.param}") / "fit.db"
    with pytest.MonkeyPatch.context() as patch:  # the workers' working directory: where Lightning would write
        patch.chdir(db.parent)
        code = main(
            run_args(
                *("--phase", "fit", "--models", "mlp", "--runtimes", ",".join(runtimes)),
                *("--batch-sizes", str(BATCH), "--epochs", str(EPOCHS), "--fit-samples", str(SAMPLES)),
                db=db,
            )
        )
    assert code == 0
    return db, runtimes


@pytest.fixture(scope="module", params=[pytest.param("resnet-tiny", marks=pytest.mark.matrix)])
def resnet_fit(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, tuple[str, ...]]:
    """(database, --fit-logging directory, runtimes) of the resnet-tiny fit run in RESNET_FIT_RUNTIMES (the fixture's
    one parameter marks its tests ``matrix``)."""
    from fwbench.cli import main

    root = tmp_path_factory.mktemp("resnet_fit")
    db, logs = root / "fit.db", root / "lightning"
    code = main(
        run_args(
            *("--interleave", "off"),  # the sequential path (the MLP's run is interleaved)
            *("--phase", "fit", "--models", "resnet-tiny", "--runtimes", ",".join(RESNET_FIT_RUNTIMES)),
            *("--batch-sizes", str(RESNET_BATCH), "--epochs", str(RESNET_EPOCHS), "--fit-samples", str(RESNET_SAMPLES)),
            *("--fit-logging", str(logs)),
            db=db,
        )
    )
    assert code == 0
    return db, logs, RESNET_FIT_RUNTIMES


def _results(db: Path) -> dict[str, ResultRecord]:
    from fwbench.store.db import Store

    with Store.open(db, readonly=True) as store:
        return {r.runtime: r for r in store.results()}


def _fit(row: ResultRecord) -> FitDetails:
    assert row.fit is not None, (row.runtime, row.details)
    return row.fit


@pytest.mark.slow
def test_fit_loops_agree_on_the_mlp(fit_db: tuple[Path, tuple[str, ...]]) -> None:
    from fwbench.models.fit import FIT_ACCURACY_ATOL, FIT_LOSS_RTOL

    db, runtimes = fit_db
    results = _results(db)
    assert set(results) == set(runtimes)
    assert all(r.status == "ok" for r in results.values()), {k: r.reason for k, r in results.items()}
    reference = _fit(results["torch:eager"])
    loops = set()
    for runtime, row in results.items():
        fit = _fit(row)
        loops.add(fit.loop)
        assert fit.samples == SAMPLES and fit.steps_per_epoch == SAMPLES // BATCH
        assert len(fit.epoch_s) == len(fit.epoch_loss) == EPOCHS
        assert row.first_call_s == fit.epoch_s[0] and row.samples == fit.epoch_s[1:]
        assert all(b < a for a, b in zip(fit.epoch_loss, fit.epoch_loss[1:])), (runtime, fit.epoch_loss)
        assert fit.final_loss < fit.epoch_loss[0] and math.isfinite(fit.final_loss)
        rel = abs(fit.final_loss - reference.final_loss) / reference.final_loss
        assert rel <= FIT_LOSS_RTOL, (runtime, fit.final_loss, reference.final_loss)
        assert abs(fit.final_accuracy - reference.final_accuracy) <= FIT_ACCURACY_ATOL, runtime
        # the first epoch's mean loss, before much training, agrees far more tightly
        assert fit.epoch_loss[0] == pytest.approx(reference.epoch_loss[0], rel=1e-5), runtime
    assert "manual DataLoader loop" in loops
    # Keras says whether "auto" compiled: XLA on the tensorflow and jax backends, nothing on torch
    if "keras:jax" in results:
        assert _fit(results["keras:jax"]).loop == "keras model.fit (jit_compile=True)"
    if "keras:torch" in results:
        assert _fit(results["keras:torch"]).loop == "keras model.fit (jit_compile=False)"
    if "torch:lightning" in results:
        assert _fit(results["torch:lightning"]).loop == "lightning Trainer.fit"
        assert _fit(results["torch:lightning"]).extra["torch_threads_after"] == 1  # Lightning kept the budget
        # no --fit-logging: Lightning wrote no log and no checkpoint (the workers ran in the database's directory)
        assert _fit(results["torch:lightning"]).extra["logging"] is None
    assert sorted(p.name for p in db.parent.iterdir() if not p.name.startswith("fit.db")) == []


@pytest.mark.slow
def test_fit_cells_take_turns_epoch_by_epoch(fit_db: tuple[Path, tuple[str, ...]]) -> None:
    """Interleaved: each epoch after the first is one block of one call, the very epoch the loop timed; every
    runtime's epoch of one cycle ran before any runtime's epoch of the next, and no two ran at once."""
    db, runtimes = fit_db
    spans: list[tuple[float, float, int]] = []
    for runtime, row in _results(db).items():
        assert row.schedule == "interleaved" and row.rounds == 1, runtime
        assert [(b.round, b.index, b.cycle, b.calls) for b in row.blocks] == [
            (0, i, i, 1) for i in range(EPOCHS - 1)
        ], runtime
        assert [b.seconds for b in row.blocks] == list(_fit(row).epoch_s[1:]), runtime
        fit = _fit(row)  # its own time excludes the turns it waited for
        assert fit.extra["waited_between_epochs_s"] > 0 and fit.total_s is not None, runtime
        assert fit.total_s >= sum(fit.epoch_s), runtime
        spans += [
            (b.start_unix_s, b.start_unix_s + b.seconds, b.cycle)
            for b in row.blocks
            if b.start_unix_s and b.cycle is not None
        ]
    assert len(spans) == len(runtimes) * (EPOCHS - 1)
    spans.sort()
    assert all(end <= following for (_, end, _), (following, _, _) in zip(spans, spans[1:]))
    assert [cycle for _, _, cycle in spans] == sorted(cycle for _, _, cycle in spans)


class _ManagerSide:
    """What EpochBlocks talks to in a worker (its Cell), with the manager's commands scripted."""

    def __init__(self, commands: list[str]) -> None:
        self.commands = list(commands)
        self.sent: list[tuple[str, dict[str, object]]] = []

    def send(self, kind: str, **fields: object) -> None:
        self.sent.append((kind, fields))

    def await_command(self) -> dict[str, str]:
        return {"command": self.commands.pop(0)}


def test_epoch_blocks_serve_the_managers_commands_between_epochs() -> None:
    from fwbench.runner.phases.fit import EpochBlocks

    manager = _ManagerSide(["calibrate", "block", "block", "finish"])
    blocks = EpochBlocks(manager, 3)  # type: ignore[arg-type]
    for seconds in (0.5, 0.2, 0.3):  # what the loop timed, epoch by epoch
        blocks(seconds)
    blocks.check_finished("fake:fit")
    assert [kind for kind, _ in manager.sent] == ["ready", "calibrated", "block", "block"]
    assert manager.sent[1][1] == {"calls_per_block": 1, "block_s": 0.5}
    assert [(f["seconds"], f["calls"]) for kind, f in manager.sent if kind == "block"] == [(0.2, 1), (0.3, 1)]
    assert not manager.commands and blocks.waited_s >= 0
    early = EpochBlocks(_ManagerSide(["calibrate", "finish"]), 3)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="after epoch 1 of 3 the manager sent 'finish'"):
        early(0.5)
    skipped = EpochBlocks(_ManagerSide(["calibrate", "block"]), 3)  # type: ignore[arg-type]
    skipped(0.5)  # a loop that then never calls epoch_end again
    with pytest.raises(RuntimeError, match="fake:fit's fit loop called epoch_end 1 times for 3 epochs"):
        skipped.check_finished("fake:fit")


@pytest.mark.slow
def test_fit_loops_agree_on_resnet_tiny(resnet_fit: tuple[Path, Path, tuple[str, ...]]) -> None:
    from fwbench.models.fit import fit_tolerance

    rtol, atol = fit_tolerance("resnet-tiny")
    db, _, runtimes = resnet_fit
    results = _results(db)
    assert set(results) == set(runtimes)
    assert all(r.status == "ok" for r in results.values()), {k: r.reason for k, r in results.items()}
    reference = _fit(results["torch:eager"])
    for runtime, row in results.items():
        fit = _fit(row)
        assert row.schedule == "sequential" and [b.cycle for b in row.blocks] == [None] * (RESNET_EPOCHS - 1)
        assert fit.samples == RESNET_SAMPLES and len(fit.epoch_loss) == RESNET_EPOCHS
        assert fit.epoch_loss[1] < fit.epoch_loss[0] and math.isfinite(fit.final_loss), runtime
        rel = abs(fit.final_loss - reference.final_loss) / reference.final_loss
        assert rel <= rtol, (runtime, fit.final_loss, reference.final_loss)
        assert abs(fit.final_accuracy - reference.final_accuracy) <= atol, runtime
        # epoch 1's mean training loss (batch norm on batch statistics) agrees far more tightly
        assert fit.epoch_loss[0] == pytest.approx(reference.epoch_loss[0], rel=1e-4), runtime


@pytest.mark.slow
def test_fit_logging_writes_lightnings_log_and_checkpoint(resnet_fit: tuple[Path, Path, tuple[str, ...]]) -> None:
    db, logs, _ = resnet_fit
    logging = _fit(_results(db)["torch:lightning"]).extra["logging"]
    version = Path(logging["log_dir"])
    assert version.parent == logs / f"resnet-tiny-b{RESNET_BATCH}" and version.name == "version_0"
    header, *rows = (version / "metrics.csv").read_text().splitlines()
    assert "train_loss_epoch" in header.split(",") and "epoch" in header.split(",")
    assert len([r for r in rows if r.split(",")[header.split(",").index("train_loss_epoch")]]) == RESNET_EPOCHS
    steps = RESNET_EPOCHS * RESNET_SAMPLES // RESNET_BATCH
    checkpoint = Path(logging["checkpoint"])
    assert checkpoint.parent == version / "checkpoints"
    assert checkpoint.name == f"epoch={RESNET_EPOCHS - 1}-step={steps}.ckpt"
    assert checkpoint.stat().st_size > 0
    # only torch:lightning writes there: one model × batch directory, nothing else
    assert [p.name for p in logs.iterdir()] == [f"resnet-tiny-b{RESNET_BATCH}"]


@pytest.mark.slow
def test_fit_report_has_the_overhead_section(
    fit_db: tuple[Path, tuple[str, ...]], capsys: pytest.CaptureFixture[str]
) -> None:
    from fwbench.cli import main

    db, runtimes = fit_db
    assert main(["report", "--db", str(db), "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "phase fit: high-level API vs manual loop, mlp" in out
    section = out.split("phase fit: high-level API vs manual loop")[1]
    for runtime in runtimes:
        assert runtime in section
    assert section.count("| manual loop |") == len(set(MANUAL_LOOPS) & set(runtimes))
    assert "| ✗ |" not in section and section.count("| ✓ |") == len(runtimes)
