"""--tensorboard: event files written by tensorboardX, read back with TensorBoard's own event reader;
per-step losses of training cells; samples/s and tokens/s of training cells in the reports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import fwbench_here, run_args
from fwbench.cli import main
from fwbench.spec import Case
from fwbench.store import Store
from report_store import Cell, add_run, timed


def read_run(folder: Path) -> Any:
    """TensorBoard's EventAccumulator over one run directory, every event kept."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    accumulator = ea.EventAccumulator(str(folder), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    accumulator.Reload()
    return accumulator


def scalars(accumulator: Any, tag: str) -> tuple[list[int], list[float]]:
    events = accumulator.Scalars(tag)
    return [e.step for e in events], [e.value for e in events]


def text(accumulator: Any, tag: str) -> str:
    """The text TensorBoard's text plugin shows for ``tag`` (tensorboardX stores it as ``<tag>/text_summary``)."""
    (event,) = accumulator.Tensors(f"{tag}/text_summary")
    return b"".join(event.tensor_proto.string_val).decode()


# -- a real training sweep, written as it runs ---------------------------------------------------
@pytest.mark.slow
def test_training_sweep_writes_tensorboard_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db, logdir = tmp_path / "r.db", tmp_path / "tb"
    code, _, err = fwbench_here(
        capsys,
        *run_args(
            *("--models", "mlp", "--runtimes", "torch:eager", "--phase", "training", "--batch-sizes", "2"),
            *("--tensorboard", str(logdir)),
            db=db,
            max_time=0.3,
        ),
    )
    assert code == 0, err
    with Store.open(db, readonly=True) as store:
        (row,) = store.results()
    assert row.status == "ok", row.reason
    training = row.training
    assert training is not None and training.step_losses is not None and training.step_loss_parts is not None
    assert training.final_loss is not None
    losses, parts = list(training.step_losses), training.step_loss_parts
    assert len(losses) == sum(parts.to_dict().values()) and parts.first_call == 1 and parts.warmup >= 2
    # the training details are the first round's (its worker's losses): its blocks
    first_round = [block for block in row.blocks if block.round == 0]
    assert row.calls_per_sample is not None and parts.timed == len(first_round) * row.calls_per_sample
    # AdamW on one batch: downhill from the first loss; one more step after the loop continues the curve. Strictly
    # below the last step's loss only until the batch is fit: a fast CPU runs enough steps (836 on a 2-core EPYC)
    # to reach float32's floor, where the two are equal (4.59e-6 both), so equal within that noise.
    assert losses[0] == training.first_loss and 0 < training.final_loss < losses[0]
    assert training.final_loss <= losses[-1] + 1e-3 * losses[0]
    assert training.counted_steps_before_final == len(losses) - parts.calibration

    run = logdir / "mlp" / "torch_eager"
    assert [p.name for p in logdir.iterdir()] == ["mlp"] and [p.name for p in (logdir / "mlp").iterdir()] == [
        "torch_eager"
    ]
    accumulator = read_run(run)
    tag = "training/{}/b2_fp32_cpu"
    assert sorted(accumulator.Tags()["scalars"]) == sorted(
        tag.format(m) for m in ("loss", "step_time_s", "samples_per_s")
    )
    steps, values = scalars(accumulator, tag.format("loss"))
    assert steps == list(range(len(losses)))
    np.testing.assert_array_equal(values, np.asarray(losses, dtype=np.float32))  # event files hold float32
    steps, seconds = scalars(accumulator, tag.format("step_time_s"))
    np.testing.assert_array_equal(seconds, np.asarray([b.per_call_s for b in first_round], dtype=np.float32))
    start = parts.first_call + parts.warmup + parts.calibration
    assert steps[0] == start + row.calls_per_sample - 1 and steps[-1] == len(losses) - 1
    _, rates = scalars(accumulator, tag.format("samples_per_s"))
    np.testing.assert_allclose(rates, 2 / np.asarray([b.per_call_s for b in first_round]), rtol=1e-6)
    settings = text(accumulator, tag.format("settings"))
    for fragment in (
        "| runtime | torch:eager |",
        "| phase | training |",
        "| max_time_s | 0.3 |",
        "| threads | 1 |",
        "| optimizer | adamw |",
        "first loss",
    ):
        assert fragment in settings, settings

    # the report writes the same from the store; writing again replaces the cell's event file
    again = tmp_path / "again"
    for _ in range(2):
        code, out, err = fwbench_here(capsys, "report", "--db", str(db), "--tensorboard", str(again))
        assert code == 0 and out == "", err
    assert len(list((again / "mlp" / "torch_eager").iterdir())) == 1
    _, values = scalars(read_run(again / "mlp" / "torch_eager"), tag.format("loss"))
    np.testing.assert_array_equal(values, np.asarray(losses, dtype=np.float32))

    code, out, err = fwbench_here(capsys, "report", "--db", str(db), "--format", "json")
    assert code == 0, err
    (result,) = json.loads(out)["results"]
    assert row.median_s is not None
    assert result["samples_per_s"] == pytest.approx(2 / row.median_s) and result["tokens_per_s"] is None


