"""``fwbench diff`` and the first divergence of a mismatch: the shared checkpoints of every model, their float64
reference, the share of the tolerance each may use, and defects injected into one framework's copy of bert-tiny
(tests/fwbench_faulty_models) found at the checkpoint where they were injected, eager and compiled. ``make test``
runs each defect in one framework; the matrix runs every defect in every framework's eager and compiled runtimes."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from conftest import loaded_model_plugin, run_args, run_cli
from fwbench.models import get_model
from fwbench.models.weights_io import save_weights
from fwbench.runner.divergence import first_divergence, layer_errors, share_of_tolerance
from fwbench.store import Store

PLUGIN = "fwbench_faulty_models"
# Each framework's eager and compiled runtimes (Keras: its eager torch backend and its compiled jax one).
RUNTIMES = {
    "torch": ("torch:eager", "torch:compile"),
    "tensorflow": ("tensorflow:eager", "tensorflow:xla"),
    "jax": ("jax:jit",),
    "keras": ("keras:torch", "keras:jax"),
}
DEFAULT_RUN = {  # make test: each defect once, each framework once, eager and compiled
    "transposed-query": "torch",
    "tanh-gelu": "tensorflow",
    "attention-scale": "jax",
    "layer-norm-eps": "keras",
}


@pytest.fixture
def faulty_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    yield from loaded_model_plugin(monkeypatch, PLUGIN)


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
def test_diff_of_unmodified_bert_tiny_shows_no_divergence_anywhere(tmp_path: Path) -> None:
    runtimes = "torch:eager,torch:script,tensorflow:function,jax:jit,keras:tensorflow,onnxruntime:torch"
    result = run_cli("diff", "bert-tiny", "--runtimes", runtimes, "--threads", "1", "--format", "json", timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    diff = json.loads(result.stdout)
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
        ("resnet-tiny", "torch:eager,tensorflow:function,jax:jit,keras:jax"),
        pytest.param("gpt2-tiny", "torch:compile,tensorflow:xla,jax:jit,keras:torch", marks=pytest.mark.matrix),
        pytest.param("mlp", "torch:eager,tensorflow:eager,keras:tensorflow", marks=pytest.mark.matrix),
        pytest.param(
            "bert-tiny", "torch:export,tensorflow:eager,keras:jax,tensorflow:savedmodel", marks=pytest.mark.matrix
        ),
    ],
)
def test_diff_of_every_model_in_every_framework_shows_no_divergence(model: str, runtimes: str) -> None:
    result = run_cli("diff", model, "--runtimes", runtimes, "--threads", "1", "--format", "json", timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    diff = json.loads(result.stdout)
    for runtime in diff["runtimes"]:
        assert runtime["status"] == "ok" and runtime["first_divergence"] is None, runtime
        if runtime["checkpoints_unavailable"] is None:
            checkpoints = [layer["name"] for layer in runtime["layers"] if layer["kind"] == "checkpoint"]
            assert checkpoints == diff["checkpoints"] == list(get_model(model).checkpoint_names()), runtime["runtime"]


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


def _diff_finds(defect: str, framework: str, env: dict[str, str], folder: Path) -> None:
    from fwbench_faulty_models import DEFECTS, model_name

    model = model_name(defect, framework)
    runtimes = RUNTIMES[framework]
    result = run_cli(
        "diff", model, "--runtimes", ",".join(runtimes), "--threads", "1", "--format", "json",
        *_weights_for(defect, model, folder), env=env, timeout=600,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr  # a divergence is a failure
    diff = json.loads(result.stdout)
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
    defect: str, faulty_env: dict[str, str], tmp_path: Path
) -> None:
    _diff_finds(defect, DEFAULT_RUN[defect], faulty_env, tmp_path)


@pytest.mark.slow
@pytest.mark.matrix
@pytest.mark.parametrize("framework", sorted(RUNTIMES))
@pytest.mark.parametrize("defect", sorted(DEFAULT_RUN))
def test_diff_names_every_defect_in_every_framework(
    defect: str, framework: str, faulty_env: dict[str, str], tmp_path: Path
) -> None:
    if DEFAULT_RUN[defect] == framework:
        pytest.skip("in make test's run")
    _diff_finds(defect, framework, faulty_env, tmp_path)


@pytest.mark.slow
def test_a_mismatch_in_run_and_verify_names_its_first_divergence(faulty_env: dict[str, str], tmp_path: Path) -> None:
    model = "bert-tiny-attention-scale-torch"
    db = tmp_path / "r.db"
    result = run_cli(
        *run_args("--models", model, "--runtimes", "torch:compile", "--batch-sizes", "1", "--seq-lens", "8",
                  db=db, max_time=0.2),
        env=faulty_env, timeout=600,
    )  # fmt: skip
    assert "first divergence: encoder.layer.0.attention.output" in " ".join(result.stdout.split()) + result.stderr
    with Store.open(db) as store:
        (row,) = store.results()
    assert row.status == "mismatch" and "first divergence: encoder.layer.0.attention.output" in (row.reason or "")
    assert row.parity is not None and row.parity.first_divergence is not None
    first = row.parity.first_divergence
    assert (
        first.name == "encoder.layer.0.attention.output" and first.rel_l2 and first.limit and first.rel_l2 > first.limit
    )

    verify = run_cli("verify", "--models", model, "--runtimes", "torch:eager", "--threads", "1", env=faulty_env)
    assert verify.returncode == 1
    assert f"{model} torch:eager: mismatch; first divergence: encoder.layer.0.attention.output, rel. error" in " ".join(
        verify.stdout.split()
    )


@pytest.mark.slow
def test_diff_of_a_model_without_checkpoints_compares_its_outputs() -> None:
    result = run_cli("diff", "gemm", "--runtimes", "torch:eager", "--threads", "1", "--format", "json", timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    (runtime,) = json.loads(result.stdout)["runtimes"]
    assert [(layer["name"], layer["kind"]) for layer in runtime["layers"]] == [("y", "output")]
    assert runtime["checkpoints_unavailable"] == "gemm has no checkpoints: its outputs are compared"


@pytest.mark.slow
def test_a_mismatch_that_cannot_be_located_stays_a_mismatch(plugin_env: dict[str, str], tmp_path: Path) -> None:
    """Locating a mismatch is a diagnostic: where it cannot be done (a runtime without checkpoints), the cell is
    still a mismatch, and its reason says why it was not located."""
    db = tmp_path / "r.db"
    run_cli(*run_args("--models", "mlp", "--runtimes", "fake:wrong", "--batch-sizes", "1", db=db, max_time=0.2),
            env=plugin_env)  # fmt: skip
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
def test_diff_bad_input(args: list[str], fragment: str) -> None:
    result = run_cli("diff", *args)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert fragment in result.stderr


@pytest.mark.slow
# -- --phase training: the first step's loss and gradients ---------------------------------------------------------
def test_diff_training_compares_every_trained_gradient_in_backward_order() -> None:
    runtimes = ["torch:eager", "tensorflow:function", "keras:torch", "onnxruntime:torch"]
    result = run_cli(
        "diff", "mlp", "--phase", "training", "--runtimes", ",".join(runtimes), "--threads", "1", "--format", "json",
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    diff = json.loads(result.stdout)
    assert diff["phase"] == "training"
    description = get_model("mlp")
    backward = [p.name for p in reversed(description.param_schema())]
    steps = {r["runtime"]: r["training"] for r in diff["runtimes"]}
    for runtime in runtimes[:3]:
        step = steps[runtime]
        assert step["status"] == "ok" and step["gradients_against"] == "torch:eager", (runtime, step)
        assert [g["name"] for g in step["gradients"]] == backward  # every trained tensor, the last layer's first
        assert step["loss_rel_to_reference"] <= 1e-5 and step["first_gradient_divergence"] is None
        assert all(g["rel_l2"] <= g["limit"] == 1e-3 for g in step["gradients"]), step
    assert steps["torch:eager"]["gradients"][0]["rel_l2"] == 0.0  # the base against itself
    assert (
        steps["onnxruntime:torch"]["status"] == "skipped"
        and "no training phase" in steps["onnxruntime:torch"]["reason"]
    )


@pytest.mark.slow
def test_diff_training_finds_a_defect_of_the_backward_pass_alone(faulty_env: dict[str, str]) -> None:
    from fwbench_faulty_models import GRADIENT_DEFECT, GRADIENT_MODEL

    result = run_cli(
        "diff", GRADIENT_MODEL, "--phase", "training", "--runtimes", "jax:jit,torch:compile", "--threads", "1",
        "--format", "json", env=faulty_env, timeout=600,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    healthy, faulty = json.loads(result.stdout)["runtimes"]
    assert healthy["first_divergence"] is None and faulty["first_divergence"] is None  # the forward agrees
    assert healthy["training"]["first_gradient_divergence"] is None
    first = faulty["training"]["first_gradient_divergence"]
    assert first["name"] == GRADIENT_DEFECT and first["rel_l2"] > 10 * first["limit"], first
    gradients = faulty["training"]["gradients"]
    before = gradients[: [g["name"] for g in gradients].index(GRADIENT_DEFECT)]
    assert before and all(g["rel_l2"] <= 0.1 * g["limit"] for g in before), before  # clean after it, in forward terms
