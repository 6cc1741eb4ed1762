"""``fwbench diff`` and the first divergence of a mismatch: the shared checkpoints of every model, their float64
reference, the share of the tolerance each may use, and defects injected into one framework's copy of bert-tiny
(tests/fwbench_faulty_models) found at the checkpoint where they were injected, eager and compiled. ``make test``
runs each defect in one framework's eager runtime (the defect lives in the framework's model file, which the eager
runtime runs as it is); the matrix finds every defect in every framework's model file, each in one of the framework's
runtimes in turn, so that each eager and compiled runtime finds two or more (matrix_runtimes). The diffs run in this
process (``fwbench.cli.main``): their workers are the subprocesses."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import fwbench_here, loaded_model_plugin, run_args
from fwbench.models import get_model
from fwbench.models.weights_io import save_weights
from fwbench.runner.divergence import first_divergence, layer_errors, share_of_tolerance
from fwbench.store import Store

PLUGIN = "fwbench_faulty_models"
# Each framework's eager runtime, then its compiled ones (Keras: its eager torch backend, then its compiled jax one).
RUNTIMES = {
    "torch": ("torch:eager", "torch:compile"),
    "tensorflow": ("tensorflow:eager", "tensorflow:xla"),
    "jax": ("jax:jit",),
    "keras": ("keras:torch", "keras:jax"),
}
# make test: each defect once, each framework once, in the framework's eager runtime (RUNTIMES[framework][0]). Each
# compiled runtime's checkpoints are make test's elsewhere in this file (torch:script, torch:compile, tensorflow:function,
# jax:jit, keras:jax: test_diff_of_..._shows_no_divergence); finding a defect through torch:compile, tensorflow:xla and
# keras:jax is the matrix's (test_diff_names_every_defect_in_every_framework: every defect in every framework, two
# or more in each runtime). Keras finds the defect in layer 1, its checkpoints before it checked clean; torch's and
# JAX's unmodified bert-tiny are clean at every checkpoint in the backward-pass defect's diff
# (test_diff_of_unmodified_bert_tiny_... says where the others' are).
DEFAULT_RUN = {
    "transposed-query": "keras",
    "tanh-gelu": "tensorflow",
    "attention-scale": "jax",
    "layer-norm-eps": "torch",
}


@pytest.fixture
def faulty_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    yield from loaded_model_plugin(monkeypatch, PLUGIN)


def run_diff(capsys: pytest.CaptureFixture[str], model: str, runtimes: str, *extra: str) -> tuple[int, dict[str, Any]]:
    """``fwbench diff MODEL --runtimes RUNTIMES --threads 1 --format json EXTRA``: (exit status, its JSON)."""
    code, out, err = fwbench_here(
        capsys, "diff", model, "--runtimes", runtimes, "--threads", "1", "--format", "json", *extra
    )
    assert code in (0, 1) and out, (code, out, err)
    result: dict[str, Any] = json.loads(out)
    return code, result


# -- the checkpoints and their reference ------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["mlp", "bert-tiny", "gpt2-tiny", "resnet-tiny"])
def test_every_model_names_its_checkpoints_and_its_reference_computes_them_in_order(model: str) -> None:
    description = get_model(model)
    weights = description.canonical_weights(0)
    inputs = description.make_inputs(*description.parity_shape(), 0)
    names = description.checkpoint_names()
    reference = description.reference_checkpoints(weights, inputs)
    assert reference is not None and tuple(reference) == names and len(set(names)) == len(names)
    assert all(value.dtype == np.float64 for value in reference.values())
    outputs = description.reference_forward(weights, inputs)
    assert outputs is not None
    last_output = {"mlp": "fc3", "bert-tiny": "encoder.layer.1", "gpt2-tiny": "ln_f", "resnet-tiny": "fc"}[model]
    first_output = description.output_names[0]
    np.testing.assert_array_equal(reference[last_output], outputs[first_output])  # the same tensor, by construction


def test_bert_and_distilbert_name_checkpoints_after_their_own_modules() -> None:
    bert, distil = get_model("bert-tiny"), get_model("distilbert-base")
    assert bert.checkpoint_names()[:4] == (
        "embeddings",
        "encoder.layer.0.attention.output",
        "encoder.layer.0.output.dense",
        "encoder.layer.0",
    )
    assert bert.checkpoint_names()[-1] == "pooler" and len(bert.checkpoint_names()) == 1 + 3 * 2 + 1
    assert distil.checkpoint_names()[1:4] == (
        "transformer.layer.0.sa_layer_norm",
        "transformer.layer.0.ffn.lin2",
        "transformer.layer.0",
    )
    assert "pooler" not in distil.checkpoint_names()


def test_a_model_without_checkpoints_is_compared_at_its_outputs() -> None:
    gemm = get_model("gemm")
    assert gemm.checkpoint_names() == () and gemm.reference_checkpoints({}, {}) is None


# -- the share of the tolerance ------------------------------------------------------------------------------------
def test_the_share_grows_with_the_square_root_of_depth_to_the_whole_tolerance() -> None:
    shares = [share_of_tolerance(1e-4, k, 5) for k in range(1, 6)]
    assert shares == sorted(shares) and shares[-1] == pytest.approx(1e-4)
    assert shares[0] == pytest.approx(1e-4 / math.sqrt(5))


def test_layer_errors_name_the_first_checkpoint_over_its_share() -> None:
    reference = {"a": np.ones(4), "b": np.ones(4), "c": np.ones(4)}
    out = {"y": np.ones(3)}
    got = {"a": np.ones(4, np.float32), "b": np.array([1, 1, 1, 1.1], np.float32), "c": np.ones(4, np.float32)}
    errors = layer_errors(out, got, out, reference, 1e-4)
    assert [(e.name, e.kind) for e in errors] == [("a", "checkpoint"), ("b", "checkpoint"), ("c", "checkpoint"),
                                                  ("y", "output")]  # fmt: skip
    first = first_divergence(errors)
    assert first is not None and first.name == "b" and first.limit == pytest.approx(1e-4 * math.sqrt(2 / 4))
    assert not errors[2].diverged  # a later checkpoint back within its share is not the first
    # A NaN, a checkpoint the runtime lacks and one of another shape all count as over.
    nan = {**got, "a": np.array([np.nan] * 4, np.float32)}
    for broken in ({k: v for k, v in got.items() if k != "a"}, {**got, "a": np.ones(5, np.float32)}, nan):
        first = first_divergence(layer_errors(out, broken, out, reference, 1e-4))
        assert first is not None and first.name == "a" and first.to_dict()["rel_l2"] is None
    # A checkpoint that is an output under another name gets the output's whole tolerance.
    aliased = layer_errors(out, got, out, {**reference, "c": out["y"]}, 1e-4)
    assert aliased[2].limit == 1e-4 and aliased[1].limit < 1e-4
    # No checkpoints (an exported file): the outputs alone, with the whole tolerance.
    only_outputs = layer_errors(out, {}, out, reference, 1e-4)
    assert [(e.name, e.limit) for e in only_outputs] == [("y", 1e-4)] and first_divergence(only_outputs) is None


@pytest.mark.slow
# -- fwbench diff end to end ---------------------------------------------------------------------------------------
def test_diff_of_unmodified_bert_tiny_shows_no_divergence_anywhere(capsys: pytest.CaptureFixture[str]) -> None:
    """Every checkpoint of each runtime within its share: torch's traced program, and a deployment engine at its
    outputs. torch:eager's and jax:jit's unmodified bert-tiny are the forward of
    test_diff_training_finds_a_defect_of_the_backward_pass_alone's diff, checked the same way there; TensorFlow's
    (tensorflow:eager) and Keras' (keras:torch) up to the defect's layer in
    test_diff_names_the_layer_where_a_defect_was_injected, and all of their checkpoints on resnet-tiny
    (tensorflow:function, keras:jax: test_diff_of_every_model_...) and the MLP (tensorflow:function, keras:torch:
    test_diff_training_compares_...); all of bert-tiny's in tensorflow:eager and keras:jax: the matrix's bert-tiny
    diff."""
    runtimes = "torch:script,onnxruntime:torch"
    code, diff = run_diff(capsys, "bert-tiny", runtimes)
    assert code == 0, diff
    assert diff["tolerance_rel_l2"] == 1e-4 and diff["checkpoints"] == list(get_model("bert-tiny").checkpoint_names())
    by_runtime = {r["runtime"]: r for r in diff["runtimes"]}
    assert list(by_runtime) == runtimes.split(",")
    for name, runtime in by_runtime.items():
        assert runtime["status"] == "ok" and runtime["first_divergence"] is None, name
        layers = runtime["layers"]
        assert all(layer["rel_l2"] <= layer["limit"] for layer in layers), name
        checkpoints = [layer["name"] for layer in layers if layer["kind"] == "checkpoint"]
        if name == "onnxruntime:torch":  # an exported file: its outputs only, and it says so
            assert checkpoints == [] and "exposes only the model's outputs" in runtime["checkpoints_unavailable"]
        else:
            assert checkpoints == diff["checkpoints"] and runtime["tapped_outputs_rel_l2"] <= 1e-4, name


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "runtimes"),
    [
        # NHWC models' checkpoints come back NCHW (TensorFlow, JAX, Keras compute ResNet channels-last)
        ("resnet-tiny", "tensorflow:function,jax:jit,keras:jax"),
        (
            "mlp",
            "torch:compile",
        ),  # torch:compile's tapped program (fullgraph), its own code beside eager's and script's
        # torch's checkpoints: make test's on bert-tiny (the backward-pass defect's diff, the unmodified bert-tiny's)
        # and the MLP (test_diff_training_compares_...)
        # the Llama layout's checkpoints in every framework's model code; in the matrix its XLA-compiled TensorFlow
        # program (torch:compile's and keras:jax's tapped programs are the same code for every model: the MLP's above,
        # resnet-tiny's; both generate with the Llama layout in tests/test_generate.py)
        ("llama-tiny", "torch:eager,tensorflow:eager,jax:jit,keras:torch"),
        pytest.param("llama-tiny", "tensorflow:xla", marks=pytest.mark.matrix),
        pytest.param("resnet-tiny", "torch:eager", marks=pytest.mark.matrix),
        # the matrix: each model's checkpoints in every framework's model code (the compiled runtimes' tapped
        # programs: above, and the defects' diffs), and the exported programs' (torch:export, tensorflow:savedmodel);
        # the MLP's model files: make test's (torch:compile above, every framework's gradients in
        # test_diff_training_compares_every_trained_gradient_in_backward_order)
        pytest.param("gpt2-tiny", "torch:eager,tensorflow:eager,jax:jit,keras:torch", marks=pytest.mark.matrix),
        pytest.param("bert-tiny", "torch:export,tensorflow:eager,tensorflow:savedmodel", marks=pytest.mark.matrix),
    ],
)
def test_diff_of_every_model_in_every_framework_shows_no_divergence(
    capsys: pytest.CaptureFixture[str], model: str, runtimes: str
) -> None:
    code, diff = run_diff(capsys, model, runtimes)
    assert code == 0, diff
    assert [runtime["runtime"] for runtime in diff["runtimes"]] == runtimes.split(",")
    for runtime in diff["runtimes"]:
        assert runtime["status"] == "ok" and runtime["first_divergence"] is None, runtime
        assert all(layer["rel_l2"] <= layer["limit"] for layer in runtime["layers"]), runtime["runtime"]
        if runtime["checkpoints_unavailable"] is None:
            checkpoints = [layer["name"] for layer in runtime["layers"] if layer["kind"] == "checkpoint"]
            assert checkpoints == diff["checkpoints"] == list(get_model(model).checkpoint_names()), runtime["runtime"]
            assert runtime["tapped_outputs_rel_l2"] <= 1e-4, runtime["runtime"]  # the tapped program, the timed one


def _weights_for(defect: str, model: str, folder: Path) -> list[str]:
    """``--weights FILE`` where the defect needs weights that exercise it (tanh-gelu: larger GELU inputs)."""
    if defect != "tanh-gelu":
        return []
    from fwbench_faulty_models import FFN_IN_SCALE

    description = get_model(model)
    weights = description.canonical_weights(0)
    for layer in range(description.config.layers):  # type: ignore[attr-defined]
        name = description.param("ffn_in", layer)  # type: ignore[attr-defined]
        weights[name] = weights[name] * FFN_IN_SCALE
    path = folder / f"{model}.safetensors"
    save_weights(description, weights, path, 0)
    return ["--weights", str(path)]


def _diff_finds(
    capsys: pytest.CaptureFixture[str], defect: str, framework: str, runtimes: tuple[str, ...], folder: Path
) -> None:
    """``fwbench diff`` of ``defect`` injected into ``framework``'s model file, in ``runtimes`` (the plugin loaded:
    the faulty_env fixture): each names the defect's checkpoint."""
    from fwbench_faulty_models import DEFECTS, model_name

    model = model_name(defect, framework)
    code, diff = run_diff(capsys, model, ",".join(runtimes), *_weights_for(defect, model, folder))
    assert code == 1, diff  # a divergence is a failure
    assert [runtime["runtime"] for runtime in diff["runtimes"]] == list(runtimes)
    for runtime in diff["runtimes"]:
        assert runtime["status"] == "ok", runtime
        first = runtime["first_divergence"]
        assert first is not None and first["name"] == DEFECTS[defect], (runtime["runtime"], first)
        assert first["rel_l2"] > 3 * first["limit"], first  # far over its share, not at the edge of it
        before = runtime["layers"][: [layer["name"] for layer in runtime["layers"]].index(first["name"])]
        assert all(layer["rel_l2"] <= 0.1 * layer["limit"] for layer in before), before  # clean up to it


