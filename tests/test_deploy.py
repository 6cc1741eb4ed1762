"""Deployment runtimes (``onnxruntime:torch``, ``onnxruntime:tensorflow``, ``openvino:torch``,
``litert:tensorflow``, ``tensorflow:savedmodel``): every tiny model matches the float64 reference through
``fwbench verify``'s worker path; a timed cell stores what its export cost and runs under the thread budget;
OpenVINO computes in the float32 it is told to; a model an exporter cannot express is stored as ``error`` with
the exporter's message while the sweep goes on; the planner refuses what they cannot compute.

``make test`` runs a timed MLP cell of each engine (onnxruntime:torch, openvino:torch, litert:tensorflow,
tensorflow:savedmodel: each checks its parity) and ``fwbench export``'s refusals; the matrix (``make test-matrix``)
runs ``fwbench verify`` of every tiny model on every engine, the onnxruntime:tensorflow cell, ``fwbench export`` to
ONNX and LiteRT, the export cache shared by a group's engines, and the model tf2onnx cannot convert."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fwbench.models as models
from conftest import loaded_model_plugin, require, run_args, run_cli
from fwbench.frameworks import get_runtime
from fwbench.runner.verify import verify_model
from fwbench.spec import Case, Settings
from model_checks import reference_outputs

EXPORTED_RUNTIMES = ("onnxruntime:torch", "onnxruntime:tensorflow", "openvino:torch", "litert:tensorflow")
DEPLOYMENT_RUNTIMES = (*EXPORTED_RUNTIMES, "tensorflow:savedmodel")
TINY_MODELS = ("mlp", "bert-tiny", "gpt2-tiny", "resnet-tiny")
PARITY_TOLERANCE = 1e-5  # fp32; every engine lands below 1e-6 on every tiny model
# What each engine reports of the thread budget (1 thread), and the facts its exports carry besides the common ones.
ENGINE_THREADS = {
    "onnxruntime": {"intra_op": 1, "inter_op": 1, "execution_mode": "ORT_SEQUENTIAL", "allow_spinning": "1"},
    "openvino": {"inference_num_threads": 1, "num_streams": 1, "performance_hint": "LATENCY"},
    "litert": {"num_threads": 1},
}
EXPORTERS = {"torch": "torch.onnx.export(dynamo=True)", "tensorflow": "tf2onnx.convert.from_function"}


@pytest.mark.slow
@pytest.mark.matrix  # the MLP: the cells below check its parity in make test; bert-tiny: every engine's cell in
@pytest.mark.parametrize("model", ["gpt2-tiny", "resnet-tiny"])  # tests/test_kernels.py (parity on, status ok)
def test_every_tiny_model_matches_the_reference_after_export(model: str) -> None:
    require("onnxruntime")
    checks = verify_model(model, DEPLOYMENT_RUNTIMES, Settings(threads=1, timeout_s=300))
    assert {c.runtime for c in checks} == set(DEPLOYMENT_RUNTIMES)
    failed = [(c.runtime, c.output, c.status, c.reason, c.rel_l2_vs_reference) for c in checks if not c.passed]
    assert not failed
    assert all(c.rel_l2_vs_reference is not None and c.rel_l2_vs_reference < PARITY_TOLERANCE for c in checks)


@pytest.mark.slow
@pytest.mark.parametrize(  # onnxruntime's engine once in make test (its tf2onnx export: the matrix's)
    "runtime",
    [pytest.param(r, marks=pytest.mark.matrix) if r == "onnxruntime:tensorflow" else r for r in EXPORTED_RUNTIMES],
)
def test_exported_cell_stores_its_exports_and_engine_settings(runtime: str) -> None:
    """Timed at batch 3, parity at the model's parity shape (batch 2): two exports, each with its seconds and
    size; the engine's thread settings as it reports them; every thread of the worker on its one CPU; OpenVINO's
    compiled model computing in f32 with the settings it was given."""
    from fwbench.runner.manager import run_worker

    engine, exporter = runtime.split(":")
    outcome = run_worker(Case("mlp", runtime, batch_size=3), Settings(threads=1, max_time_s=0.3))
    assert outcome.status == "ok", outcome.reason
    assert outcome.details["parity"]["ok"]
    report = outcome.details["compile_report"]
    assert report["input_shapes"] == [[3, 64]] and report["export_s"] > 0 and report["load_s"] > 0
    assert report["artefact_bytes"] > 4 * 64 * 64  # the first layer's float32 weights are inside
    assert [r["input_shapes"] for r in report["reexports"]] == [[[2, 64]]]
    assert outcome.details["threads_effective"] == ENGINE_THREADS[engine]
    assert outcome.details["thread_cpu_lists"] == [str(outcome.details["cpus"][0])]
    assert outcome.details["compile_health"]["during_timing"] == {}
    assert {engine.replace("litert", "ai-edge-litert"), exporter} <= set(outcome.details["versions"])
    if engine in ("onnxruntime", "openvino"):
        assert report["exporter"] == EXPORTERS[exporter] and report["opset"] >= 18
    if engine == "onnxruntime":
        assert report["providers"] == ["CPUExecutionProvider"]
    if engine == "openvino":
        assert report["compiled"] == {
            "INFERENCE_PRECISION_HINT": "f32",
            "PERFORMANCE_HINT": "LATENCY",
            "EXECUTION_MODE_HINT": "PERFORMANCE",
            "NUM_STREAMS": 1,
            "INFERENCE_NUM_THREADS": 1,
            "ENABLE_CPU_PINNING": True,
        }
    if engine == "litert":
        assert report["exporter"] == "tf.lite.TFLiteConverter.from_concrete_functions"
        assert report["signature"] == "serving_default: input_0 -> output_0"


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


def _matmul_onnx(path: Path) -> None:
    """A (2, 8) @ (8, 4) float32 MatMul as an ONNX file (no framework needed)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [weight],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)


