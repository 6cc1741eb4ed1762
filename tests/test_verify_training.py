"""``fwbench verify --phase training``: trained parameters read back canonically, loss-curve and parameter
parity across runtimes, an injected learning-rate change caught (exit 1, stored cells marked mismatch).
``make test`` reads the parameters back in torch and JAX and verifies torch against JAX in fp32; TensorFlow's and
Keras' read-back, bf16 verify and the bert-tiny embeddings of keras:tensorflow are the matrix's
(``make test-matrix``). ``fwbench verify`` runs in this process where the command's own work is checked
(``fwbench.cli.main``: no interpreter to start; its workers are processes of their own all the same)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import fwbench_here, run_cli
from fwbench.spec import Case, Plan, Settings
from fwbench.store import Store

# Run in a subprocess (one framework per interpreter): the canonical weights, built, read back before any step.
READ_BACK = """
import json, sys
import numpy as np
from fwbench.frameworks import create_backend
from fwbench.models import get_model
from fwbench.spec import Settings
runtime, out = sys.argv[1], {}
for name in sys.argv[2].split(","):
    description = get_model(name)
    backend = create_backend(runtime, "cpu", Settings(threads=1))
    backend.configure_threads(1, 1)
    weights = description.canonical_weights(3)
    backend.build(description, weights)
    got = backend.trained_parameters()
    out[name] = {"names_equal": sorted(got) == sorted(weights),
                 "max_abs": max(float(np.max(np.abs(got[k] - weights[k]))) for k in weights),
                 "shapes_equal": all(got[k].shape == weights[k].shape for k in weights)}
