"""bf16 inference under the one mixed-precision policy (fwbench.precision): torch autocast (every mode), the
same casts in the TensorFlow and JAX model code (Keras' policy is checked in test_keras_models.py, one
subprocess per Keras backend).

By construction: the dtypes each framework's own graph shows per op class (matmul bfloat16, layer norm /
softmax / batch-norm statistics float32, weights float32). Each in-process parity check runs the backend as a
worker does (build, inputs, compile, infer, to_numpy) and asserts the model's bf16 limit against the float64
reference and an error above the fp32 tolerance (bfloat16 really computed); the consistency flag and the
observations' ability to fail are checked in test_precision.py.

``make test`` checks the policy and the in-process parity on mlp, bert-tiny and resnet-tiny, torch.compile's autocast,
and one bf16 cell in a worker (torch:eager) besides ``fwbench verify --dtype bf16``; distilbert-tiny and gpt2-tiny
there, torch.export's (AOTInductor) autocast and the worker cells of the other frameworks are the matrix's
(``make test-matrix``).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from conftest import require
from fwbench.frameworks import create_backend
from fwbench.frameworks.base import Backend
from fwbench.measure.environment import cpu_simd_flags
from fwbench.models import get_model
from fwbench.models.base import ModelDescription
from fwbench.models.bert import Bert, BertConfig
from fwbench.precision import policy_mismatches
from fwbench.runner.cell import parity
from fwbench.runner.phases import get_phase
from fwbench.runner.tolerances import PARITY_REL_L2_TOLERANCE, parity_tolerance
from fwbench.spec import DTYPES, Case, Settings
from model_checks import reference_outputs

DISTIL_TINY = Bert("distilbert-tiny", BertConfig(layers=2, hidden=128, heads=2, intermediate=512, distil=True))
DESCRIPTIONS = [
    get_model("mlp"),
    get_model("bert-tiny"),
    DISTIL_TINY,
    get_model("gpt2-tiny"),
    get_model("llama-tiny"),
    get_model("resnet-tiny"),
]
FP32_TOLERANCE = PARITY_REL_L2_TOLERANCE["fp32"]
# the CPU flags with which TensorFlow turns its oneDNN kernels on by default (tensorflow/core/util/port.cc)
TF_ONEDNN_DEFAULT_FLAGS = {"avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16"}


def by_name(description: ModelDescription) -> str:
    return description.name


MATRIX_MODELS = (
    "distilbert-tiny",
    "gpt2-tiny",
    "llama-tiny",
)  # the in-process policy and parity checks of make test-matrix only


def model_params() -> list[Any]:
    """DESCRIPTIONS as test parameters, those in MATRIX_MODELS marked ``matrix``."""
    return [
        pytest.param(d, id=d.name, marks=pytest.mark.matrix) if d.name in MATRIX_MODELS else pytest.param(d, id=d.name)
        for d in DESCRIPTIONS
    ]


def run_bf16(runtime: str, description: ModelDescription) -> tuple[dict[str, Any], list[str], Backend]:
    """What a worker does with a bf16 backend, at the parity shape: (the parity check, the dtypes of the
    outputs before ``to_numpy``, the backend)."""
    backend = create_backend(runtime, "cpu", Settings(threads=1), dtype="bf16")
    weights = description.canonical_weights(0)
    backend.build(description, weights)
    arrays = description.make_inputs(*description.parity_shape(), 0)
    inputs = backend.make_inputs(arrays)
    try:
        backend.compile(inputs)
        outputs = backend.infer(inputs)
        backend.sync(outputs)
        got = backend.to_numpy(outputs)
    finally:
        if hasattr(backend, "_inference_mode"):  # torch's compile entered it for the process
            backend._inference_mode.__exit__(None, None, None)
    assert all(a.dtype == np.float32 for a in got.values())  # to_numpy converts, whatever the compute dtype
    raw_dtypes = [str(getattr(o, "dtype", type(o))) for o in outputs]
    return parity(got, reference_outputs(description, weights, arrays), "bf16", description.name), raw_dtypes, backend


def assert_bf16_parity(check: dict[str, Any], description: ModelDescription) -> None:
    errors = {name: output["rel_l2"] for name, output in check["outputs"].items()}
    assert check["ok"] and check["tolerance_rel_l2"] == parity_tolerance(description.name, "bf16"), errors
    # Computed in bfloat16, not silently in float32: float32 lands near 1e-7 on these models.
    assert max(errors.values()) > FP32_TOLERANCE, errors


# -- spec, CLI, backend interface ---------------------------------------------------------------
def test_bf16_is_runnable_and_selectable() -> None:
    from fwbench.cli import UsageError, build_parser, plan_from_args

    assert "bf16" in DTYPES and get_phase("inference").dtype_unsupported("bf16") is None
    args = build_parser().parse_args(
        ["run", "--models", "mlp", "--runtimes", "torch:eager", "--dtype", "bf16", "--threads", "1"]
    )
    plan = plan_from_args(args)
    assert plan.cases and {case.dtype for case in plan.cases} == {"bf16"}
    assert (
        build_parser().parse_args(["verify", "--models", "mlp", "--runtimes", "jax:jit", "--dtype", "bf16"]).dtype
        == "bf16"
    )
    with pytest.raises(UsageError, match="invalid choice: 'fp16' \\(choose from 'fp32', 'bf16', 'int8'\\)"):
        build_parser().parse_args(["run", "--models", "mlp", "--runtimes", "torch:eager", "--dtype", "fp16"])


# -- torch: autocast ----------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["eager", "script"])
@pytest.mark.parametrize("description", DESCRIPTIONS, ids=by_name)
def test_torch_bf16_autocast(description: ModelDescription, mode: str) -> None:
    torch = require("torch")
    from fwbench.frameworks.torch.backend import TorchBackend

    seen: list[object] = []  # output dtypes (torch.dtype) of every nn.Linear / nn.Conv2d call (eager only)

    def record(module: object, args: Any, output: Any) -> None:
        if isinstance(module, (torch.nn.Linear, torch.nn.Conv2d)):
            seen.append(output.dtype)

    handle = torch.nn.modules.module.register_module_forward_hook(record)
    try:
        check, _, backend = run_bf16(f"torch:{mode}", description)
    finally:
        handle.remove()
    assert isinstance(backend, TorchBackend)
    assert_bf16_parity(check, description)
    # Autocast leaves some outputs float32 (e.g. BERT's residual stream), but every matmul is bfloat16:
    if mode == "eager":
        assert seen and set(seen) == {torch.bfloat16}
    else:  # the frozen TorchScript graph holds the casts recorded while tracing under autocast
        assert "BFloat16" in str(backend._forward.graph)
    assert "torch.autocast(cpu, bfloat16)" in str(backend.configure_precision()["bf16_mechanism"])
    # autocast keeps the weights float32 (it casts them per op)
    assert {str(p.dtype) for p in backend.model.parameters()} == {"torch.float32"}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["compile", pytest.param("export", marks=pytest.mark.matrix)])  # AOTInductor: matrix
def test_torch_compiled_bf16_autocast(mode: str) -> None:
    """torch.compile and torch.export (AOTInductor) keep the autocast region: bf16 in the compiled code."""
    require("torch")
    check, raw_dtypes, _ = run_bf16(f"torch:{mode}", get_model("mlp"))
    assert_bf16_parity(check, get_model("mlp"))
    assert raw_dtypes == ["torch.bfloat16"]  # the last nn.Linear's output, computed in bfloat16


def test_torch_fp32_is_unchanged_by_the_dtype_argument() -> None:
    torch = require("torch")
    from fwbench.frameworks.torch.backend import TorchBackend

    description = get_model("mlp")
    backend = create_backend("torch:eager", "cpu", Settings(threads=1))
    assert isinstance(backend, TorchBackend)
    settings = backend.configure_precision()
    assert backend.dtype == "fp32" and "bf16_mechanism" not in settings
    # ATen's kernel ISA is stored with the cell (make test-avx2 caps it with ATEN_CPU_CAPABILITY=avx2)
    capability = settings["cpu_capability"]
    assert isinstance(capability, str)
    assert capability == os.environ.get("ATEN_CPU_CAPABILITY", capability).upper()
    assert capability in {"DEFAULT", "AVX2", "AVX512"}
    backend.build(description, description.canonical_weights(0))
    inputs = backend.make_inputs(description.make_inputs(2, None, 0))
    try:
        backend.compile(inputs)
        assert backend._forward is backend.model and backend.infer(inputs)[0].dtype == torch.float32
    finally:
        backend._inference_mode.__exit__(None, None, None)


# -- the one policy, observed in each framework's own graph -------------------------------------------------
POLICY_RUNTIMES = ["torch:eager", "tensorflow:eager", "tensorflow:function", "tensorflow:xla", "jax:jit"]


def observed(runtime: str, description: ModelDescription, dtype: str) -> tuple[dict[str, list[str]], Backend]:
    """What the backend's graph of the forward at the parity shape computes in (observe_precision), once compiled
    as a worker has (function / xla / jit: the compiled program itself)."""
    backend = create_backend(runtime, "cpu", Settings(threads=1), dtype=dtype)
    backend.build(description, description.canonical_weights(0))
    inputs = backend.make_inputs(description.make_inputs(*description.parity_shape(), 0))
    try:
        backend.compile(inputs)
        seen = backend.observe_precision(inputs)
    finally:
        if hasattr(backend, "_inference_mode"):  # torch's compile entered it for the process
            backend._inference_mode.__exit__(None, None, None)
    assert seen is not None
    return seen, backend


def weight_dtypes(backend: Backend) -> set[str]:
    """The dtypes of the built model's floating weights, as the framework holds them."""
    if backend.framework == "torch":
        return {str(p.dtype).removeprefix("torch.") for p in backend.model.parameters()}
    if backend.framework == "tensorflow":
        return {v.dtype.name for v in backend.model.variables if v.dtype.is_floating}
    import jax

    return {str(leaf.dtype) for leaf in jax.tree.leaves(backend.model.params)}


