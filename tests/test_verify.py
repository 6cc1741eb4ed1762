"""``fwbench weights`` and ``fwbench verify``: files, comparisons, dumps and failures (a weights file used by verify
and run: the matrix's, ``make test-matrix``). The commands run in this process (``fwbench.cli.main``: no interpreter
to start for a check of the command's own work); verify's workers are processes of their own all the same."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

from conftest import fwbench_here, run_args, run_cli
from fwbench.models import get_model
from fwbench.models.weights_io import load_weights
from model_checks import reference_outputs


def test_weights_command_writes_the_canonical_set(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bert-tiny.safetensors"
    code, _, err = fwbench_here(capsys, "weights", "bert-tiny", "--out", str(out), "--seed", "3")
    assert code == 0, err
    assert "39 tensors, 4,385,920 parameters, seed 3" in err
    description = get_model("bert-tiny")
    loaded = load_weights(description, out)
    expected = description.canonical_weights(3)
    assert loaded.keys() == expected.keys() and all(np.array_equal(loaded[k], expected[k]) for k in expected)
    with safe_open(str(out), "np") as handle:
        assert handle.metadata() == {"fwbench_model": "bert-tiny", "seed": "3"}


def test_verify_dumps_and_agrees(
    plugin_env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two real frameworks (torch, JAX: the quickest to start) and the numpy fake agree, each dump holding the outputs
    it computed (every other framework's parity in a worker: tests/test_diff.py and the per-framework tests)."""
    code, out, err = fwbench_here(
        capsys,
        "verify",
        "--models",
        "mlp",
        "--runtimes",
        "torch:eager,jax:jit,fake:sleep",
        "--threads",
        "1",
        "--dump",
        str(tmp_path),
    )
    assert code == 0, out + err
    assert out.count(" ok ") >= 3
    with np.load(tmp_path / "mlp" / "inputs.npz") as inputs:
        x = {"x": inputs["x"]}
    reference = reference_outputs(get_model("mlp"), get_model("mlp").canonical_weights(0), x)["logits"]
    for name in ("torch_eager", "jax_jit", "fake_sleep"):
        with np.load(tmp_path / "mlp" / f"{name}.npz") as outputs:
            assert outputs.files == ["logits"]
            assert np.allclose(outputs["logits"], reference, rtol=1e-5, atol=1e-6)


