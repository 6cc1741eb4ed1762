"""The Keras 3 models and the ``keras:<backend>`` backends: parity with the float64 references on every
Keras backend (the GELU-sensitive check included), the timed predict step, the NHWC inputs, the
resolved jit_compile, weight-map errors, and one refusal to mix Keras backends in a process.

A process holds one Keras backend (KERAS_BACKEND is read when keras is first imported), so each
backend runs in its own subprocess: this file run as a script, ``python test_keras_models.py <backend> <part>``,
does everything for that backend and the part's models and prints one JSON report; the tests assert on it. This pytest
process never imports keras. ``make test`` checks every model on the torch backend (each Keras model's code once)
and the MLP on the others (DEFAULT_MODELS); the other models on tensorflow and jax are the matrix's
(``make test-matrix``), as is the bert-tiny worker cell.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BACKENDS = ("tensorflow", "jax", "torch")
MODEL_NAMES = ("mlp", "bert-tiny", "distilbert-tiny", "gpt2-tiny", "resnet-tiny")
TEXT = ("bert-tiny", "distilbert-tiny", "gpt2-tiny")
PARITY_TOLERANCE = 1e-5  # float32 lands near 4e-7 on every backend
OUTPUTS = {
    "mlp": ["logits"],
    "bert-tiny": ["last_hidden_state", "pooler_output"],
    "distilbert-tiny": ["last_hidden_state"],
    "gpt2-tiny": ["last_hidden_state", "logits"],
    "resnet-tiny": ["logits"],
}
REPORT_TIMEOUT_S = 300
CHECKED_ONCE = "torch"  # the backend whose subprocess also checks weight-map errors and the one-backend rule
# The models of each backend's report in make test (its default part); its matrix part has the others.
DEFAULT_MODELS = {"torch": MODEL_NAMES, "tensorflow": ("mlp",), "jax": ("mlp",)}


def part_of(backend: str, model: str) -> str:
    """The part of ``backend``'s report that checks ``model``: default (make test) or matrix (make test-matrix)."""
    return "default" if model in DEFAULT_MODELS[backend] else "matrix"


def cells(models: tuple[str, ...] = MODEL_NAMES) -> list[Any]:
    """(backend, model) test parameters, marked ``matrix`` where the backend's matrix part checks the model."""
    return [
        pytest.param(backend, model, id=f"{model}-{backend}", marks=pytest.mark.matrix)
        if part_of(backend, model) == "matrix"
        else pytest.param(backend, model, id=f"{model}-{backend}")
        for backend in BACKENDS
        for model in models
    ]


# -- the subprocess side ------------------------------------------------------------------------
def _descriptions() -> dict[str, Any]:
    from fwbench.models import get_model
    from fwbench.models.bert import Bert, BertConfig

    distil = Bert("distilbert-tiny", BertConfig(layers=2, hidden=128, heads=2, intermediate=512, distil=True))
    return {name: distil if name == "distilbert-tiny" else get_model(name) for name in MODEL_NAMES}


def _rel_l2(got: Any, reference: Any) -> float:
    import numpy as np

    return float(np.linalg.norm(got.astype(np.float64) - reference) / np.linalg.norm(reference))