@pytest.mark.parametrize("runtime", POLICY_RUNTIMES)
@pytest.mark.parametrize("description", model_params())
def test_bf16_policy_is_what_each_graph_computes(runtime: str, description: ModelDescription) -> None:
    """By construction, on any CPU: under bf16 every matmul / conv / attention operand is bfloat16 and every
    layer norm, softmax and batch-norm statistic float32 in the framework's own graph (jaxpr, traced tf graph,
    ops dispatched under autocast); under fp32 everything is float32. The weights stay float32 (the master copy)."""
    if runtime.startswith("tensorflow"):
        require("tensorflow")
    elif runtime.startswith("jax"):
        require("jax")
    seen, backend = observed(runtime, description, "bf16")
    assert seen["matmul"] == ["bfloat16"], seen
    expected = {
        "bert": {"layer_norm", "attention"},
        "gpt2": {"layer_norm", "attention"},
        "llama": {"layer_norm", "attention"},  # its RMSNorm observed as the layer_norm class
        "resnet": {"conv", "batch_norm"},
    }
    assert expected.get(description.arch, set()) <= set(seen), seen  # each op class the model has is seen
    assert policy_mismatches("bf16", seen) == [], seen
    for op_class in {"layer_norm", "softmax", "batch_norm"} & set(seen):
        assert seen[op_class] == ["float32"], seen
    for op_class in {"conv", "attention"} & set(seen):
        assert seen[op_class] == ["bfloat16"], seen
    assert weight_dtypes(backend) == {"float32"}
    fp32, _ = observed(runtime, description, "fp32")
    assert set(fp32) == set(seen) and all(dtypes == ["float32"] for dtypes in fp32.values()), fp32