@pytest.mark.slow
@pytest.mark.parametrize("defect", sorted(DEFAULT_RUN))
def test_diff_names_the_layer_where_a_defect_was_injected(
    capsys: pytest.CaptureFixture[str], defect: str, faulty_env: dict[str, str], tmp_path: Path
) -> None:
    framework = DEFAULT_RUN[defect]
    _diff_finds(capsys, defect, framework, RUNTIMES[framework][:1], tmp_path)


@pytest.mark.slow
def matrix_runtimes(defect: str, framework: str) -> tuple[str, ...]:
    """The runtimes the matrix finds ``defect`` in ``framework``'s model file with: the defect of make test's run
    in the framework's compiled runtimes, any other in one runtime, taking the framework's runtimes in turn defect
    by defect. Every defect is found in every framework's model file, and every runtime finds two or more."""
    runtimes = RUNTIMES[framework]
    if DEFAULT_RUN[defect] == framework:
        return runtimes[1:]
    return (runtimes[sorted(DEFAULT_RUN).index(defect) % len(runtimes)],)


@pytest.mark.matrix
@pytest.mark.parametrize("framework", sorted(RUNTIMES))
@pytest.mark.parametrize("defect", sorted(DEFAULT_RUN))
def test_diff_names_every_defect_in_every_framework(
    capsys: pytest.CaptureFixture[str], defect: str, framework: str, faulty_env: dict[str, str], tmp_path: Path
) -> None:
    runtimes = matrix_runtimes(defect, framework)
    if not runtimes:
        pytest.skip(f"make test runs it in {framework}'s one runtime")
    _diff_finds(capsys, defect, framework, runtimes, tmp_path)