def _run_cell(
    create: Any, description: Any, weights: dict[str, Any], timed_shape: tuple[int, int | None] | None
) -> dict[str, Any]:
    """What a worker does with a backend: build, inputs, compile, first call and timed steps at one shape
    (unless ``timed_shape`` is None), then the parity check at the description's parity shape (compile
    again, infer, to_numpy)."""
    import numpy as np

    backend = create()
    backend.build(description, weights)
    repeat_equal, traces_timed = None, None
    if timed_shape is not None:
        timed_inputs = backend.make_inputs(description.make_inputs(*timed_shape, 0))
        backend.compile(timed_inputs)
        step = backend.make_step(timed_inputs)
        first = backend.to_numpy(step())
        for _ in range(3):
            again = backend.to_numpy(step())
        repeat_equal = all(np.array_equal(first[name], again[name]) for name in first)
        tracing = getattr(backend._predict, "experimental_get_tracing_count", None)  # keras:tensorflow
        traces_timed = tracing() if tracing else None
    arrays = description.make_inputs(*description.parity_shape(), 0)
    inputs = backend.make_inputs(arrays)
    backend.compile(inputs)
    outputs = backend.infer(inputs)
    backend.sync(outputs)
    got = backend.to_numpy(outputs)
    raw_dtypes = sorted({backend.keras.backend.standardize_dtype(o.dtype) for o in outputs})  # before to_numpy
    reference = description.reference_forward(weights, arrays)
    return {
        "outputs": list(got),
        "rel_l2": {name: _rel_l2(got[name], reference[name]) for name in reference},
        "shapes_ok": all(got[name].shape == reference[name].shape for name in reference),
        "dtypes": sorted({str(a.dtype) for a in got.values()}),
        "repeat_equal": repeat_equal,
        "input_shapes": [list(t.shape) for t in inputs],
        "jit_compile": backend.jit_compile,
        "tracing_count_timed": traces_timed,
        "raw_dtypes": raw_dtypes,
        "variable_dtypes": sorted({v.dtype for v in backend.model.weights}),
        "observed": backend.observe_precision(inputs),
        "dtype_policy": backend.keras.config.dtype_policy().name,
    }


def _weight_errors(description: Any) -> dict[str, str]:
    """The ValueError text of a build with a tensor missing, an extra tensor, and wrong shapes."""
    import importlib

    import numpy as np

    build = importlib.import_module(f"fwbench.frameworks.keras.{description.arch}").build_model
    weights = description.canonical_weights(0)
    first, last = list(weights)[0], list(weights)[-1]
    cases = {
        "missing": {k: v for k, v in weights.items() if k != last},
        "unused": {**weights, "extra.weight": np.zeros(2, np.float32)},
        "shape_first": {**weights, first: np.zeros((3, 3), np.float32)},
        "shape_last": {**weights, last: np.zeros((3, 3), np.float32)},
    }
    errors = {}
    for case, bad in cases.items():
        try:
            build(description, bad, "cpu")
            errors[case] = "no error"
        except ValueError as exc:
            errors[case] = f"{exc}"
    errors["first"], errors["last"] = first, last
    return errors


def _mapping_errors() -> dict[str, str]:
    """load_canonical's own checks, which a complete architecture map never reaches: a variable left
    unset, a map to a path the model does not have, two tensors mapped onto one variable."""
    from fwbench.frameworks.keras.mlp import mlp_model
    from fwbench.frameworks.keras.weights import load_canonical
    from fwbench.models import get_model
    from fwbench.models.mlp import MLP

    description = get_model("mlp")
    assert isinstance(description, MLP)
    weights = description.canonical_weights(0)
    model = mlp_model(description)
    full = {
        f"{p}.{kind}": f"{p}/{'kernel' if kind == 'weight' else 'bias'}"
        for p, _, _ in description.layers
        for kind in ("weight", "bias")
    }
    transposed = {name: (lambda a: a.T) for name in full if name.endswith(".weight")}
    cases = {
        "unset": (
            {k: v for k, v in weights.items() if k != "fc1.bias"},
            {k: v for k, v in full.items() if k != "fc1.bias"},
        ),
        "unknown": (weights, {**full, "fc1.bias": "fc9/bias"}),
        "twice": ({**weights, "extra.bias": weights["fc1.bias"]}, {**full, "extra.bias": "fc1/bias"}),
    }
    errors = {}
    for case, (tensors, mapping) in cases.items():
        try:
            load_canonical(model, tensors, mapping, transposed)
            errors[case] = "no error"
        except ValueError as exc:
            errors[case] = str(exc)
    return errors


def part_models(backend: str, part: str) -> tuple[str, ...]:
    """The models ``part`` of ``backend``'s report checks."""
    return tuple(model for model in MODEL_NAMES if part_of(backend, model) == part)


