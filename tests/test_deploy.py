"""Deployment runtimes (``onnxruntime:torch``, ``tensorflow:savedmodel``): every tiny model matches the float64
reference through ``fwbench verify``'s worker path; a timed cell stores what its export cost and runs under the
thread budget; the planner refuses what they cannot compute."""

from __future__ import annotations

import pytest

from fwbench.runner.verify import verify_model
from fwbench.spec import Case, Settings

DEPLOYMENT_RUNTIMES = ("onnxruntime:torch", "tensorflow:savedmodel")
TINY_MODELS = ("mlp", "bert-tiny", "gpt2-tiny", "resnet-tiny")
PARITY_TOLERANCE = 1e-5  # fp32; both land below 1e-6 on every tiny model


@pytest.mark.slow
@pytest.mark.parametrize("model", TINY_MODELS[1:])  # the MLP: the two cells below check its parity
def test_every_tiny_model_matches_the_reference_after_export(model: str) -> None:
    pytest.importorskip("onnxruntime")
    checks = verify_model(model, DEPLOYMENT_RUNTIMES, Settings(threads=1, timeout_s=300))
    assert {c.runtime for c in checks} == set(DEPLOYMENT_RUNTIMES)
    failed = [(c.runtime, c.output, c.status, c.reason, c.rel_l2_vs_reference) for c in checks if not c.passed]
    assert not failed
    assert all(c.rel_l2_vs_reference is not None and c.rel_l2_vs_reference < PARITY_TOLERANCE for c in checks)


@pytest.mark.slow
def test_onnxruntime_cell_stores_its_exports_and_session_settings() -> None:
    """Timed at batch 3, parity at the model's parity shape (batch 2): two exports, each with its seconds, size
    and opset; the session's thread settings as ORT reads them back; the worker's threads all on its one CPU."""
    pytest.importorskip("onnxruntime")
    from fwbench.runner.manager import run_worker

    outcome = run_worker(Case("mlp", "onnxruntime:torch", batch_size=3), Settings(threads=1, max_time_s=0.3))
    assert outcome.status == "ok", outcome.reason
    assert outcome.details["parity"]["ok"]
    report = outcome.details["compile_report"]
    assert report["input_shapes"] == [[3, 64]] and report["export_s"] > 0 and report["session_s"] > 0
    assert report["artefact_bytes"] > 4 * 64 * 64 and report["opset"] >= 18
    assert report["providers"] == ["CPUExecutionProvider"]
    assert [r["input_shapes"] for r in report["reexports"]] == [[[2, 64]]]
    threads = outcome.details["threads_effective"]
    assert threads == {"intra_op": 1, "inter_op": 1, "execution_mode": "ORT_SEQUENTIAL", "allow_spinning": "1"}
    assert outcome.details["thread_cpu_lists"] == [str(outcome.details["cpus"][0])]
    assert outcome.details["compile_health"]["during_timing"] == {}
    assert {"onnxruntime", "onnx", "onnxscript", "torch"} <= set(outcome.details["versions"])


@pytest.mark.slow
def test_savedmodel_cell_times_the_reloaded_signature() -> None:
    """One export serves the timed and the parity shape (every axis of the signature is free)."""
    from fwbench.runner.manager import run_worker

    outcome = run_worker(Case("mlp", "tensorflow:savedmodel", batch_size=3), Settings(threads=1, max_time_s=0.3))
    assert outcome.status == "ok", outcome.reason
    assert outcome.details["parity"]["ok"]
    report = outcome.details["compile_report"]
    assert report["export_s"] > 0 and report["load_s"] > 0 and report["artefact_bytes"] > 0
    assert report["signature"] == "serving_default: input_0 float32[rank 2]"
    assert "reexports" not in report


def test_planner_skips_bf16_and_training_for_deployment_runtimes() -> None:
    from fwbench.runner.planner import build_plan

    runtimes = ["torch:eager", *DEPLOYMENT_RUNTIMES]
    plan = build_plan(["mlp"], runtimes, [1], [], Settings(), dtype="bf16")
    assert [case.runtime for case in plan.cases] == ["torch:eager"]
    reasons = {s.case.runtime: s.reason for s in plan.skipped}
    assert reasons == {r: f"{r} cannot compute in bf16 (it computes in fp32)" for r in DEPLOYMENT_RUNTIMES}
    training = build_plan(["mlp"], runtimes, [1], [], Settings(), phase="training")
    assert [case.runtime for case in training.cases] == ["torch:eager"]
    assert {s.reason for s in training.skipped} == {f"{r} has no training phase yet" for r in DEPLOYMENT_RUNTIMES}


def test_onnxruntime_refuses_cuda_without_onnxruntime_gpu() -> None:
    pytest.importorskip("onnxruntime")
    from fwbench.frameworks import create_backend, get_runtime
    from fwbench.frameworks.onnxruntime.backend import OnnxRuntimeBackend

    with pytest.raises(NotImplementedError, match="onnxruntime:torch on cuda needs onnxruntime-gpu"):
        create_backend("onnxruntime:torch", "cuda", Settings())
    assert get_runtime("onnxruntime:torch").dtypes == OnnxRuntimeBackend.dtypes_of("torch") == ("fp32",)