def test_the_matrix_finds_a_defect_in_every_runtime_twice() -> None:
    """The rotation above leaves no runtime with fewer than two defects found, make test's own runs counted."""
    found = {runtime: 0 for runtimes in RUNTIMES.values() for runtime in runtimes}
    for framework in DEFAULT_RUN.values():
        found[RUNTIMES[framework][0]] += 1
    for defect in DEFAULT_RUN:
        for framework in RUNTIMES:
            for runtime in matrix_runtimes(defect, framework):
                found[runtime] += 1
    assert min(found.values()) >= 2, found


@pytest.mark.slow
def test_a_mismatch_in_run_and_verify_names_its_first_divergence(
    capsys: pytest.CaptureFixture[str], faulty_env: dict[str, str], tmp_path: Path
) -> None:
    """A timed cell (a compiled runtime: jax:jit) and a verify worker locate the mismatch's first divergence."""
    model = "bert-tiny-attention-scale-jax"
    db = tmp_path / "r.db"
    _, out, err = fwbench_here(
        capsys, *run_args("--models", model, "--runtimes", "jax:jit", "--batch-sizes", "1", "--seq-lens", "8",
                          db=db, max_time=0.2),
    )  # fmt: skip
    assert "first divergence: encoder.layer.0.attention.output" in " ".join(out.split()) + err
    with Store.open(db) as store:
        (row,) = store.results()
    assert row.status == "mismatch" and "first divergence: encoder.layer.0.attention.output" in (row.reason or "")
    assert row.parity is not None and row.parity.first_divergence is not None
    first = row.parity.first_divergence
    assert (
        first.name == "encoder.layer.0.attention.output" and first.rel_l2 and first.limit and first.rel_l2 > first.limit
    )

    code, out, _ = fwbench_here(capsys, "verify", "--models", model, "--runtimes", "jax:jit", "--threads", "1")
    assert code == 1
    assert f"{model} jax:jit: mismatch; first divergence: encoder.layer.0.attention.output, rel. error" in " ".join(
        out.split()
    )