def report(backend_name: str, part: str) -> dict[str, Any]:
    """``backend_name``'s settings, and its fp32 and bf16 cells of the models of ``part``; in the default part of
    CHECKED_ONCE also the backend-independent checks."""
    models = part_models(backend_name, part)
    from fwbench.frameworks.keras import backend as keras_backend

    frameworks = ("keras", "tensorflow", "torch", "jax")
    result: dict[str, Any] = {"loaded_by_module_import": [m for m in frameworks if m in sys.modules]}
    from fwbench.spec import Settings

    settings = Settings(threads=1)
    backend = keras_backend.create_backend(backend_name, "cpu", settings)
    result["threads"] = backend.configure_threads(1, 1)
    result["precision"] = backend.configure_precision()
    result["versions"] = backend.versions()
    import keras

    result["keras_backend"] = keras.backend.backend()

    from model_checks import GELU_TOLERANCE, amplified_weights

    def create() -> Any:
        return keras_backend.create_backend(backend_name, "cpu", settings)

    descriptions = {name: d for name, d in _descriptions().items() if name in models}
    result["models"] = {}
    for name, description in descriptions.items():
        timed_shape = (1, 8) if description.has_sequence else (1, None)
        cell = _run_cell(create, description, description.canonical_weights(0), timed_shape)
        if name in TEXT:  # weights that make erf and tanh GELU differ well above the tolerance
            amplified = _run_cell(create, description, amplified_weights(description), None)
            cell["gelu_rel_l2"] = amplified["rel_l2"]
            cell["gelu_tolerance"] = GELU_TOLERANCE
        result["models"][name] = cell

    def create_bf16() -> Any:
        return keras_backend.create_backend(backend_name, "cpu", settings, dtype="bf16")

    result["bf16_precision"] = create_bf16().configure_precision()
    result["bf16"] = {
        name: _run_cell(create_bf16, description, description.canonical_weights(0), None)
        for name, description in descriptions.items()
    }
    keras.config.set_dtype_policy("float32")  # back to the default for the checks below

    if backend_name == CHECKED_ONCE and part == "default":  # backend-independent checks, in the quickest subprocess
        result["weight_errors"] = {name: _weight_errors(d) for name, d in _descriptions().items()}
        result["mapping_errors"] = _mapping_errors()
        other = "tensorflow"  # which keras on torch does not import
        try:
            keras_backend.create_backend(other, "cpu", settings)
            result["other_backend"] = "no error"
        except RuntimeError as exc:
            result["other_backend"] = str(exc)
        result["other_framework_loaded"] = other in sys.modules
    return result


# -- the pytest side ----------------------------------------------------------------------------
@functools.cache
def _gelu_swap_error(model: str) -> float:
    from model_checks import amplified_weights, gelu_swap_error

    description = _descriptions()[model]
    inputs = description.make_inputs(*description.parity_shape(), 0)
    return gelu_swap_error(description, amplified_weights(description), inputs)


def _environment(keras_home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "XLA_FLAGS", "KERAS_TORCH_DEVICE")}
    root = str(Path(__file__).resolve().parents[1])
    env.update(
        OMP_NUM_THREADS="1",
        TF_CPP_MIN_LOG_LEVEL="2",
        KERAS_HOME=str(keras_home),
        PYTHONPATH=os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")])),
    )
    return env