def test_tensorboard_writer_loads_no_framework() -> None:
    """tensorboardX imports torch when it can; the manager's writer hides it (no framework in the manager)."""
    code = (
        "import sys; from fwbench.report.tensorboard import _summary_writer; _summary_writer(); "
        "print([m for m in ('torch', 'tensorflow', 'jax', 'keras') if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr


# -- stored cells, no worker ---------------------------------------------------------------------
def _training_cell(model: str, batch: int, seq: int | None, median_s: float, steps: int = 5) -> Cell:
    losses = list(np.linspace(3.0, 1.0, steps + 3))  # first call, warm-up 2, `steps` timed
    details = {
        "training": {
            "step_losses": losses,
            "first_loss": losses[0],
            "step_loss_parts": {"first_call": 1, "warmup": 2, "calibration": 0, "timed": steps},
        }
    }
    return Cell(
        Case(model, "torch:eager", phase="training", batch_size=batch, seq_len=seq),
        timed(median_s, steps),
        details=details,
        fields={"calls_per_sample": 1},
        rounds=1,  # one worker's steps: its losses and its samples
    )


def test_report_tensorboard_layout_tokens_and_runs(tmp_path: Path) -> None:
    from fwbench.report.tensorboard import write_results

    db = tmp_path / "r.db"
    with Store.open(db) as store:
        first = add_run(
            store,
            [
                _training_cell("bert-tiny", 4, 16, 0.01),
                Cell(Case("bert-tiny", "jax:jit", batch_size=4, seq_len=16), timed(0.002, 7)),
                Cell(Case("bert-tiny", "jax:jit", batch_size=8, seq_len=16), status="oom", reason="out of memory"),
            ],
        )
        second = add_run(store, [_training_cell("bert-tiny", 4, 16, 0.02)])
        results, runs = store.results(), store.runs()
    folders = write_results(tmp_path / "tb", results, {r.id: r.settings for r in runs})
    assert folders == [
        tmp_path / "tb" / f"run{first}" / "bert-tiny" / "torch_eager",
        tmp_path / "tb" / f"run{first}" / "bert-tiny" / "jax_jit",
        tmp_path / "tb" / f"run{second}" / "bert-tiny" / "torch_eager",
    ]  # oom: nothing written
    training = read_run(folders[0])
    assert sorted(training.Tags()["scalars"]) == [
        f"training/{m}/b4_s16_fp32_cpu" for m in ("loss", "samples_per_s", "step_time_s", "tokens_per_s")
    ]
    steps, tokens = scalars(training, "training/tokens_per_s/b4_s16_fp32_cpu")
    assert steps == [3, 4, 5, 6, 7]
    np.testing.assert_allclose(tokens, 64 / np.asarray(results[0].samples), rtol=1e-6)
    inference = read_run(folders[1])  # inference: timing and throughput, no loss
    assert sorted(inference.Tags()["scalars"]) == [
        f"inference/{m}/b4_s16_fp32_cpu" for m in ("samples_per_s", "step_time_s", "tokens_per_s")
    ]
    assert scalars(inference, "inference/step_time_s/b4_s16_fp32_cpu")[0] == list(range(7))
    assert "| case_key |" in text(inference, "inference/settings/b4_s16_fp32_cpu")


def test_training_throughput_in_table_csv_html_and_not_in_inference(tmp_path: Path) -> None:
    from fwbench.report.export import to_csv
    from fwbench.report.html import to_html
    from fwbench.report.table import plain, report_tables

    with Store.open(tmp_path / "r.db") as store:
        add_run(store, [_training_cell("bert-tiny", 4, 16, 0.01)])
        add_run(store, [Cell(Case("mlp", "torch:eager", batch_size=4), timed(0.001))])
        runs, (trained, inferred) = store.runs(), store.results()
    tables, legend = report_tables([trained])
    headers, (row,) = tables[0].headers, tables[0].rows
    assert trained.median_s is not None
    samples_s = 4 / trained.median_s
    assert plain(row[headers.index("samples/s")]) == f"{samples_s:.3g}"
    assert plain(row[headers.index("tokens/s")]) == f"{samples_s * 16 / 1000:.3g}k"
    assert any(line.startswith("samples/s, tokens/s") for line in legend)
    inference_headers = report_tables([inferred])[0][0].headers
    assert "samples/s" not in inference_headers and "tokens/s" not in inference_headers
    csv_rows = [line.split(",") for line in to_csv([trained, inferred]).splitlines()]
    column = csv_rows[0].index("tokens_per_s")
    assert float(csv_rows[1][column]) == pytest.approx(samples_s * 16) and csv_rows[2][column] == ""
    page = to_html(runs, [trained, inferred], baseline=None, peak=None, source="test")
    assert "<th>samples/s</th><th>tokens/s</th>" in page and f"<td>{samples_s:.3g}</td>" in page
    assert "<th>samples/s</th>" not in to_html(runs[1:], [inferred], baseline=None, peak=None, source="test")


@pytest.mark.parametrize("command", ["run", "report"])
def test_tensorboard_dir_that_is_a_file_is_refused(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db, taken = tmp_path / "r.db", tmp_path / "taken"
    taken.write_text("not a folder")
    if command == "report":
        with Store.open(db) as store:
            add_run(store, [_training_cell("mlp", 2, None, 0.001)])
    extra = ["--models", "mlp", "--runtimes", "torch:eager", "--phase", "training"] if command == "run" else []
    code = main([command, *extra, "--db", str(db), "--tensorboard", str(taken)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err == f"fwbench: error: --tensorboard {taken} is not a folder", err
    assert taken.read_text() == "not a folder" and (command == "report" or not db.exists())


def test_a_failing_write_during_a_sweep_is_reported_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fwbench.cli import tensorboard_listener
    from fwbench.runner.manager import CellOutcome

    blocker = tmp_path / "file"
    blocker.write_text("x")
    seen: list[str] = []
    with Store.open(tmp_path / "r.db") as store:
        run_id = add_run(store, [_training_cell("mlp", 2, None, 0.001), _training_cell("mlp", 4, None, 0.001)])
        listen = tensorboard_listener(
            lambda outcome: seen.append(outcome.status), store, run_id, {}, blocker / "tb"
        )  # under a file: mkdir fails
        for row in store.results():
            listen(CellOutcome(Case(row.model, row.runtime, "training", row.batch_size), "ok"))
    err = capsys.readouterr().err.strip().splitlines()
    assert seen == ["ok", "ok"] and len(err) == 1 and "cannot write it" in err[0], err
