"""Compile health: recompiles and retraces inside the timed loop are counted, stored and flagged. ``make test``
forces a retrace in JAX and checks jax:jit's fixed signature; TensorFlow's forced retrace and the fixed signatures of
tensorflow:function and Keras are the matrix's (``make test-matrix``)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from conftest import require, run_args, run_cli
from fwbench.runner.cell import compile_health
from fwbench.runner.manager import run_worker
from fwbench.spec import Case, Settings
from fwbench.store import Store


def test_compile_health_flags_counters_that_grew_during_timing() -> None:
    health = compile_health({"traces": 1, "graph_breaks": 0}, {"traces": 4, "graph_breaks": 0})
    assert health["during_timing"] == {"traces": 3, "graph_breaks": 0}
    assert health["recompiled_in_timed_loop"] is True
    assert health["flags"] == ["traces +3 in timed loop"]
    clean = compile_health({"traces": 1, "graph_breaks": 2}, {"traces": 1, "graph_breaks": 2})
    assert clean["recompiled_in_timed_loop"] is False
    assert clean["flags"] == ["graph breaks 2"]  # breaks from the first compile are still worth a flag
    assert compile_health({}, {})["flags"] == []


@pytest.mark.parametrize("runtime", ["retrace:jax", pytest.param("retrace:tensorflow", marks=pytest.mark.matrix)])
def test_a_forced_retrace_in_the_timed_loop_is_detected(plugin_env: dict[str, str], runtime: str) -> None:
    outcome = run_worker(Case("mlp", runtime, batch_size=2), Settings(threads=1, max_time_s=0.5))
    assert outcome.status == "ok", outcome.reason
    health = outcome.details["compile_health"]
    assert health["recompiled_in_timed_loop"] is True
    assert health["during_timing"]["traces"] >= len(outcome.samples)  # at least one trace per timed block
    assert any(flag.startswith("traces +") for flag in health["flags"])


@pytest.mark.parametrize(
    "runtime",
    [
        "jax:jit",
        *(pytest.param(r, marks=pytest.mark.matrix) for r in ("tensorflow:function", "keras:jax", "keras:tensorflow")),
    ],
)
def test_a_fixed_signature_never_retraces_while_timed(runtime: str) -> None:
    outcome = run_worker(Case("mlp", runtime, batch_size=2), Settings(threads=1, max_time_s=0.3))
    assert outcome.status == "ok", outcome.reason
    health = outcome.details["compile_health"]
    assert health["after_warmup"]["traces"] >= 1  # the counter is real: the first call traced
    assert health["during_timing"]["traces"] == 0
    assert health["recompiled_in_timed_loop"] is False and health["flags"] == []
    assert outcome.details["warmup_calls"] == len(outcome.details["warmup_call_s"]) >= 2


def test_torch_compile_counters_read_dynamo() -> None:
    torch = require("torch")
    from fwbench.frameworks.torch.backend import TorchBackend

    backend = TorchBackend("compile", "cpu", Settings(threads=1))
    before = backend.compile_counters()
    compiled = torch.compile(lambda x: x.sin() + 1, backend="eager", fullgraph=True)
    compiled(torch.ones(3))
    compiled(torch.ones(3, 4))  # a new rank: Dynamo compiles again
    after = backend.compile_counters()
    assert after["compiles"] - before["compiles"] == 2
    assert after["eager_fallbacks"] == before["eager_fallbacks"]
    assert TorchBackend("eager", "cpu", Settings(threads=1)).compile_counters() == {}


def test_report_flags_a_cell_that_recompiled(plugin_env: dict[str, str], db_path: Path) -> None:
    result = run_cli(
        *run_args("--models", "mlp", "--runtimes", "retrace:jax", "--batch-sizes", "2", db=db_path, max_time=0.3),
        env=plugin_env,
    )
    assert result.returncode == 0, result.stderr
    with Store.open(db_path, readonly=True) as store:
        (row,) = store.results()
    assert row.compile_health is not None and row.compile_health.recompiled_in_timed_loop
    assert "traces +" in " ".join(result.stdout.split())
    exported = run_cli("report", "--db", str(db_path), "--format", "csv", env=plugin_env)
    (csv_row,) = csv.DictReader(io.StringIO(exported.stdout))
    assert csv_row["compile_flags"].startswith("traces +") and "in timed loop" in csv_row["compile_flags"]
