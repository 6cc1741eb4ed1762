"""bf16 inference, each framework's own way: torch autocast (every mode), TensorFlow variables and float
inputs cast to tf.bfloat16, JAX's parameter pytree and float inputs cast to jnp.bfloat16 (Keras'
mixed_bfloat16 policy is checked in test_keras_models.py, one subprocess per Keras backend).

Each in-process check runs the backend as a worker does (build, inputs, compile, infer, to_numpy) and
asserts: parity within the bf16 tolerance against the float64 reference; that bf16 really happened
(some output is bfloat16 before ``to_numpy``, and the worst error is above the fp32 tolerance, which
a float32 computation stays far below); that ``configure_precision`` names the mechanism.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from fwbench.frameworks import create_backend
from fwbench.frameworks.base import Backend, UnsupportedDtype
from fwbench.models import get_model
from fwbench.models.base import ModelDescription
from fwbench.models.bert import Bert, BertConfig
from fwbench.runner.cell import parity
from fwbench.runner.tolerances import PARITY_REL_L2_TOLERANCE
from fwbench.spec import RUNNABLE_DTYPES, Case, Settings

DISTIL_TINY = Bert("distilbert-tiny", BertConfig(layers=2, hidden=128, heads=2, intermediate=512, distil=True))
DESCRIPTIONS = [get_model("mlp"), get_model("bert-tiny"), DISTIL_TINY, get_model("gpt2-tiny"), get_model("resnet-tiny")]
FP32_TOLERANCE = PARITY_REL_L2_TOLERANCE["fp32"]


def by_name(description: ModelDescription) -> str:
    return description.name


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
    return parity(got, description.reference_forward(weights, arrays), "bf16"), raw_dtypes, backend


def assert_bf16_parity(check: dict[str, Any]) -> None:
    errors = {name: output["rel_l2"] for name, output in check["outputs"].items()}
    assert check["ok"] and check["tolerance_rel_l2"] == PARITY_REL_L2_TOLERANCE["bf16"], errors
    # Computed in bfloat16, not silently in float32: float32 lands near 1e-7 on these models.
    assert max(errors.values()) > FP32_TOLERANCE, errors


# -- spec, CLI, backend interface ---------------------------------------------------------------
def test_bf16_is_runnable_and_selectable() -> None:
    from fwbench.cli import UsageError, build_parser, plan_from_args

    assert "bf16" in RUNNABLE_DTYPES
    args = build_parser().parse_args(
        ["run", "--models", "mlp", "--runtimes", "torch:eager", "--dtype", "bf16", "--threads", "1"]
    )
    plan = plan_from_args(args)
    assert plan.cases and {case.dtype for case in plan.cases} == {"bf16"}
    assert (
        build_parser().parse_args(["verify", "--models", "mlp", "--runtimes", "jax:jit", "--dtype", "bf16"]).dtype
        == "bf16"
    )
    with pytest.raises(UsageError, match="invalid choice: 'fp16' \\(choose from 'fp32', 'bf16'\\)"):
        build_parser().parse_args(["run", "--models", "mlp", "--runtimes", "torch:eager", "--dtype", "fp16"])


class _Fp32Only(Backend):
    """A backend that declares no dtypes: fp32 only (the base class default)."""

    framework = "fp32only"
    modes = ("eager",)

    def configure_threads(self, intra_op: int, inter_op: int) -> dict[str, Any]:
        return {}

    def configure_precision(self) -> dict[str, object]:
        return {}

    def make_inputs(self, arrays: dict[str, np.ndarray]) -> tuple[Any, ...]:
        return tuple(arrays.values())

    def compile(self, inputs: Sequence[Any]) -> None:
        pass

    def infer(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
        return tuple(inputs)

    def sync(self, outputs: Any) -> None:
        pass

    def to_numpy(self, outputs: Sequence[Any]) -> dict[str, np.ndarray]:
        return {}

    def versions(self) -> dict[str, str]:
        return {}


def test_a_backend_refuses_a_dtype_it_does_not_declare() -> None:
    assert _Fp32Only("eager", "cpu", Settings()).dtype == "fp32"
    with pytest.raises(UnsupportedDtype, match="fp32only:eager cannot compute in bf16; allowed: fp32"):
        _Fp32Only("eager", "cpu", Settings(), dtype="bf16")


# -- torch: autocast ----------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["eager", "script"])
@pytest.mark.parametrize("description", DESCRIPTIONS, ids=by_name)
def test_torch_bf16_autocast(description: ModelDescription, mode: str) -> None:
    torch = pytest.importorskip("torch")
    seen: list[torch.dtype] = []  # output dtypes of every nn.Linear / nn.Conv2d call (eager only)

    def record(module: torch.nn.Module, args: Any, output: Any) -> None:
        if isinstance(module, (torch.nn.Linear, torch.nn.Conv2d)):
            seen.append(output.dtype)

    handle = torch.nn.modules.module.register_module_forward_hook(record)
    try:
        check, _, backend = run_bf16(f"torch:{mode}", description)
    finally:
        handle.remove()
    assert_bf16_parity(check)
    # Autocast leaves some outputs float32 (e.g. BERT's residual stream), but every matmul is bfloat16:
    if mode == "eager":
        assert seen and set(seen) == {torch.bfloat16}
    else:  # the frozen TorchScript graph holds the casts recorded while tracing under autocast
        assert "BFloat16" in str(backend._forward.graph)
    assert "torch.autocast(cpu, bfloat16)" in str(backend.configure_precision()["bf16_mechanism"])
    # autocast keeps the weights float32 (it casts them per op)
    assert {str(p.dtype) for p in backend.model.parameters()} == {"torch.float32"}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["compile", "export"])
def test_torch_compiled_bf16_autocast(mode: str) -> None:
    """torch.compile and torch.export (AOTInductor) keep the autocast region: bf16 in the compiled code."""
    pytest.importorskip("torch")
    check, raw_dtypes, _ = run_bf16(f"torch:{mode}", get_model("mlp"))
    assert_bf16_parity(check)
    assert raw_dtypes == ["torch.bfloat16"]  # the last nn.Linear's output, computed in bfloat16


def test_torch_fp32_is_unchanged_by_the_dtype_argument() -> None:
    torch = pytest.importorskip("torch")
    description = get_model("mlp")
    backend = create_backend("torch:eager", "cpu", Settings(threads=1))
    assert backend.dtype == "fp32" and "bf16_mechanism" not in backend.configure_precision()
    backend.build(description, description.canonical_weights(0))
    inputs = backend.make_inputs(description.make_inputs(2, None, 0))
    try:
        backend.compile(inputs)
        assert backend._forward is backend.model and backend.infer(inputs)[0].dtype == torch.float32
    finally:
        backend._inference_mode.__exit__(None, None, None)


# -- TensorFlow: variables and float inputs cast ------------------------------------------------
@pytest.mark.parametrize("mode", ["eager", "function", "xla"])
@pytest.mark.parametrize("description", DESCRIPTIONS, ids=by_name)
def test_tensorflow_bf16_variables(description: ModelDescription, mode: str) -> None:
    tf = pytest.importorskip("tensorflow")
    check, raw_dtypes, backend = run_bf16(f"tensorflow:{mode}", description)
    assert_bf16_parity(check)
    assert raw_dtypes == ["<dtype: 'bfloat16'>"] * len(description.output_names)
    variables = backend.model.variables
    assert variables and {v.dtype for v in variables} == {tf.bfloat16}
    assert "tf.bfloat16" in str(backend.configure_precision()["bf16_mechanism"])


def test_tensorflow_bf16_keeps_token_ids_and_casts_every_variable_once() -> None:
    tf = pytest.importorskip("tensorflow")
    description = get_model("bert-tiny")
    fp32 = create_backend("tensorflow:eager", "cpu", Settings())
    bf16 = create_backend("tensorflow:eager", "cpu", Settings(), dtype="bf16")
    for backend in (fp32, bf16):
        backend.build(description, description.canonical_weights(0))
    assert len(bf16.model.variables) == len(fp32.model.variables)  # replaced, not added
    for cast, original in zip(bf16.model.variables, fp32.model.variables):
        assert cast.name == original.name and cast.shape == original.shape
        np.testing.assert_array_equal(cast.numpy(), tf.cast(original, tf.bfloat16).numpy())  # rounded once
    inputs = bf16.make_inputs(description.make_inputs(2, 16, 0))
    assert [t.dtype for t in inputs] == [tf.int32] * 3


def test_tensorflow_cast_variables_refuses_what_it_cannot_reach() -> None:
    tf = pytest.importorskip("tensorflow")
    from fwbench.frameworks.tensorflow.weights import cast_variables

    class Hidden(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.reachable = [tf.Variable(1.0)]
            self._private = tf.Variable(2.0, name="private")  # tracked by tf.Module, but not walked

    with pytest.raises(ValueError, match="variables not cast to bfloat16: \\['private:0'\\]"):
        cast_variables(Hidden(), tf.bfloat16)


# -- JAX: the parameter pytree and float inputs cast ---------------------------------------------
@pytest.fixture(scope="module")
def jax_backend_module() -> Any:
    """fwbench.frameworks.jax.backend, imported without leaving its XLA variables in this environment."""
    pytest.importorskip("jax")
    saved = {name: os.environ.get(name) for name in ("XLA_FLAGS", "XLA_PYTHON_CLIENT_PREALLOCATE")}
    from fwbench.frameworks.jax import backend

    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    return backend


@pytest.mark.parametrize("description", DESCRIPTIONS, ids=by_name)
def test_jax_bf16_params(jax_backend_module: Any, description: ModelDescription) -> None:
    import jax
    import jax.numpy as jnp

    check, raw_dtypes, backend = run_bf16("jax:jit", description)
    assert_bf16_parity(check)
    assert raw_dtypes == ["bfloat16"] * len(description.output_names)
    passed = jax.tree.leaves(backend._params)  # what the jitted function is called with
    assert len(passed) == len(description.canonical_weights(0)) or description.arch == "resnet"  # BN folded
    assert {leaf.dtype for leaf in passed} == {jnp.dtype(jnp.bfloat16)}
    assert "jnp.bfloat16" in str(backend.configure_precision()["bf16_mechanism"])


def test_jax_bf16_keeps_token_ids(jax_backend_module: Any) -> None:
    import jax.numpy as jnp

    description = get_model("gpt2-tiny")
    backend = create_backend("jax:jit", "cpu", Settings(), dtype="bf16")
    assert [a.dtype for a in backend.make_inputs(description.make_inputs(2, 8, 0))] == [jnp.int32] * 2
    assert [a.dtype for a in backend.make_inputs(get_model("mlp").make_inputs(2, None, 0))] == [jnp.bfloat16]


# -- end to end, in a worker ---------------------------------------------------------------------
def _run_in_worker(model: str, runtime: str) -> None:
    from fwbench.runner.manager import run_worker

    seq_len = 16 if get_model(model).has_sequence else None
    outcome = run_worker(
        Case(model, runtime, batch_size=2, seq_len=seq_len, dtype="bf16"), Settings(threads=1, max_time_s=0.3)
    )
    assert outcome.status == "ok", outcome.reason
    check = outcome.details["parity"]
    assert check["ok"] and check["tolerance_rel_l2"] == PARITY_REL_L2_TOLERANCE["bf16"]
    assert max(o["rel_l2"] for o in check["outputs"].values()) > FP32_TOLERANCE, check["outputs"]
    assert outcome.details["matmul_precision"]["bf16_mechanism"]
    assert outcome.samples and outcome.fields["median_s"] > 0


def test_bf16_cell_in_a_worker() -> None:
    _run_in_worker("bert-tiny", "torch:eager")


@pytest.mark.slow
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
def test_verify_runs_bf16(plugin_env: dict[str, str], tmp_path: Any) -> None:
    """``fwbench verify --dtype bf16``: bf16 runtimes pass at the bf16 tolerance with bf16-sized errors; a
    runtime that cannot compute in bf16 (the fp32-only fake) fails, naming why."""
    from conftest import run_cli

    result = run_cli(
        "verify",
        "--models",
        "mlp",
        "--runtimes",
        "torch:eager,jax:jit,fake:sleep",
        "--dtype",
        "bf16",
        "--threads",
        "1",
        "--dump",
        str(tmp_path),
        env=plugin_env,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    text = " ".join(result.stdout.split())
    assert "fwbench verify, bf16" in text and text.count(" ok ") == 2, text
    assert "UnsupportedDtype" in text, text
    description = get_model("mlp")
    with np.load(tmp_path / "mlp" / "inputs.npz") as inputs:
        reference = description.reference_forward(description.canonical_weights(0), {"x": inputs["x"]})["logits"]
    for name in ("torch_eager", "jax_jit"):
        with np.load(tmp_path / "mlp" / f"{name}.npz") as outputs:
            error = float(np.linalg.norm(outputs["logits"] - reference) / np.linalg.norm(reference))
        assert FP32_TOLERANCE < error <= PARITY_REL_L2_TOLERANCE["bf16"], (name, error)