print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "runtime",
    [
        "torch:eager",
        pytest.param("tensorflow:function", marks=pytest.mark.matrix),
        "jax:jit",
        pytest.param("keras:jax", marks=pytest.mark.matrix),
    ],
)
def test_trained_parameters_before_any_step_are_the_canonical_weights(runtime: str) -> None:
    """Every canonical tensor read back, ResNet's batch-norm running statistics (state, not parameters) and its
    unfolded BN weight and bias included (JAX and TF compute inference BN folded)."""
    models = ("mlp", "bert-tiny", "resnet-tiny")
    done = subprocess.run(
        [sys.executable, "-c", READ_BACK, runtime, ",".join(models)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    for model in models:
        assert report[model] == {"names_equal": True, "max_abs": 0.0, "shapes_equal": True}, (model, report)


def _store_with_training_cells(path: Path) -> int:
    cases = (
        Case("mlp", "torch:eager", phase="training"),
        Case("mlp", "wronglr:torch", phase="training"),
        Case("mlp", "wronglr:torch"),
    )
    with Store.open(path) as store:
        run_id = store.create_run(Plan(cases, Settings()), "fwbench run (test)", {}, "0")
        for case in cases:
            store.add_result(run_id, case, {"status": "ok"}, [0.1, 0.1], {})
    return run_id


@pytest.mark.slow
def test_training_verify_agrees_across_frameworks(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = fwbench_here(
        capsys,
        "verify",
        "--phase",
        "training",
        "--models",
        "mlp",
        "--runtimes",
        "torch:eager,jax:jit",  # TensorFlow's training step against torch's: tests/test_training.py
        "--steps",
        "5",
        "--threads",
        "1",
    )
    assert code == 0, out + err
    text = " ".join(out.split())
    assert text.count(" ok ") == 2 and "5 adamw steps" in text and "mismatch" not in text


@pytest.mark.slow
@pytest.mark.matrix
def test_the_llama_layout_trains_alike_in_every_framework_from_the_reference_loss() -> None:
    """llama-tiny's causal LM step in each framework's model code: 3 AdamW steps agree with torch's, and every first
    loss is the float64 reference's (rotary positions, grouped-query attention and the untied head in the backward
    pass)."""
    from fwbench.models import get_model
    from fwbench.runner.verify import verify_shape, verify_training

    runtimes = ["torch:eager", "tensorflow:function", "jax:jit", "keras:torch"]
    checks = verify_training("llama-tiny", runtimes, Settings(threads=1, timeout_s=300), steps=3)
    assert [(c.runtime, c.status) for c in checks] == [(r, "ok") for r in runtimes], [c.reason for c in checks]
    assert all(c.passed for c in checks), [c.failure() for c in checks]
    description = get_model("llama-tiny")
    batch, seq = verify_shape(description, None, None)
    weights, inputs = description.canonical_weights(0), description.make_inputs(batch, seq, 0)
    reference = description.reference_loss(weights, inputs, description.make_targets(batch, seq, 0))
    assert reference is not None
    for check in checks:
        assert abs(check.losses[0] - reference) / reference < 1e-4, (check.runtime, check.losses, reference)
        assert check.losses[-1] < check.losses[0], check.runtime


@pytest.mark.slow
@pytest.mark.matrix  # make test checks bf16 training against the float64 reference in tests/test_training.py
def test_bf16_training_verify_uses_its_own_limits() -> None:
    result = run_cli(
        "verify",
        "--phase",
        "training",
        "--dtype",
        "bf16",
        "--models",
        "mlp",
        "--runtimes",
        "torch:eager,jax:jit",
        "--steps",
        "5",
        "--threads",
        "1",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    text = " ".join(result.stdout.split())
    assert "bf16, 5 adamw steps" in text and "limits: loss 0.15, parameters 0.15, worst tensor 1" in text, text
    assert text.count(" ok ") == 2 and "mismatch" not in text


@pytest.mark.slow
@pytest.mark.matrix
def test_keras_tensorflow_trains_embeddings_with_dense_adamw(tmp_path: Path) -> None:
    """Two AdamW steps of bert-tiny: keras:tensorflow's token-type embeddings equal torch's. Each of their two
    rows is gathered 16 times; Keras' own AdamW squares the gather's IndexedSlices gradient slice by slice
    (second moment Σ gᵢ² instead of (Σ gᵢ)²), which put this tensor 4.6e-2 (relative L2) from torch's;
    with the gradients densified first (``frameworks.keras.training``) it is 2.3e-6."""
    result = run_cli(
        "verify",
        "--phase",
        "training",
        "--models",
        "bert-tiny",
        "--runtimes",
        "torch:eager,keras:tensorflow",
        "--steps",
        "2",
        "--threads",
        "1",
        "--dump",
        str(tmp_path),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    name = "param/embeddings.token_type_embeddings.weight"
    with (
        np.load(tmp_path / "bert-tiny" / "training_torch_eager.npz") as torch_out,
        np.load(tmp_path / "bert-tiny" / "training_keras_tensorflow.npz") as keras_out,
    ):
        expected, got = torch_out[name].astype(np.float64), keras_out[name].astype(np.float64)
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) < 1e-4


@pytest.mark.slow
def test_a_different_learning_rate_is_caught_and_marks_the_stored_cells(
    plugin_env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "results.db"
    run_id = _store_with_training_cells(db)
    code, out, err = fwbench_here(
        capsys,
        "verify",
        "--phase",
        "training",
        "--models",
        "mlp",
        "--runtimes",
        "torch:eager,wronglr:torch",
        "--steps",
        "5",
        "--threads",
        "1",
        "--db",
        str(db),
        "--run",
        str(run_id),
    )
    assert code == 1, out + err
    text = " ".join(out.split())
    assert "mismatch: loss curve max relative error" in text or "mismatch: trained parameters" in text, text
    assert "1 training cell(s) of run" in err
    with Store.open(db, create=False) as store:
        rows = {(r.runtime, r.phase): r for r in store.results([run_id])}
    assert rows[("wronglr:torch", "training")].status == "mismatch"
    assert "fwbench verify --phase training (5 steps)" in (rows[("wronglr:torch", "training")].reason or "")
    assert rows[("torch:eager", "training")].status == "ok"  # the comparison base matched itself
    assert rows[("wronglr:torch", "inference")].status == "ok"  # only training cells are marked


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--phase", "training", "--steps", "0"], "'0' is not a positive integer"),
        (["--phase", "training", "--runtimes", "torch:eager,fake:sleep"], "fake:sleep has no training phase yet"),
        (["--steps", "3"], "--steps: only with --phase training"),
        (["--phase", "training", "--db", "x.db"], "--db and --run go together"),
    ],
)
def test_training_verify_bad_input(
    plugin_env: dict[str, str], args: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--models", "mlp"] + ([] if "--runtimes" in args else ["--runtimes", "torch:eager"])
    code, _, err = fwbench_here(capsys, "verify", *base, *args)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert fragment in err, err


def test_an_unknown_run_is_one_line(
    plugin_env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "results.db"
    _store_with_training_cells(db)
    code, _, err = fwbench_here(
        capsys,
        "verify",
        "--phase",
        "training",
        "--models",
        "mlp",
        "--runtimes",
        "torch:eager",
        "--db",
        str(db),
        "--run",
        "99",
    )
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"--run 99 is not in {db}; runs there: [1]" in err, err