@pytest.mark.parametrize("runtime", ["tensorflow:function", "jax:jit"])
@pytest.mark.parametrize("description", model_params())
def test_bf16_parity_within_the_model_limit(runtime: str, description: ModelDescription) -> None:
    """The mixed policy's outputs against the float64 reference: within the model's bf16 limit, and above the
    fp32 tolerance (bfloat16 really computed)."""
    require(runtime.split(":")[0])
    check, _, backend = run_bf16(runtime, description)
    assert_bf16_parity(check, description)
    settings = backend.configure_precision()
    assert "mixed precision" in str(settings["bf16_mechanism"])
    if runtime.startswith("tensorflow"):  # whether TF's own kernels are oneDNN's is stored with the cell
        default = bool(TF_ONEDNN_DEFAULT_FLAGS & cpu_simd_flags())  # DefaultOneDnnPolicy on Linux
        assert settings["onednn_ops"] is {"0": False, "1": True}.get(
            os.environ.get("TF_ENABLE_ONEDNN_OPTS", ""), default
        )


def test_bf16_inputs_stay_as_made() -> None:
    """Float inputs stay float32 and token ids int32 in every framework: the model code casts at its matmuls."""
    require("tensorflow")
    require("jax")
    for runtime in ("tensorflow:eager", "jax:jit"):
        backend = create_backend(runtime, "cpu", Settings(), dtype="bf16")
        tokens = backend.make_inputs(get_model("gpt2-tiny").make_inputs(2, 8, 0))
        floats = backend.make_inputs(get_model("mlp").make_inputs(2, None, 0))
        assert [str(np.dtype(t.dtype.name if hasattr(t.dtype, "name") else t.dtype)) for t in tokens] == ["int32"] * 2
        assert str(np.dtype(floats[0].dtype.name if hasattr(floats[0].dtype, "name") else floats[0].dtype)) == "float32"


