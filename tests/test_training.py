"""Phase training: targets and the float64 loss reference, the optimizers as data, the planner's and the
CLI's refusals, the first-step loss against the reference and optimizer parity in every training runtime,
ResNet's batch norm in training mode (its running statistics after one step) in every framework, and one
training cell end to end through a worker. ``make test`` trains in one runtime per framework (DEFAULT_PART);
the matrix (``make test-matrix``) every model in one runtime of each framework's model code and the MLP and
resnet-tiny in the other runtimes.

Each runtime runs in its own subprocess (a process holds one Keras backend; TF, JAX and torch stay apart):
this file run as a script, ``python test_training.py <runtime> <models>``, trains those tiny models there and prints
one JSON report that the tests assert on.
"""

from __future__ import annotations

import fcntl
import functools
import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from compute_dtypes import recorded_compute_dtypes  # tests/ is on sys.path, as the script's own folder too

if TYPE_CHECKING:
    from fwbench.spec import OptimizerKind

OPTIMIZER_PARITY_STEPS = 2
OPTIMIZER_PARITY_TOLERANCE = 1e-5  # relative L2 error of each MLP parameter after two steps, against torch's
LOSS_TOLERANCE = 1e-4  # the first-step loss against the float64 reference (the worker's fp32 parity tolerance)
MODELS = ("mlp", "bert-tiny", "gpt2-tiny", "resnet-tiny")
# The change of every BN running statistic after one step against the float64 reference's, relative L2 error
# (measured: 3e-7 for the means, 1.5e-6 for the variances; a BN left in inference mode, or one averaging the
# biased variance, gives 1 or ~0.1).
RUNNING_STATISTICS_TOLERANCE = 1e-4
REPORT_TIMEOUT_S = 600


# -- the subprocess side ------------------------------------------------------------------------
def _mlp_parameters(backend: Any) -> dict[str, Any]:
    """The MLP's parameters after training, by canonical name, in the canonical (out, in) layout."""
    framework, layers = backend.framework, backend.description.layers
    params: dict[str, Any] = {}
    for i, (prefix, _, _) in enumerate(layers):
        if framework == "torch":
            linear = getattr(backend.model, prefix)
            weight, bias = linear.weight.detach().cpu().numpy(), linear.bias.detach().cpu().numpy()
        elif framework == "tensorflow":
            weight, bias = backend.model.kernels[i].numpy().T, backend.model.biases[i].numpy()
        elif framework == "jax":
            layer = backend._train_state[0]["layers"][i]
            weight, bias = np.asarray(layer["kernel"]).T, np.asarray(layer["bias"])
        else:  # keras: train_on_batch has written the state back into the variables
            dense = backend.model.get_layer(prefix)
            convert = backend.keras.ops.convert_to_numpy
            weight, bias = convert(dense.kernel).T, convert(dense.bias)
        params[f"{prefix}.weight"], params[f"{prefix}.bias"] = weight.tolist(), bias.tolist()
    return params


def _pooler_weight(backend: Any) -> Any:
    """BERT's pooler weight after training, in the canonical (out, in) layout."""
    framework = backend.framework
    if framework == "torch":
        return backend.model.pooler.weight.detach().cpu().numpy()
    if framework == "tensorflow":
        return backend.model.pooler[0].numpy().T
    if framework == "jax":
        return np.asarray(backend._train_state[0]["pooler"]["kernel"]).T
    return backend.keras.ops.convert_to_numpy(backend.model.get_layer("pooler").kernel).T


def _train(
    runtime: str, model: str, optimizer: OptimizerKind, steps: int, dtype: str = "fp32"
) -> tuple[Any, Any, list[float], float]:
    """A backend that has taken ``steps`` training steps in ``dtype`` at the model's parity shape, its step, the
    losses the steps returned, and the float64 reference loss of the canonical weights on that batch."""
    from fwbench.frameworks import create_backend
    from fwbench.models import get_model
    from fwbench.spec import Settings

    description = get_model(model)
    # phase training, as the worker creates it: bf16 training keeps float32 master weights
    backend = create_backend(runtime, "cpu", Settings(optimizer=optimizer), dtype=dtype, phase="training")
    backend.configure_threads(1, 1)
    backend.configure_precision()
    weights = description.canonical_weights(0)
    batch, seq = description.parity_shape()
    arrays, targets = description.make_inputs(batch, seq, 0), description.make_targets(batch, seq, 0)
    backend.build(description, weights)
    step = backend.make_train_step(backend.make_inputs(arrays), backend.make_targets(targets))
    losses = [backend.loss_value(step()) for _ in range(steps)]
    reference = description.reference_loss(weights, arrays, targets)
    assert reference is not None, f"{model} has no reference loss"
    return backend, step, losses, float(reference)


