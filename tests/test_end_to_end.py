"""One real sweep of the MLP in PyTorch and JAX, through the CLI (3 interleaved rounds, as a user runs it), then the
reports (in this process: ``fwbench.cli.main``). One comparison group: two real frameworks × 3 rounds are six worker
start-ups (JAX: the framework that starts quickest; TensorFlow's workers run in make test in tests/test_diff.py and
the per-framework tests); several groups (stored group by group, parity checked once per model × runtime) are tested with
the fake runtimes in tests/test_interleave.py and tests/test_runner.py."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from conftest import run_cli
from fwbench.cli import main


def report(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``fwbench report ARGS`` in this process: (exit status, stdout, stderr)."""
    capsys.readouterr()
    code = main(["report", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_mlp_in_torch_and_jax(db_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = run_cli(
        "run",
        "--models",
        "mlp",
        "--runtimes",
        "torch:eager,jax:jit",
        "--batch-sizes",
        "4",
        "--seq-lens",
        "8",
        "--max-time",
        "0.3",
        "--threads",
        "1",
        "--db",
        str(db_path),
    )
    assert run.returncode == 0, run.stderr
    assert "[2/2]" in run.stderr and "Results are in" in run.stdout

    code, out, err = report(capsys, "--db", str(db_path), "--run", "1", "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert len(data["runs"]) == 1 and data["runs"][0]["environment"]["physical_cores"] >= 1
    results = data["results"]
    assert [(r["runtime"], r["batch_size"], r["seq_len"]) for r in results] == [
        ("torch:eager", 4, None),
        ("jax:jit", 4, None),
    ]  # one comparison group: both runtimes measured together, interleaved
    assert {r["schedule"] for r in results} == {"interleaved"} and {r["rounds"] for r in results} == {3}
    assert {len({b["round"] for b in r["blocks"]}) for r in results} == {3}
    pairs = [{(b["round"], b["cycle"]) for b in r["blocks"]} for r in results]
    assert pairs[0] == pairs[1]  # every block has its partner: the same round and cycle in the other runtime
    for r in results:
        assert r["status"] == "ok", r["reason"]
        assert r["run_id"] == 1 and r["phase"] == "inference" and r["dtype"] == "fp32" and r["threads"] == 1
        assert len(r["samples"]) == r["n_samples"] >= 2
        assert r["ci_low_s"] <= r["median_s"] <= r["ci_high_s"]
        assert r["first_call_s"] > 0 and r["peak_memory_bytes"] > 10 * 2**20
        # parity at the model's parity shape (batch 2), checked by this, the pair's first cell
        assert r["details"]["parity"]["ok"] and r["details"]["parity"]["outputs"]["logits"]["rel_l2"] < 1e-5
        assert r["details"]["parity"]["shape"] == [2, None]
        assert r["details"]["threads_effective"]["intra_op"] == 1
        assert r["details"]["thread_cpu_lists"] == [str(r["details"]["cpus"][0])]
        assert r["flops"] == 2 * r["batch_size"] * (64 * 64 + 64 * 64 + 64 * 10)
    assert "torch" in results[0]["details"]["versions"] and "jax" in results[1]["details"]["versions"]

    code, out, _ = report(capsys, "--db", str(db_path), "--format", "table")
    assert code == 0 and "jax:jit" in out

    latest = db_path.parent / "latest.csv"
    code, out, err = report(capsys, "--db", str(db_path), "--run", "latest", "--format", "csv", "--out", str(latest))
    assert code == 0 and f"wrote {latest}" in err and out == ""
    rows = list(csv.DictReader(io.StringIO(latest.read_text())))
    assert len(rows) == 2 and rows[0]["runtime"] == "torch:eager" and rows[0]["seq_len"] == ""
    assert len(rows[0]["samples"].split()) == int(rows[0]["n_samples"])