@pytest.mark.slow
def test_diff_of_a_model_without_checkpoints_compares_its_outputs(capsys: pytest.CaptureFixture[str]) -> None:
    code, diff = run_diff(capsys, "gemm", "jax:jit")
    assert code == 0, diff
    (runtime,) = diff["runtimes"]
    assert [(layer["name"], layer["kind"]) for layer in runtime["layers"]] == [("y", "output")]
    assert runtime["checkpoints_unavailable"] == "gemm has no checkpoints: its outputs are compared"


@pytest.mark.slow
def test_a_mismatch_that_cannot_be_located_stays_a_mismatch(
    capsys: pytest.CaptureFixture[str], plugin_env: dict[str, str], tmp_path: Path
) -> None:
    """Locating a mismatch is a diagnostic: where it cannot be done (a runtime without checkpoints), the cell is
    still a mismatch, and its reason says why it was not located."""
    db = tmp_path / "r.db"
    fwbench_here(
        capsys, *run_args("--models", "mlp", "--runtimes", "fake:wrong", "--batch-sizes", "1", db=db, max_time=0.2)
    )
    with Store.open(db) as store:
        (row,) = store.results()
    assert row.status == "mismatch", row.reason
    assert "no checkpoints to locate it: fake:wrong exposes only the model's outputs" in (row.reason or "")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["nope", "--runtimes", "torch:eager"], "unknown model 'nope'"),
        (["mlp", "--runtimes", "torch:eager,jax:jit,torch:eager"], "--runtimes names torch:eager more than once"),
        (["mlp", "--runtimes", "torch:ddp"], "torch:ddp runs as several processes"),
        (["mlp", "--runtimes", "torch:eager", "--phase", "training", "--dtype", "int8"], "computes in fp32, bf16 only"),
        (["gemm", "--runtimes", "torch:eager", "--phase", "training"], "gemm has no training phase"),
        (["mlp", "--runtimes", "torch:nope"], "unknown runtime 'torch:nope'"),
        (["bert-tiny", "--runtimes", "torch:eager", "--seq-len", "600"], "exceeds bert-tiny's maximum of 512"),
        (["mlp", "--runtimes", "torch:eager", "--weights", "/etc/hostname"], "cannot read weights"),
    ],
)
def test_diff_bad_input(capsys: pytest.CaptureFixture[str], args: list[str], fragment: str) -> None:
    code, out, err = fwbench_here(capsys, "diff", *args)
    assert code == 2 and len(err.strip().splitlines()) == 1 and out == "", err
    assert fragment in err