def report(runtime: str, models: tuple[str, ...]) -> dict[str, Any]:
    """What the tests check, for one runtime: per model the first two steps' losses and the reference (for a
    model with running statistics also their values after the first step, read back canonically, and the
    compile-health counters after the second step and after a third); for the MLP with each optimizer, the
    parameters after OPTIMIZER_PARITY_STEPS steps and the compile-health counters after that many steps
    and after one more."""
    out: dict[str, Any] = {
        "loss": {},
        "mlp_parameters": {},
        "mlp_losses": {},
        "mlp_counters": {},
        "running_statistics": {},
        "stateful_counters": {},
        "second_step_counters": {},
    }
    out["compute_dtypes"] = {"fp32": {}, "bf16": {}}  # fp32: the control, the same probe must see float32 there

    def record_mlp(optimizer: str, backend: Any, step: Any, losses: list[float]) -> None:
        """The MLP after OPTIMIZER_PARITY_STEPS steps: its parameters, losses, and compile counters then and
        after one more step."""
        out["mlp_parameters"][optimizer] = _mlp_parameters(backend)
        out["mlp_losses"][optimizer] = losses[:OPTIMIZER_PARITY_STEPS]
        counters = backend.compile_counters()
        step()
        out["mlp_counters"][optimizer] = [counters, backend.compile_counters()]

    assert OPTIMIZER_PARITY_STEPS == 2  # the loss loop's MLP (AdamW, two steps) is also AdamW's parity run
    for model in models:
        with recorded_compute_dtypes(runtime) as seen:
            backend, step, losses, reference = _train(runtime, model, "adamw", 1)
        out["compute_dtypes"]["fp32"][model] = sorted(set(seen))
        running = backend.description.running_statistics()
        if running:
            after_one = backend.trained_parameters()
            out["running_statistics"][model] = {name: after_one[name].tolist() for name in running}
        first_counters = backend.compile_counters()
        losses.append(backend.loss_value(step()))
        out["second_step_counters"][model] = [first_counters, backend.compile_counters()]
        if running:
            counters = backend.compile_counters()
            step()
            out["stateful_counters"][model] = [counters, backend.compile_counters()]
        out["loss"][model] = {"first": losses[0], "second": losses[1], "reference": reference}
        if model == "mlp":
            record_mlp("adamw", backend, step, losses)
        if model == "bert-tiny":  # frozen: AdamW's weight decay would move it otherwise
            canonical = backend.description.canonical_weights(0)["pooler.dense.weight"]
            out["bert_pooler_unchanged"] = bool(np.array_equal(_pooler_weight(backend), canonical))
    if "mlp" in models:
        backend, step, losses, _ = _train(runtime, "mlp", "sgd", OPTIMIZER_PARITY_STEPS)
        record_mlp("sgd", backend, step, losses)
    out["bf16_loss"] = {}
    for model in models:
        # the MLP's bf16 run is also the SGD master-weight check
        optimizer: OptimizerKind = "sgd" if model == "mlp" else "adamw"
        with recorded_compute_dtypes(runtime) as seen:
            backend, _, losses, reference = _train(runtime, model, optimizer, OPTIMIZER_PARITY_STEPS, dtype="bf16")
        out["compute_dtypes"]["bf16"][model] = sorted(set(seen))
        out["bf16_loss"][model] = {"first": losses[0], "second": losses[1], "reference": reference}
        if model == "mlp":
            out["bf16_mlp_parameters"] = _mlp_parameters(backend)
    return out


