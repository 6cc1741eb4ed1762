"""docs/architecture.md's checklists, each tried with a throwaway example that touches only the files its checklist
names: a deployment engine (tests/fwbench_test_engine.py: one file, its backend and registry record, through the real
CLI), a phase (one Phase subclass, registered: the planner, the estimate, the dtype and --procs checks ask it, and a
cell of it runs), and a model (tests/fwbench_plugin_model/, exercised by tests/test_plugin_model.py)."""

from __future__ import annotations

import io
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fwbench.spec
from conftest import loaded_model_plugin, require, run_args, run_cli
from fwbench.frameworks import RuntimeInfo
from fwbench.messages import Job
from fwbench.models.base import ModelDescription
from fwbench.runner import phases
from fwbench.runner.cell import Cell
from fwbench.runner.launchers import launcher_for
from fwbench.runner.phases import Phase, check_case, estimate_s, get_phase
from fwbench.runner.planner import build_plan
from fwbench.spec import Case, Settings, SpecError

ENGINE = "fwbench_test_engine"


@pytest.fixture
def engine_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """The throwaway engine's plugin loaded here (registries restored afterwards) and in every worker."""
    for module in ("onnxruntime", "onnx", "onnxscript", "torch"):
        require(module)
    yield from loaded_model_plugin(monkeypatch, ENGINE)


def test_a_deployment_engine_is_one_backend_file_and_its_record(engine_env: dict[str, str], tmp_path: Path) -> None:
    """Its mode (``onnx``) is not the exporter's name: the exporter's deploy.py comes from the record's package."""
    db = tmp_path / "engine.db"
    done = run_cli(*run_args("--models", "mlp", "--runtimes", "ortbasic:onnx", db=db, max_time=0.2), env=engine_env)
    assert done.returncode == 0, done.stderr
    with sqlite3.connect(db) as connection:
        rows = connection.execute("SELECT runtime, status, details_json FROM results").fetchall()
    assert [(runtime, status) for runtime, status, _ in rows] == [("ortbasic:onnx", "ok")], rows
    assert all('"ok": true' in details and '"export_s"' in details for _, _, details in rows)


class Echo(Phase):
    """A throwaway phase: inference's timed call without its parity check, on any runtime that infers."""

    name = "echo"
    dtypes = ("fp32",)

    def runtime_unsupported(self, info: RuntimeInfo, settings: Settings) -> str | None:
        return None if "inference" in info.phases else f"{info.name} does not infer"

    def measure(self, cell: Cell, backend: Any, description: ModelDescription) -> None:
        case = cell.job.case
        inputs = backend.make_inputs(description.make_inputs(case.batch_size, case.seq_len, cell.job.settings.seed))
        cell.stage("compile")
        backend.compile(inputs)
        cell.time_calls(backend, backend.make_step(inputs))
        cell.stage("done")


@pytest.fixture
def echo(monkeypatch: pytest.MonkeyPatch) -> Phase:
    """Echo registered as the checklist says: its name in spec.Phase (here: the names a Case accepts) and its object
    in runner/phases' PHASES."""
    phase = Echo()
    monkeypatch.setattr(fwbench.spec, "PHASES", (*fwbench.spec.PHASES, phase.name))
    monkeypatch.setattr(phases, "PHASES", {**phases.PHASES, phase.name: phase})
    return phase


def test_a_phase_is_one_file_and_the_planner_asks_it(echo: Phase) -> None:
    settings = Settings(threads=1, max_time_s=0.2, rounds=1)
    plan = build_plan(["mlp"], ["torch:eager", "onnxruntime:torch"], [2], [], settings, phase="echo")
    assert [case.runtime for case in plan.cases] == ["torch:eager", "onnxruntime:torch"] and not plan.skipped
    assert estimate_s(plan.cases, settings) > 0
    assert get_phase("echo") is echo
    with pytest.raises(SpecError, match="^phase echo with dtype 'bf16' cannot be run yet; phase echo dtypes: fp32$"):
        build_plan(["mlp"], ["torch:eager"], [2], [], settings, phase="echo", dtype="bf16")
    with pytest.raises(SpecError, match="^--procs runs phases training and fit as several processes, not phase echo$"):
        check_case(Case("mlp", "torch:ddp", "echo", 2, procs=2, scaling="weak"), settings)  # type: ignore[arg-type]

    cell = Cell(Job(plan.cases[0], settings), io.StringIO())
    launcher = cell.launcher = launcher_for(cell.job)
    result = launcher.run(echo, cell)
    assert result["status"] == "ok" and result["samples_s"], result
    assert set(result["stage_seconds"]) >= {"start", "import", "build", "compile", "first_call", "warmup", "timing"}