@pytest.mark.slow
# -- --phase training: the first step's loss and gradients ---------------------------------------------------------
def test_diff_training_compares_every_trained_gradient_in_backward_order(capsys: pytest.CaptureFixture[str]) -> None:
    """TensorFlow's and Keras' gradients of the MLP against the first runtime's (torch's and JAX's: the backward-pass
    defect's diff below), and a runtime without a training phase (torch:script: compared at inference only)."""
    runtimes = ["tensorflow:function", "keras:torch", "torch:script"]
    code, diff = run_diff(capsys, "mlp", ",".join(runtimes), "--phase", "training")
    assert code == 0, diff
    assert diff["phase"] == "training" and [r["runtime"] for r in diff["runtimes"]] == runtimes
    for runtime in diff["runtimes"]:  # the inference diff: every checkpoint within its share
        assert runtime["status"] == "ok" and runtime["first_divergence"] is None, runtime
        checkpoints = [layer["name"] for layer in runtime["layers"] if layer["kind"] == "checkpoint"]
        assert checkpoints == diff["checkpoints"] == list(get_model("mlp").checkpoint_names()), runtime["runtime"]
    description = get_model("mlp")
    backward = [p.name for p in reversed(description.param_schema())]
    steps = {r["runtime"]: r["training"] for r in diff["runtimes"]}
    for runtime in runtimes[:2]:
        step = steps[runtime]
        assert step["status"] == "ok" and step["gradients_against"] == "tensorflow:function", (runtime, step)
        assert [g["name"] for g in step["gradients"]] == backward  # every trained tensor, the last layer's first
        assert step["loss_rel_to_reference"] <= 1e-5 and step["first_gradient_divergence"] is None
        assert all(g["rel_l2"] <= g["limit"] == 1e-3 for g in step["gradients"]), step
    assert steps["tensorflow:function"]["gradients"][0]["rel_l2"] == 0.0  # the base against itself
    assert steps["torch:script"]["status"] == "skipped" and "no training phase" in steps["torch:script"]["reason"]