def _part_reports(env: dict[str, str], part: str) -> dict[str, dict[str, Any]]:
    """report()'s JSON for each Keras backend with models in ``part``; the subprocesses run side by side."""
    procs = {
        b: subprocess.Popen(
            [sys.executable, __file__, b, part], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        for b in BACKENDS
        if part_models(b, part)
    }
    results: dict[str, dict[str, Any]] = {}
    failures = []
    for name, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=REPORT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        if proc.returncode != 0:
            failures.append(f"keras:{name} exited with {proc.returncode}:\n{err[-4000:]}")
            continue
        results[name] = json.loads(out.strip().splitlines()[-1])
    assert not failures, "\n".join(failures)
    return results


class Reports:
    """The reports of each part (default, matrix), each computed when a test first asks for it: make test computes
    the default part only, make test-matrix the matrix part only."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.parts: dict[str, dict[str, dict[str, Any]] | str] = {}  # a part's reports, or why they failed

    def part(self, name: str) -> dict[str, dict[str, Any]]:
        if name not in self.parts:
            try:
                self.parts[name] = _part_reports(self.env, name)
            except AssertionError as exc:
                self.parts[name] = str(exc)
        done = self.parts[name]
        if isinstance(done, str):
            pytest.fail(done)
        return done

    def backend(self, backend: str) -> dict[str, Any]:
        """``backend``'s report in the default part: its settings (every backend has a model there)."""
        return self.part("default")[backend]

    def of(self, backend: str, model: str) -> dict[str, Any]:
        """``backend``'s report in the part that checks ``model``."""
        return self.part(part_of(backend, model))[backend]

    def checked_once(self) -> dict[str, Any]:
        """The report with the backend-independent checks."""
        return self.part("default")[CHECKED_ONCE]


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> Reports:
    """One report per Keras backend and part, computed on first use."""
    return Reports(_environment(tmp_path_factory.mktemp("keras_home")))


@pytest.mark.parametrize("backend", BACKENDS)
def test_keras_is_imported_late_and_settings_reported(reports: Reports, backend: str) -> None:
    r = reports.backend(backend)
    assert r["loaded_by_module_import"] == []  # keras is imported only once KERAS_BACKEND is set
    assert r["keras_backend"] == backend
    threads = r["threads"]
    assert threads["keras_backend"] == backend and "layout" not in threads
    if backend != "jax":  # jax reports the CPUs it may use: the worker's pinning, not an API, bounds it
        assert threads["intra_op"] == 1 and threads["inter_op"] == 1
    # Keras' "auto": XLA via jax.jit on jax; no XLA for TF on a machine without a GPU; never torch.compile
    assert threads["jit_compile"] is (backend == "jax")
    if backend == "jax":
        assert threads["budget_at_import"] == 1 and "--xla_cpu_multi_thread_eigen=false" in threads["xla_flags"]
    assert r["precision"]["keras_floatx"] == "float32" and r["precision"]["keras_dtype_policy"] == "float32"
    expected_precision = {
        "tensorflow": ("tensor_float_32_execution", False),
        "jax": ("jax_default_matmul_precision", "highest"),
        "torch": ("float32_matmul_precision", "highest"),
    }[backend]
    assert r["precision"][expected_precision[0]] == expected_precision[1]
    assert "keras" in r["versions"] and backend in r["versions"]


@pytest.mark.parametrize(("backend", "model"), cells())
def test_outputs_match_the_float64_reference(reports: Reports, backend: str, model: str) -> None:
    cell = reports.of(backend, model)["models"][model]
    assert cell["outputs"] == OUTPUTS[model] and cell["shapes_ok"] and cell["dtypes"] == ["float32"]
    assert all(error < PARITY_TOLERANCE for error in cell["rel_l2"].values()), cell["rel_l2"]
    assert cell["repeat_equal"]  # the timed steps recompute the same outputs (jax: the carried state)
    assert cell["jit_compile"] is (backend == "jax")
    if backend == "tensorflow":
        assert cell["tracing_count_timed"] == 1  # first call and timed steps share one trace
    if model == "resnet-tiny":
        assert cell["input_shapes"] == [[2, 64, 64, 3]]  # NCHW (2, 3, 64, 64) given to Keras as NHWC


@pytest.mark.parametrize(("backend", "model"), cells())
def test_bf16_is_the_mixed_bfloat16_policy(reports: Reports, backend: str, model: str) -> None:
    """bf16: Keras' mixed_bfloat16 policy (with fwbench's float32 layer norms and residual stream), set before
    building: float32 variables, parity within the bf16 tolerance yet above the fp32 one (so it really computed
    in bfloat16)."""
    from fwbench.precision import policy_mismatches
    from fwbench.runner.tolerances import PARITY_REL_L2_TOLERANCE

    part = reports.of(backend, model)
    precision = part["bf16_precision"]
    assert precision["keras_dtype_policy"] == "mixed_bfloat16"
    assert "keras mixed_bfloat16 policy" in precision["bf16_mechanism"]
    assert "float32 embeddings, layer norms and residual stream" in precision["bf16_mechanism"]
    cell = part["bf16"][model]
    assert cell["dtype_policy"] == "mixed_bfloat16" and cell["variable_dtypes"] == ["float32"]
    # Outputs of Dense layers are bfloat16; DistilBERT's one output is a float32 layer norm under the policy.
    assert ("bfloat16" in cell["raw_dtypes"]) != model.startswith("distilbert"), cell["raw_dtypes"]
    assert cell["dtypes"] == ["float32"] and cell["shapes_ok"]
    # the backend's own graph (jaxpr, tf graph, dispatched aten ops) follows the policy, op class by op class
    observed = cell["observed"]
    assert observed["matmul"] == ["bfloat16"] and policy_mismatches("bf16", observed) == [], observed
    if model in TEXT:
        assert observed["layer_norm"] == ["float32"] and observed["attention"] == ["bfloat16"], observed
    if model.startswith("resnet"):
        assert observed["conv"] == ["bfloat16"], observed
    fp32_observed = part["models"][model]["observed"]
    assert fp32_observed["matmul"] == ["float32"] and policy_mismatches("fp32", fp32_observed) == [], fp32_observed
    errors = cell["rel_l2"].values()
    assert all(e <= PARITY_REL_L2_TOLERANCE["bf16"] for e in errors), cell["rel_l2"]
    assert max(errors) > PARITY_REL_L2_TOLERANCE["fp32"], cell["rel_l2"]  # float32 lands near 4e-7
    fp32_cell = part["models"][model]  # built before, under the default policy
    assert fp32_cell["dtype_policy"] == "float32" and fp32_cell["raw_dtypes"] == ["float32"]


@pytest.mark.parametrize(("backend", "model"), cells(TEXT))
def test_the_right_gelu(reports: Reports, backend: str, model: str) -> None:
    """With amplified FFN weights a swapped GELU moves the outputs by more than 4x the tolerance;
    each backend stays within it."""
    cell = reports.of(backend, model)["models"][model]
    assert _gelu_swap_error(model) > 4 * cell["gelu_tolerance"]
    assert all(error < cell["gelu_tolerance"] for error in cell["gelu_rel_l2"].values()), cell["gelu_rel_l2"]


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_weight_map_errors_are_clear(reports: Reports, model: str) -> None:
    errors = reports.checked_once()["weight_errors"][model]
    first, last = errors["first"], errors["last"]
    assert f"tensors missing ['{last}']" in errors["missing"]
    assert "tensors unused ['extra.weight']" in errors["unused"]
    for case, name in (("shape_first", first), ("shape_last", last)):
        assert errors[case].startswith(f"{name} -> ") and ": shape (3, 3)" in errors[case], errors[case]


def test_load_canonical_refuses_incomplete_maps(reports: Reports) -> None:
    errors = reports.checked_once()["mapping_errors"]
    assert "variables unset ['fc1/bias']" in errors["unset"]
    assert "unknown ['fc9/bias']" in errors["unknown"] and "variables unset ['fc1/bias']" in errors["unknown"]
    assert "a variable is the target of more than one tensor" in errors["twice"]


def test_one_keras_backend_per_process(reports: Reports) -> None:
    message = reports.checked_once()["other_backend"]
    assert "keras:tensorflow needs Keras' tensorflow backend" in message and "torch backend" in message
    assert not reports.checked_once()["other_framework_loaded"]  # refused before importing tensorflow


@pytest.mark.parametrize("model", [pytest.param("bert-tiny", marks=pytest.mark.matrix), "resnet-tiny"])
def test_keras_jax_runs_in_a_worker_with_parity(model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fwbench.runner.manager import run_worker
    from fwbench.spec import Case, Settings

    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    seq_len = 16 if model == "bert-tiny" else None
    outcome = run_worker(Case(model, "keras:jax", batch_size=2, seq_len=seq_len), Settings(threads=1, max_time_s=0.3))
    assert outcome.status == "ok", outcome.reason
    assert outcome.details["parity"]["ok"]
    threads = outcome.details["threads_effective"]
    assert threads["intra_op"] == 1 and threads["jit_compile"] is True and "layout" not in threads
    # the image model says its layout (the cell stores it once, beside the threads): Keras is channels_last
    assert outcome.details.get("layout") == ("NHWC" if model == "resnet-tiny" else None)
    assert outcome.details["versions"]["keras"]


if __name__ == "__main__":
    print(json.dumps(report(sys.argv[1], sys.argv[2])))