# -- the pytest side ----------------------------------------------------------------------------
# Each runtime's report comes in two parts, each its own subprocess and xdist group: the default part (make test)
# trains the models DEFAULT_PART gives the runtime, the matrix part (make test-matrix, marker ``matrix``) the others.
# Every model trains in one runtime of each framework's model code (MODEL_CODE_RUNTIMES): by default torch:eager
# every model but gpt2-tiny (the MLP: optimizer parity and master weights; bert-tiny: attention, layer norm, a frozen
# parameter; resnet-tiny: convolutions and batch norm's running statistics), tensorflow:function and jax:jit the MLP
# (their compiled steps, optimizers and master weights), keras:torch the MLP and bert-tiny; the matrix the rest of
# the four models there (gpt2-tiny: causal LM, tied embeddings). The other runtimes run the same model code through
# another step (eager, XLA, another Keras backend): the matrix trains the MLP (optimizers, master weights, compile
# counters) and resnet-tiny (batch norm's state carried through the step) there, not the transformers again.
DEFAULT_PART = {
    "torch:eager": ("mlp", "bert-tiny", "resnet-tiny"),
    "tensorflow:function": ("mlp",),
    "jax:jit": ("mlp",),
    "keras:torch": ("mlp", "bert-tiny"),
}
RUNTIMES = (
    "torch:eager",
    "tensorflow:eager",
    "tensorflow:function",
    "tensorflow:xla",
    "jax:jit",
    "keras:tensorflow",
    "keras:jax",
    "keras:torch",
)
MODEL_CODE_RUNTIMES = ("torch:eager", "tensorflow:function", "jax:jit", "keras:torch")
STEP_MODELS = ("mlp", "resnet-tiny")  # what the other runtimes train
assert set(DEFAULT_PART) <= set(MODEL_CODE_RUNTIMES) <= set(RUNTIMES)
assert all(set(m) <= set(MODELS) for m in DEFAULT_PART.values())
# torch:compile's training step (a cold inductor compile of forward and backward) trains the MLP only, in its one
# part, in the matrix: make test checks torch's compiled modes elsewhere (tests/test_compiled_runtimes.py,
# tests/test_bf16.py) and the training step in torch:eager.
COMPILED_MLP_ONLY = ("torch:compile",)
COMPILED_IN_MATRIX = [pytest.param(runtime, marks=pytest.mark.matrix) for runtime in COMPILED_MLP_ONLY]


def part_models(runtime: str, part: str) -> tuple[str, ...]:
    """The models a part of ``runtime``'s report trains (a compiled-MLP-only runtime: the MLP, in its matrix part)."""
    if runtime in COMPILED_MLP_ONLY:
        return ("mlp",) if part == "matrix" else ()
    trained = MODELS if runtime in MODEL_CODE_RUNTIMES else STEP_MODELS
    default = DEFAULT_PART.get(runtime, ())
    return default if part == "default" else tuple(m for m in trained if m not in default)


def part_of(runtime: str, model: str) -> str:
    """The part of ``runtime``'s report that trains ``model``."""
    return "default" if model in part_models(runtime, "default") else "matrix"


def trained_in(runtime: str, model: str) -> Any:
    """``runtime`` as a test parameter of a test on ``model``, marked ``matrix`` unless its default part trains it."""
    return pytest.param(runtime, marks=() if part_of(runtime, model) == "default" else pytest.mark.matrix)


# (runtime, part) of every report part there is (a part with no model is none).
RUNTIME_PARTS = [
    pytest.param(runtime, part, id=f"{runtime}-{part}", marks=() if part == "default" else pytest.mark.matrix)
    for runtime in (*RUNTIMES, *COMPILED_MLP_ONLY)
    for part in ("default", "matrix")
    if part_models(runtime, part)
]


def runtime_report(runtime: str, model: str = "mlp") -> dict[str, Any]:
    """The part of ``runtime``'s report that trains ``model``, computed once per process."""
    return _part_report(runtime, part_of(runtime, model))


# Under pytest-xdist: the folder every process of this test run shares (the run's base temporary folder), where the
# first process to need a report part leaves it for the others. Each runtime's tests run in the process that computed
# its part (tests/conftest.py), but every runtime's optimizer and master-weight tests also compare with torch:eager's
# MLP parameters: the processes that run other runtimes' groups read torch:eager's part instead of training again.
_SHARED_FOLDER: list[Path] = []