@pytest.mark.slow
def test_diff_training_finds_a_defect_of_the_backward_pass_alone(
    capsys: pytest.CaptureFixture[str], faulty_env: dict[str, str]
) -> None:
    """The defect lives in the torch model file: torch:eager's training step runs it as it is (torch:compile's step,
    the same file compiled, gives torch's parameters in tests/test_training.py's matrix)."""
    from fwbench_faulty_models import GRADIENT_DEFECT, GRADIENT_MODEL

    code, diff = run_diff(capsys, GRADIENT_MODEL, "jax:jit,torch:eager", "--phase", "training")
    assert code == 1, diff
    healthy, faulty = diff["runtimes"]
    assert diff["checkpoints"] == list(get_model("bert-tiny").checkpoint_names())
    for runtime in (healthy, faulty):  # the forward agrees: bert-tiny's, unmodified, at every checkpoint
        assert runtime["status"] == "ok" and runtime["first_divergence"] is None, runtime
        assert all(layer["rel_l2"] <= layer["limit"] for layer in runtime["layers"]), runtime
        checkpoints = [layer["name"] for layer in runtime["layers"] if layer["kind"] == "checkpoint"]
        assert checkpoints == diff["checkpoints"] and runtime["tapped_outputs_rel_l2"] <= 1e-4, runtime["runtime"]
        step = runtime["training"]
        assert step["status"] == "ok" and step["gradients_against"] == "jax:jit", step
        assert step["loss_rel_to_reference"] <= 1e-5, step
    assert healthy["training"]["first_gradient_divergence"] is None
    assert all(g["rel_l2"] == 0.0 for g in healthy["training"]["gradients"])  # the base against itself
    first = faulty["training"]["first_gradient_divergence"]
    assert first["name"] == GRADIENT_DEFECT and first["rel_l2"] > 10 * first["limit"], first
    gradients = faulty["training"]["gradients"]
    before = gradients[: [g["name"] for g in gradients].index(GRADIENT_DEFECT)]
    assert before and all(g["rel_l2"] <= 0.1 * g["limit"] for g in before), before  # clean after it, in forward terms