@pytest.mark.slow
def test_openvino_computes_float32_only_because_it_is_told_to(tmp_path: Path) -> None:
    """The backend's compile settings make the compiled model report f32. Without the precision hint, a CPU with
    bf16 units (OpenVINO's BF16 capability) compiles the same float32 model to bf16: the hint is what keeps it
    float32 there (that half needs such a CPU)."""
    require("openvino")
    import openvino as ov
    import openvino.properties as props
    import openvino.properties.hint as hints

    from fwbench.frameworks.openvino.backend import DEVICE, OpenVinoBackend, plain

    path = tmp_path / "matmul.onnx"
    _matmul_onnx(path)
    backend = OpenVinoBackend("torch", "cpu", Settings())
    config = backend.config()
    assert config[hints.inference_precision()] == ov.Type.f32
    compiled = backend.core.compile_model(str(path), DEVICE, config)
    assert plain(compiled.get_property(hints.inference_precision())) == "f32"
    if "BF16" not in ov.Core().get_property(DEVICE, props.device.capabilities()):
        pytest.skip("this CPU has no bf16 units: OpenVINO's default is f32 here, nothing to override")
    if os.environ.get("FWBENCH_TEST_ISA") == "avx2":  # OpenVINO reads BF16 from cpuid, its oneDNN is capped
        pytest.skip("frameworks capped to AVX2 (make test-avx2): OpenVINO still reports BF16 but cannot compile it")
    del config[hints.inference_precision()]
    unhinted = backend.core.compile_model(str(path), DEVICE, config)
    assert plain(unhinted.get_property(hints.inference_precision())) == "bf16"


@pytest.fixture
def gelu_model_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """The test plugin model gelu-mlp (tests/fwbench_gelu_model) loaded here and in every subprocess."""
    yield from loaded_model_plugin(monkeypatch, "fwbench_gelu_model")