@pytest.fixture(scope="module", autouse=True)
def _shared_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    if os.environ.get("PYTEST_XDIST_WORKER"):  # its base folder is popen-gwN in the run's own base folder
        _SHARED_FOLDER[:] = [tmp_path_factory.getbasetemp().parent]
    yield
    _SHARED_FOLDER.clear()


@functools.cache
def _part_report(runtime: str, part: str) -> dict[str, Any]:
    """``runtime``'s report part: computed here, or by another xdist process of this run (_SHARED_FOLDER)."""
    if not _SHARED_FOLDER:
        return _computed_part_report(runtime, part)
    path = _SHARED_FOLDER[0] / f"training-report-{runtime.replace(':', '-')}-{part}.json"
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process computing it: wait for it, then read it
        if path.is_file():
            shared: dict[str, Any] = json.loads(path.read_text())
            return shared
        report = _computed_part_report(runtime, part)
        written = path.with_suffix(".partial")
        written.write_text(json.dumps(report))
        written.replace(path)
        return report


def _computed_part_report(runtime: str, part: str) -> dict[str, Any]:
    models = part_models(runtime, part)
    done = subprocess.run(
        [sys.executable, __file__, runtime, ",".join(models)],
        capture_output=True,
        text=True,
        timeout=REPORT_TIMEOUT_S,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _rel_l2(got: Any, expected: Any) -> float:
    got, expected = np.asarray(got, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    return float(np.linalg.norm(got - expected) / np.linalg.norm(expected))


@pytest.mark.slow
@pytest.mark.parametrize(("runtime", "part"), RUNTIME_PARTS)
def test_first_step_loss_matches_the_float64_reference(runtime: str, part: str) -> None:
    losses = _part_report(runtime, part)["loss"]
    assert set(losses) == set(part_models(runtime, part))
    for model, loss in losses.items():
        assert abs(loss["first"] - loss["reference"]) / loss["reference"] < LOSS_TOLERANCE, (model, loss)
        assert loss["second"] < loss["first"], (model, loss)
    if "bert-tiny" in losses:
        assert _part_report(runtime, part)["bert_pooler_unchanged"]  # frozen: not on the loss's path


@pytest.mark.slow
@pytest.mark.parametrize(
    "runtime", [*(trained_in(r, "mlp") for r in RUNTIMES if r != "torch:eager"), *COMPILED_IN_MATRIX]
)
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_optimizer_steps_give_torchs_parameters(runtime: str, optimizer: str) -> None:
    """Two steps of SGD (momentum) and of AdamW from the canonical weights: every MLP parameter equals
    torch.optim's. torch's own parameters have moved far beyond the tolerance, so an optimizer that does
    nothing, or something else, fails."""
    from fwbench.models import get_model

    expected = runtime_report("torch:eager")["mlp_parameters"][optimizer]
    got = runtime_report(runtime)["mlp_parameters"][optimizer]
    canonical = get_model("mlp").canonical_weights(0)
    assert set(got) == set(expected) == set(canonical)
    for name in expected:
        assert _rel_l2(expected[name], canonical[name]) > 100 * OPTIMIZER_PARITY_TOLERANCE, name  # it moved
        assert _rel_l2(got[name], expected[name]) < OPTIMIZER_PARITY_TOLERANCE, (
            name,
            _rel_l2(got[name], expected[name]),
        )
    first, second = runtime_report(runtime)["mlp_losses"][optimizer]
    assert second < first  # the step went downhill


# bf16 (mixed precision): the first-step loss against the float64 reference within bf16's parity tolerance
# (runner.tolerances / PARITY_REL_L2_TOLERANCE["bf16"]), and the matmuls and convolutions of the step really
# computed in bfloat16. That is checked on the computation itself (tests/compute_dtypes.py watches each
# framework's matmul/convolution ops while the step runs or is traced), never by how far the bf16 loss moved
# from the fp32 one: that distance depends on the CPU (native AVX512_BF16 units round differently from the AVX2
# emulation; a 1e-5 threshold tuned on AVX2 failed on an AVX512_BF16 EPYC) and on cancellations (keras:torch's
# bert-tiny first loss equals the fp32 one to the bit).
BF16_LOSS_TOLERANCE = 2e-2
# Two SGD steps (lr 1e-2) in bf16: each MLP parameter's change against torch fp32's change, relative L2. With
# float32 master weights the change survives (measured ≤ 9.7e-3, tensorflow:*); parameters stored in bfloat16
# would round most of these ~1e-4 relative updates away (error ~1).
BF16_UPDATE_TOLERANCE = 0.1


@pytest.mark.slow
@pytest.mark.parametrize(("runtime", "part"), RUNTIME_PARTS)
def test_bf16_training_computes_in_bfloat16_near_the_reference(runtime: str, part: str) -> None:
    """Every matmul and convolution of a bf16 training step (forward and backward) computed on bfloat16 data,
    of the fp32 step in float32 (the control: the probe sees the dtype, it does not assume it), and the bf16
    first-step loss is near the float64 reference and the second one lower."""
    report = _part_report(runtime, part)
    assert set(report["bf16_loss"]) == set(report["loss"])
    for model, loss in report["bf16_loss"].items():
        error = abs(loss["first"] - loss["reference"]) / loss["reference"]
        assert error < BF16_LOSS_TOLERANCE, (model, loss)
        assert loss["second"] < loss["first"], (model, loss)
        fp32, bf16 = report["compute_dtypes"]["fp32"][model], report["compute_dtypes"]["bf16"][model]
        assert fp32 and bf16, (model, "no matmul or convolution seen: the probe missed the step")
        assert all(set(dtypes.split(",")) == {"float32"} for _, dtypes in fp32), (model, fp32)
        # Every product took bfloat16 data; fwbench's own model code (every runtime but Keras') only bfloat16 data,
        # backward included (its JAX and TF-XLA products round the cotangent to bfloat16 in a custom gradient).
        # Keras on JAX pairs a float32 cotangent with bfloat16 data in its attention's backward.
        assert all("bfloat16" in dtypes.split(",") for _, dtypes in bf16), (model, bf16)
        if not runtime.startswith("keras:"):
            assert all(set(dtypes.split(",")) == {"bfloat16"} for _, dtypes in bf16), (model, bf16)


@pytest.mark.slow
@pytest.mark.parametrize("runtime", [*(trained_in(r, "mlp") for r in RUNTIMES), *COMPILED_IN_MATRIX])
def test_bf16_training_updates_float32_master_weights(runtime: str) -> None:
    from fwbench.models import get_model

    canonical = get_model("mlp").canonical_weights(0)
    expected = runtime_report("torch:eager")["mlp_parameters"]["sgd"]  # fp32
    got = runtime_report(runtime)["bf16_mlp_parameters"]
    for name in expected:
        should = np.asarray(expected[name]) - canonical[name]
        moved = np.asarray(got[name]) - canonical[name]
        assert _rel_l2(moved, should) < BF16_UPDATE_TOLERANCE, (name, _rel_l2(moved, should))


@pytest.mark.slow
@pytest.mark.parametrize("runtime", [trained_in(runtime, "resnet-tiny") for runtime in RUNTIMES])
def test_batch_norm_trains_on_batch_statistics_and_updates_its_running_ones(runtime: str) -> None:
    """After one step of resnet-tiny every BN running statistic has moved from its initial value r₀ to
    (1 − m)·r₀ + m·batch (m = 0.1, the batch's mean, its unbiased variance), the batch statistics those of
    the float64 training-mode forward: a framework whose BN is still in inference mode does not move them
    (and its first loss misses the training-mode reference, test_first_step_loss_matches_...)."""
    from fwbench.models import get_model
    from fwbench.models.resnet import ResNet

    description = get_model("resnet-tiny")
    assert isinstance(description, ResNet)
    got = runtime_report(runtime, "resnet-tiny")["running_statistics"]["resnet-tiny"]
    assert set(got) == set(description.running_statistics())
    weights = description.canonical_weights(0)
    expected = description.reference_running_statistics(weights, description.make_inputs(2, None, 0))
    for kind in ("running_mean", "running_var"):
        names = [name for name in expected if name.endswith(kind)]
        moved = np.concatenate([np.asarray(got[name]).ravel() - weights[name].ravel() for name in names])
        should = np.concatenate([expected[name].ravel() - weights[name].ravel() for name in names])
        assert _rel_l2(moved, should) < RUNNING_STATISTICS_TOLERANCE, (kind, _rel_l2(moved, should))


COUNTED = ("torch:compile", "tensorflow:function", "tensorflow:xla", "jax:jit", "keras:jax")


@pytest.mark.slow
@pytest.mark.parametrize(
    "runtime", [*(trained_in(r, "mlp") for r in COUNTED if r not in COMPILED_MLP_ONLY), *COMPILED_IN_MATRIX]
)
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_later_steps_compile_nothing(runtime: str, optimizer: str) -> None:
    """Once two steps have run (a compiled optimizer may specialise on its state made by the first), a
    step traces and compiles nothing: the timed loop reruns one program. (torch:eager and keras:torch
    compile nothing at run time; keras:tensorflow keeps its train step's tf.function out of reach.)"""
    before, after = runtime_report(runtime)["mlp_counters"][optimizer]
    assert before and any(n > 0 for n in before.values())  # the counters count this runtime's compiles
    assert before == after


# The runtimes whose every training state is committed before the first step, so the second step runs the first's
# program: jax:jit's arrays are device_put; keras:jax's variables, optimizer state included, are committed after
# model.compile (keras/training.commit_jax_training_state; Keras leaves them uncommitted, and the second step compiled
# its program again, doubling the compile time).
SECOND_STEP_REUSES = ("jax:jit", "keras:jax")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("runtime", "model"),
    [
        pytest.param(r, m, marks=() if part_of(r, m) == "default" else pytest.mark.matrix)
        for r in SECOND_STEP_REUSES
        for m in STEP_MODELS
    ],
)
def test_the_second_step_compiles_nothing_in_jax(runtime: str, model: str) -> None:
    """In jax:jit and keras:jax the second training step traces and compiles nothing: the first step's program."""
    first, second = runtime_report(runtime, model)["second_step_counters"][model]
    assert first and any(n > 0 for n in first.values())
    assert first == second


@pytest.mark.slow
@pytest.mark.parametrize("runtime", [trained_in(r, "resnet-tiny") for r in COUNTED if r not in COMPILED_MLP_ONLY])
def test_carried_batch_norm_state_compiles_nothing_more(runtime: str) -> None:
    """ResNet's running statistics fed back into the compiled step (jax:jit's returned state, TF's assigned
    variables, Keras' non-trainable state) leave the third step with nothing to trace or compile."""
    before, after = runtime_report(runtime, "resnet-tiny")["stateful_counters"]["resnet-tiny"]
    assert before and before == after


@pytest.mark.parametrize("runtime", ["jax:jit"])
def test_a_runtimes_tests_share_one_xdist_process(request: pytest.FixtureRequest, runtime: str) -> None:
    """Under ``make test`` (pytest-xdist, ``--dist loadgroup``) every test of one runtime runs in the process that
    computed its report (tests/conftest.py groups them); an ungrouped test would train the models again."""
    if not request.config.getoption("loadgroup", default=False):  # set in each xdist process by --dist loadgroup
        pytest.skip("runs under pytest-xdist --dist loadgroup (make test)")
    assert request.node.nodeid.endswith(f"@training-{runtime}-default"), request.node.nodeid


# -- framework-free -----------------------------------------------------------------------------
def test_targets_are_seeded_and_well_formed() -> None:
    from fwbench.models import get_model

    for name in MODELS:
        description = get_model(name)
        batch, seq = 3, (24 if description.has_sequence else None)
        targets = description.make_targets(batch, seq, seed=0)
        again, other = description.make_targets(batch, seq, seed=0), description.make_targets(batch, seq, seed=1)
        assert set(targets) == {"labels", "label_weights"}
        assert targets["labels"].dtype == np.int32 and targets["label_weights"].dtype == np.float32
        assert targets["labels"].shape == targets["label_weights"].shape == ((batch,) if seq is None else (batch, seq))
        assert all(np.array_equal(targets[k], again[k]) for k in targets)
        assert not np.array_equal(targets["labels"], other["labels"])
        assert (targets["label_weights"].sum(axis=-1) > 0).all()


def test_gpt2_targets_are_the_next_tokens() -> None:
    from fwbench.models import get_model

    description = get_model("gpt2-tiny")
    inputs, targets = description.make_inputs(2, 16, 0), description.make_targets(2, 16, 0)
    ids, mask, weights = inputs["input_ids"], inputs["attention_mask"], targets["label_weights"]
    assert np.array_equal(targets["labels"][:, :-1], ids[:, 1:])
    assert (weights[:, -1] == 0).all()
    assert np.array_equal(weights[:, :-1], mask[:, 1:])  # the padded tail is never a target


def test_bert_targets_count_a_share_of_the_real_positions() -> None:
    from fwbench.models import get_model
    from fwbench.models.text import MLM_FRACTION

    description = get_model("bert-tiny")
    inputs, targets = description.make_inputs(8, 128, 0), description.make_targets(8, 128, 0)
    counted = targets["label_weights"].astype(bool)
    assert not (counted & (inputs["attention_mask"] == 0)).any()  # never a padded position
    assert (targets["labels"][~counted] == 0).all()
    share = counted.sum() / inputs["attention_mask"].sum()
    assert abs(share - MLM_FRACTION) < 0.05, share
    assert description.frozen_in_training() == ("pooler.dense.weight", "pooler.dense.bias")


def test_resnet_reference_loss_is_in_batch_norm_training_mode() -> None:
    """The training-mode forward is the inference forward with every BN's running statistics replaced by its
    batch's mean and biased variance, and its loss is not the inference-mode one; the running statistics after
    one step follow torch's rule (momentum 0.1, unbiased variance)."""
    from fwbench.models import get_model
    from fwbench.models.resnet import ResNet
    from fwbench.models.training import reference_loss

    description = get_model("resnet-tiny")
    assert isinstance(description, ResNet)
    weights, inputs = description.canonical_weights(0), description.make_inputs(2, None, 0)
    targets = description.make_targets(2, None, 0)
    statistics = description.reference_batch_statistics(weights, inputs)
    assert {f"{bn}.{s}" for bn in statistics for s in ("running_mean", "running_var")} == set(
        description.running_statistics()
    )
    assert statistics["bn1"][2] == 2 * 32 * 32 and statistics["layer4.0.bn3"][2] == 2 * 2 * 2  # N·H·W
    as_running = dict(weights)
    for bn, (mean, var, _) in statistics.items():
        as_running[f"{bn}.running_mean"], as_running[f"{bn}.running_var"] = mean, var
    training = description.reference_loss(weights, inputs, targets)
    assert math.isclose(
        training,
        reference_loss(
            description.reference_forward(as_running, inputs)["logits"], targets["labels"], targets["label_weights"]
        ),
        rel_tol=1e-12,
    )
    inference = reference_loss(
        description.reference_forward(weights, inputs)["logits"], targets["labels"], targets["label_weights"]
    )
    assert abs(training - inference) / training > 0.01
    mean, var, count = statistics["layer2.0.bn2"]
    updated = description.reference_running_statistics(weights, inputs)
    assert np.allclose(updated["layer2.0.bn2.running_mean"], 0.9 * weights["layer2.0.bn2.running_mean"] + 0.1 * mean)
    assert np.allclose(
        updated["layer2.0.bn2.running_var"], 0.9 * weights["layer2.0.bn2.running_var"] + 0.1 * var * count / (count - 1)
    )
    assert set(description.running_statistics()).isdisjoint(description.frozen_in_training())
    assert description.trained_tensor_count() == len(description.param_schema()) - 2 * len(statistics)


def test_reference_loss_is_weighted_softmax_cross_entropy() -> None:
    """Against scipy's log_softmax written out independently, with non-uniform weights."""
    from scipy.special import log_softmax

    from fwbench.models.training import reference_loss, tied_lm_reference_loss

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 5, 7))
    labels = rng.integers(0, 7, size=(3, 5))
    weights = rng.integers(0, 2, size=(3, 5)).astype(np.float32)
    weights[0, 0] = 1.0
    picked = np.take_along_axis(log_softmax(logits, axis=-1), labels[..., None], -1)[..., 0]
    expected = float(-(picked * weights).sum() / weights.sum())
    assert math.isclose(reference_loss(logits, labels, weights), expected, rel_tol=1e-12)
    hidden, table = rng.normal(size=(3, 5, 4)), rng.normal(size=(7, 4))
    assert math.isclose(
        tied_lm_reference_loss(hidden, table, labels, weights),
        reference_loss(hidden @ table.T, labels, weights),
        rel_tol=1e-12,
    )