def test_verify_fails_on_a_runtime_that_computes_something_else(
    plugin_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = fwbench_here(
        capsys,
        "verify",
        "--models",
        "mlp",
        "--runtimes",
        "fake:sleep,fake:wrong,fake:crash,missing:eager",  # one that passes (the fake's float64 reference) among them
        "--threads",
        "1",
    )
    assert code == 1
    text = " ".join(out.split())
    assert "mismatch (> 0.0001)" in text and "error: worker killed by SIGSEGV" in text and "skipped" in text
    rows = {cells[2]: cells for line in out.splitlines() if len(cells := [c.strip() for c in line.split("│")]) > 7}
    assert rows["fake:sleep"][7] == "ok" and rows["fake:wrong"][7] == "mismatch (> 0.0001)", rows  # each alone


@pytest.mark.parametrize(
    "runtimes",
    [
        ("fake:wrong", "fake:sleep"),
        # the usual order, a correct first runtime: make test has it in the test above
        pytest.param(("fake:sleep", "fake:wrong"), marks=pytest.mark.matrix),
    ],
)
def test_a_defect_in_the_first_runtime_fails_that_runtime_alone(
    plugin_env: dict[str, str], runtimes: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The verdict judges each runtime against the float64 reference, whatever the order of --runtimes: a broken
    first runtime (fake:wrong) is a mismatch, a correct runtime after it (fake:sleep, the reference itself) stays ok;
    the error against the first runtime is still printed, for information."""
    code, out, err = fwbench_here(
        capsys, "verify", "--models", "mlp", "--runtimes", ",".join(runtimes), "--threads", "1"
    )
    assert code == 1, out + err
    rows = {cells[2]: cells for line in out.splitlines() if len(cells := [c.strip() for c in line.split("│")]) > 7}
    vs_first, vs_reference = (float(cell.split()[0]) for cell in rows["fake:sleep"][5:7])
    assert rows["fake:sleep"][7] == "ok" and vs_reference == 0.0, rows
    assert (vs_first == 0.0) if runtimes[0] == "fake:sleep" else (vs_first > 0.1), rows  # shown, not judged
    assert rows["fake:wrong"][7] == "mismatch (> 0.0001)", rows
    assert "whatever the order of --runtimes" in " ".join(out.split())


def test_without_a_reference_the_verdict_judges_the_first_runtime() -> None:
    from fwbench.runner.verify import OutputCheck

    def check(vs_first: float, vs_reference: float | None) -> OutputCheck:
        return OutputCheck("m", "r", "ok", None, "y", (2,), vs_first, 0.0, vs_reference, 0.0, 1e-4)

    assert check(0.5, 1e-7).passed and not check(1e-7, 0.5).passed  # the reference decides, not the first runtime
    assert check(1e-7, None).passed and not check(0.5, None).passed  # no reference: the first runtime decides


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (
            ["--models", "mlp,bert-tiny", "--runtimes", "torch:eager", "--weights", "w.safetensors"],
            "--weights holds one model's weights",
        ),
        (["--models", "mlp", "--runtimes", "torch:eager", "--weights", "/etc/hostname"], "cannot read weights"),
        (["--models", "nope", "--runtimes", "torch:eager"], "unknown model 'nope'"),
        (
            ["--models", "bert-tiny", "--runtimes", "torch:eager", "--seq-len", "600"],
            "exceeds bert-tiny's maximum of 512",
        ),
    ],
)
def test_verify_bad_input(args: list[str], fragment: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = fwbench_here(capsys, "verify", *args)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert fragment in err


def test_verify_rejects_weights_of_another_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "mlp.safetensors"
    assert fwbench_here(capsys, "weights", "mlp", "--out", str(out))[0] == 0
    code, _, err = fwbench_here(
        capsys, "verify", "--models", "gpt2-tiny", "--runtimes", "torch:eager", "--weights", str(out)
    )
    assert code == 2
    assert "do not fit gpt2-tiny: gpt2-tiny weights: missing ['h.0.attn.c_attn.bias'" in err
    assert "and 23 more" in err


@pytest.mark.matrix  # make test: the weights command, and --weights refused where it does not fit
def test_a_weights_file_is_really_used_by_verify_and_run(tmp_path: Path) -> None:
    weights = tmp_path / "mlp-seed7.safetensors"
    assert run_cli("weights", "mlp", "--out", str(weights), "--seed", "7").returncode == 0
    for name, extra in (("canonical", []), ("file", ["--weights", str(weights)])):
        result = run_cli(
            "verify",
            "--models",
            "mlp",
            "--runtimes",
            "torch:eager",
            "--threads",
            "1",
            "--dump",
            str(tmp_path / name),
            *extra,
        )
        assert result.returncode == 0, result.stdout + result.stderr
    with (
        np.load(tmp_path / "file" / "mlp" / "torch_eager.npz") as got,
        np.load(tmp_path / "file" / "mlp" / "inputs.npz") as inputs,
    ):
        description = get_model("mlp")
        expected = reference_outputs(description, description.canonical_weights(7), {"x": inputs["x"]})["logits"]
        assert np.allclose(got["logits"], expected, rtol=1e-5, atol=1e-6)
        with np.load(tmp_path / "canonical" / "mlp" / "torch_eager.npz") as canonical:
            assert not np.allclose(got["logits"], canonical["logits"])

    db = tmp_path / "w.db"
    run = run_cli(
        *run_args("--models", "mlp", "--runtimes", "torch:eager", "--weights", str(weights), db=db, max_time=0.2)
    )
    assert run.returncode == 0, run.stderr
    report = run_cli("report", "--db", str(db), "--format", "json")
    (row,) = json.loads(report.stdout)["results"]
    assert row["status"] == "ok" and row["details"]["parity"]["ok"]
    assert json.loads(report.stdout)["runs"][0]["settings"]["weights_path"] == str(weights)


def test_relative_errors_is_the_one_measure_of_parity_and_verify() -> None:
    from fwbench.runner.cell import parity
    from fwbench.runner.tolerances import relative_errors

    expected = np.array([[3.0, 4.0]])
    got = np.array([[3.0, 4.5]], dtype=np.float32)
    assert relative_errors(got, expected) == (0.1, 0.5)  # ‖(0, 0.5)‖ / ‖(3, 4)‖, max |Δ|
    assert relative_errors(got, expected.T) == (float("inf"), float("inf"))  # shapes differ
    assert relative_errors(np.zeros(2), np.zeros(2)) == (0.0, 0.0)  # an all-zero reference divides by 1
    assert relative_errors(2.2, 2.0) == pytest.approx((0.1, 0.2))  # scalars: a loss against its reference
    check = parity({"logits": got}, {"logits": expected}, "fp32", "mlp")
    assert check["outputs"]["logits"] == {"rel_l2": 0.1, "max_abs": 0.5} and check["ok"] is False