@pytest.mark.slow
@pytest.mark.matrix  # make test checks a failing cell and the sweep going on with tests/test_runner.py's fakes
def test_a_model_the_exporter_cannot_express_is_an_error_and_the_sweep_goes_on(
    gelu_model_env: dict[str, str], db_path: Path
) -> None:
    """gelu-mlp's exact GELU is TF's Erfc, which tf2onnx cannot convert: its onnxruntime:tensorflow cell is an
    error with tf2onnx's message during the compile stage; the next cell (the MLP) is measured and stored."""
    from fwbench.store import Store

    done = run_cli(
        *run_args(
            "--models", "gelu-mlp,mlp", "--runtimes", "onnxruntime:tensorflow", "--batch-sizes", "2",
            db=db_path, max_time=0.2,
        ),
        env=gelu_model_env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    with Store.open(db_path, readonly=True) as store:
        rows: dict[str, Any] = {row.model: row for row in store.results()}
    assert set(rows) == {"gelu-mlp", "mlp"}
    failed = rows["gelu-mlp"]
    assert failed.status == "error"
    assert failed.reason.endswith("during compile: tf2onnx 1.17.0: Tensorflow op(s) not supported: Erfc"), failed.reason
    assert rows["mlp"].status == "ok" and rows["mlp"].median_s is not None
    # fwbench export of it fails the same way, and leaves nothing behind
    out = db_path.parent / "gelu.onnx"
    export = run_cli("export", "gelu-mlp", "--runtime", "onnxruntime:tensorflow", "--out", str(out), env=gelu_model_env)
    assert export.returncode == 1 and "Tensorflow op(s) not supported: Erfc" in export.stderr, export.stderr[-2000:]
    assert [p.name for p in db_path.parent.iterdir() if "gelu" in p.name] == []  # nor a partial file


def test_planner_skips_bf16_and_training_for_deployment_runtimes() -> None:
    from fwbench.runner.planner import build_plan

    runtimes = ["torch:eager", *DEPLOYMENT_RUNTIMES]
    plan = build_plan(["mlp"], runtimes, [1], [], Settings(), dtype="bf16")
    assert [case.runtime for case in plan.cases] == ["torch:eager"]
    reasons = {s.case.runtime: s.reason for s in plan.skipped}
    assert reasons == {
        r: f"{r} cannot compute in bf16 (it computes in {', '.join(get_runtime(r).dtypes)})"
        for r in DEPLOYMENT_RUNTIMES
    }
    training = build_plan(["mlp"], runtimes, [1], [], Settings(), phase="training")
    assert [case.runtime for case in training.cases] == ["torch:eager"]
    assert {s.reason for s in training.skipped} == {f"{r} has no training phase yet" for r in DEPLOYMENT_RUNTIMES}


@pytest.mark.parametrize("runtime", DEPLOYMENT_RUNTIMES[:-1])
def test_deployment_engines_refuse_cuda_with_the_reason(runtime: str) -> None:
    from fwbench.frameworks import create_backend

    info = get_runtime(runtime)
    require(info.requires[0])
    with pytest.raises(NotImplementedError, match=f"{runtime} on cuda: .*(onnxruntime-gpu|not CUDA)"):
        create_backend(runtime, "cuda", Settings())
    # fp32, and int8 where the engine quantises (tests/test_int8.py); never bf16
    assert info.dtypes == (
        ("fp32", "int8")
        if runtime in ("onnxruntime:torch", "onnxruntime:tensorflow", "litert:tensorflow")
        else ("fp32",)
    )


# -- fwbench export ------------------------------------------------------------------------------------
def _engine_outputs(runtime: str, path: Path, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """The written artefact loaded here, by the engine alone (no framework), and run on ``inputs``."""
    if runtime == "onnxruntime:torch":
        import onnxruntime as ort

        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return list(session.run(None, {i.name: a for i, a in zip(session.get_inputs(), inputs)}))
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_path=str(path)).get_signature_runner("serving_default")
    result = runner(**{f"input_{i}": a for i, a in enumerate(inputs)})
    return [result[f"output_{i}"] for i in range(len(result))]


@pytest.mark.slow
@pytest.mark.matrix  # make test: its refusals, below
@pytest.mark.parametrize("runtime", ["onnxruntime:torch", "litert:tensorflow"])
def test_export_writes_an_artefact_the_engine_alone_runs(runtime: str, tmp_path: Path) -> None:
    """``fwbench export`` writes one file and one line; the file, loaded here by the engine without any framework,
    computes the float64 reference's outputs at the exported shape; nothing else is left beside it."""
    require(runtime.split(":")[0].replace("litert", "ai_edge_litert"))
    out = tmp_path / "mlp.model"
    done = run_cli("export", "mlp", "--runtime", runtime, "--out", str(out), "--batch-size", "3", "--threads", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    line = done.stdout.strip()
    assert line.startswith(f"wrote {out}: ") and "batch 3" in line and "relative L2" in line, line
    assert len(line.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp.model"]
    description = models.get_model("mlp")
    arrays = description.make_inputs(3, None, 0)
    reference = reference_outputs(description, description.canonical_weights(0), arrays)["logits"]
    (got,) = _engine_outputs(runtime, out, list(arrays.values()))
    assert got.shape == (3, 10)
    assert np.linalg.norm(got - reference) / np.linalg.norm(reference) < PARITY_TOLERANCE


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nope", "--runtime", "onnxruntime:torch"], "unknown model 'nope'"),
        (["mlp", "--runtime", "torch:eager"], "torch:eager writes no artefact; fwbench export takes: torch:export"),
        (["mlp", "--runtime", "torch:export"], "torch:export writes an AOTInductor package (.pt2): the path must end"),
        (["gpt2-tiny", "--runtime", "onnxruntime:torch", "--seq-len", "100000"], "gpt2-tiny"),
        (["mlp", "--runtime", "onnxruntime:torch", "--batch-size", "0"], "'0' is not a positive integer"),
        (["mlp", "--runtime", "onnxruntime:torch", "--seq-len", "16"], "--seq-len: mlp has no sequence axis"),
    ],
)
def test_export_refuses_bad_input_in_one_line_and_writes_nothing(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fwbench.cli import main

    out = tmp_path / "artefact.bin"
    assert main(["export", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert list(tmp_path.iterdir()) == []


def test_export_refuses_an_existing_path_or_a_missing_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fwbench.cli import main

    existing = tmp_path / "model.onnx"
    existing.write_bytes(b"keep me")
    assert main(["export", "mlp", "--runtime", "onnxruntime:torch", "--out", str(existing)]) == 2
    assert "exists; remove it or choose another path" in capsys.readouterr().err
    assert existing.read_bytes() == b"keep me"
    missing = tmp_path / "no" / "such" / "model.onnx"
    assert main(["export", "mlp", "--runtime", "onnxruntime:torch", "--out", str(missing)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]


@pytest.mark.slow
@pytest.mark.matrix
def test_a_group_exports_once_and_the_engines_share_the_file(tmp_path: Path) -> None:
    """onnxruntime:torch and openvino:torch run the same ONNX file: the group's export cache makes it once; the
    cell that loaded it stores that export's seconds with cached: true and counts them in its time to first result."""
    require("openvino")
    from fwbench.cli import main
    from fwbench.frameworks.base import EXPORT_CACHE_ENV
    from fwbench.store import Store

    db = tmp_path / "r.db"
    runtimes = "onnxruntime:torch,openvino:torch"
    assert main(run_args("--models", "mlp", "--runtimes", runtimes, db=db, max_time=0.2)) == 0
    assert EXPORT_CACHE_ENV not in os.environ  # the manager's cache lived as long as the group
    with Store.open(db, readonly=True) as store:
        rows = store.results()
    reports = {row.runtime: row.details["compile_report"] for row in rows}
    assert all(row.status == "ok" for row in rows)
    cached = [runtime for runtime, report in reports.items() if report.get("cached")]
    assert len(cached) == 1  # whichever started second loaded the first one's file
    made, used = reports[next(r for r in reports if r not in cached)], reports[cached[0]]
    assert used["export_s"] == made["export_s"] and used["artefact_bytes"] == made["artefact_bytes"]
    row = next(r for r in rows if r.runtime == cached[0])
    stages = row.details["stage_seconds"]
    assert row.time_to_first_result_s == pytest.approx(
        sum(stages.get(s, 0.0) for s in ("start", "import", "build", "compile", "first_call")) + used["export_s"]
    )