def test_optimizers_are_data_and_validated() -> None:
    from fwbench.models.training import OPTIMIZERS
    from fwbench.spec import Settings, SpecError

    assert Settings().optimizer == "adamw"
    assert OPTIMIZERS["sgd"].momentum == 0.9 and OPTIMIZERS["adamw"].weight_decay > 0
    assert Settings.from_dict(Settings(optimizer="sgd").to_dict()).optimizer == "sgd"
    with pytest.raises(SpecError, match="unknown optimizer 'foo'; allowed: sgd, adamw"):
        Settings(optimizer="foo")  # type: ignore[arg-type]


def test_planner_skips_what_cannot_train_and_refuses_bf16_fit() -> None:
    from fwbench.runner.planner import build_plan
    from fwbench.spec import Settings, SpecError

    plan = build_plan(["mlp", "gemm"], ["torch:eager", "torch:script"], [2], [], Settings(), phase="training")
    assert [(c.model, c.runtime) for c in plan.cases] == [("mlp", "torch:eager")]
    reasons = {(s.case.model, s.case.runtime): s.reason for s in plan.skipped}
    assert reasons[("mlp", "torch:script")] == "torch:script has no training phase yet"
    assert reasons[("gemm", "torch:eager")] == "gemm has no training phase yet"
    bf16 = build_plan(["mlp"], ["torch:eager", "jax:jit"], [2], [], Settings(), phase="training", dtype="bf16")
    assert [(c.runtime, c.dtype) for c in bf16.cases] == [("torch:eager", "bf16"), ("jax:jit", "bf16")]
    with pytest.raises(SpecError, match="phase fit with dtype 'bf16' cannot be run yet; phase fit dtypes: fp32"):
        build_plan(["mlp"], ["torch:eager"], [2], [], Settings(), phase="fit", dtype="bf16")
    inference = build_plan(["mlp", "resnet-tiny"], ["torch:script"], [2], [], Settings())
    assert len(inference.cases) == 2 and not inference.skipped  # inference is unchanged


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--optimizer", "foo"], "invalid choice: 'foo'"),
        (["--phase", "fit", "--dtype", "bf16"], "phase fit with dtype 'bf16' cannot be run yet"),
    ],
)
def test_bad_training_flags_are_one_line_errors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, extra: list[str], fragment: str
) -> None:
    from fwbench.cli import main

    db = tmp_path / "x.db"
    code = main(["run", "--models", "mlp", "--runtimes", "torch:eager", "--db", str(db), *extra])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err and fragment in lines[0], err
    assert not db.exists()