# -- end to end, in a worker ---------------------------------------------------------------------
def _run_in_worker(model: str, runtime: str) -> None:
    from fwbench.runner.manager import run_worker

    seq_len = 16 if get_model(model).has_sequence else None
    outcome = run_worker(
        Case(model, runtime, batch_size=2, seq_len=seq_len, dtype="bf16"), Settings(threads=1, max_time_s=0.3)
    )
    assert outcome.status == "ok", outcome.reason
    check = outcome.details["parity"]
    assert check["ok"] and check["tolerance_rel_l2"] == parity_tolerance(model, "bf16")
    assert max(o["rel_l2"] for o in check["outputs"].values()) > FP32_TOLERANCE, check["outputs"]
    precision = outcome.details["precision"]  # what the worker's framework showed, stored with the cell
    assert precision["policy"] == "bf16" and precision["mismatches"] == [], precision
    assert precision["observed"]["matmul"] == ["bfloat16"], precision
    assert outcome.details["matmul_precision"]["bf16_mechanism"]
    assert outcome.samples and outcome.fields["median_s"] > 0


def test_bf16_cell_in_a_worker() -> None:
    _run_in_worker("bert-tiny", "torch:eager")


@pytest.mark.slow
@pytest.mark.matrix  # make test runs test_bf16_cell_in_a_worker, and jax:jit's bf16 worker in test_verify_runs_bf16
@pytest.mark.parametrize(
    "model, runtime",
    [
        ("resnet-tiny", "tensorflow:function"),
        ("gpt2-tiny", "jax:jit"),
        ("bert-tiny", "keras:jax"),
        ("resnet-tiny", "keras:torch"),
    ],
)
def test_bf16_cells_in_workers(model: str, runtime: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    _run_in_worker(model, runtime)


@pytest.mark.slow
def test_verify_runs_bf16(plugin_env: dict[str, str], tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """``fwbench verify --dtype bf16`` (in this process; its workers are subprocesses): a bf16 runtime passes at the
    bf16 tolerance with a bf16-sized error; a runtime that cannot compute in bf16 (the fp32-only fake) is skipped,
    naming why, as `run` skips it. (torch:eager's bf16 worker: test_bf16_cell_in_a_worker.)"""
    from fwbench.cli import main

    args = ("--models", "mlp", "--runtimes", "jax:jit,fake:sleep", "--dtype", "bf16", "--threads", "1")
    code = main(["verify", *args, "--dump", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    text = " ".join(out.split())
    assert "fwbench verify, bf16" in text and text.count(" ok ") == 1, text
    assert "skipped: fake:sleep cannot compute in bf16 (it computes in fp32)" in text, text
    description = get_model("mlp")
    with np.load(tmp_path / "mlp" / "inputs.npz") as inputs:
        reference = reference_outputs(description, description.canonical_weights(0), {"x": inputs["x"]})["logits"]
    with np.load(tmp_path / "mlp" / "jax_jit.npz") as outputs:
        error = float(np.linalg.norm(outputs["logits"] - reference) / np.linalg.norm(reference))
    assert FP32_TOLERANCE < error <= PARITY_REL_L2_TOLERANCE["bf16"], error