# -- a worker, end to end -------------------------------------------------------------------------
@pytest.mark.slow
def test_training_cell_end_to_end() -> None:
    from fwbench.models import get_model
    from fwbench.runner.manager import run_worker
    from fwbench.runner.phases import get_phase
    from fwbench.spec import Case, Settings

    case = Case("mlp", "torch:eager", phase="training", batch_size=4)
    outcome = run_worker(case, Settings(threads=1, max_time_s=0.3))
    assert outcome.status == "ok", outcome.reason
    assert outcome.samples and outcome.fields["median_s"] > 0
    parity = outcome.details["parity"]
    assert parity["ok"] and parity["outputs"]["loss"]["rel_l2"] < LOSS_TOLERANCE
    training = outcome.details["training"]
    assert training["samples_per_step"] == 4 and training["tokens_per_step"] is None
    assert training["optimizer"]["kind"] == "adamw"
    assert math.isfinite(training["final_loss"]) and training["final_loss"] < training["first_loss"]
    assert training["counted_steps_before_final"] > len(outcome.samples)
    assert get_phase("training").flops_per_call(get_model("mlp"), case, Settings()) == 3 * get_model(
        "mlp"
    ).forward_flops(4, None)


if __name__ == "__main__":
    print(json.dumps(report(sys.argv[1], tuple(sys.argv[2].split(",")))))
