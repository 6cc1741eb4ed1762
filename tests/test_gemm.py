"""The gemm matmul microbenchmark: its description, parity in torch, TensorFlow and JAX in-process, in
every runtime through workers (`fwbench verify`'s path, Keras included), and `fwbench env --peak`."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import require
from fwbench.models import MODELS, get_model
from fwbench.models.gemm import GEMM, Gemm, GemmConfig
from fwbench.spec import Settings
from fwbench.units import format_gflops

SMALL = Gemm(GemmConfig(n=96), name="gemm-small")
PARITY_TOLERANCE = 1e-5  # float32 lands near 3e-7 at n = 3072; a transposed weight gives ~1.4


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b))


def test_description() -> None:
    assert MODELS["gemm"] is GEMM and get_model("gemm").arch == "gemm"
    n = GEMM.n
    assert [(p.name, p.shape) for p in GEMM.param_schema()] == [("weight", (n, n))]
    assert GEMM.forward_flops(7, None) == 2 * 7 * n * n
    weights = SMALL.canonical_weights(0)
    assert np.array_equal(weights["weight"], SMALL.canonical_weights(0)["weight"])
    assert not np.array_equal(weights["weight"], SMALL.canonical_weights(1)["weight"])
    inputs = SMALL.make_inputs(3, None, 0)
    assert inputs["x"].shape == (3, 96) and inputs["x"].dtype == np.float32
    reference = SMALL.reference_forward(weights, inputs)["y"]
    assert reference.dtype == np.float64
    np.testing.assert_allclose(reference, inputs["x"].astype(np.float64) @ weights["weight"].astype(np.float64))
    # The weight is not symmetric: an implementation computing x @ W.T fails parity by far.
    assert rel_l2(inputs["x"] @ weights["weight"].T, reference) > 0.5


def _torch(description: Gemm, weights: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    import torch

    module = importlib.import_module("fwbench.frameworks.torch.gemm").build_model(description, weights, "cpu")
    with torch.inference_mode():
        (y,) = module(torch.from_numpy(x))
    return y.numpy()


def _tensorflow(description: Gemm, weights: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    import tensorflow as tf

    module = importlib.import_module("fwbench.frameworks.tensorflow.gemm").build_model(description, weights, "cpu")
    call = tf.function(module.__call__, input_signature=[tf.TensorSpec(x.shape, tf.float32)])
    (y,) = call(tf.constant(x))
    return y.numpy()


def _jax(description: Gemm, weights: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    import jax

    model = importlib.import_module("fwbench.frameworks.jax.gemm").build_model(description, weights, "cpu")
    (y,) = jax.jit(model.apply)(model.params, jax.numpy.asarray(x))
    return np.asarray(y)


RUNNERS: dict[str, Callable[[Gemm, dict[str, np.ndarray], np.ndarray], np.ndarray]] = {
    "torch": _torch,
    "tensorflow": _tensorflow,
    "jax": _jax,
}


@pytest.mark.parametrize("description", [SMALL, GEMM], ids=lambda d: d.name)
@pytest.mark.parametrize("framework", list(RUNNERS))
def test_matches_the_float64_reference(framework: str, description: Gemm) -> None:
    require(framework)
    weights = description.canonical_weights(0)
    inputs = description.make_inputs(*description.parity_shape(), 0)
    reference = description.reference_forward(weights, inputs)["y"]
    y = RUNNERS[framework](description, weights, inputs["x"])
    assert y.shape == reference.shape and y.dtype == np.float32
    assert rel_l2(y, reference) < PARITY_TOLERANCE


@pytest.mark.parametrize("framework", list(RUNNERS))
def test_weight_map_errors_name_the_tensor(framework: str) -> None:
    require(framework)
    build = importlib.import_module(f"fwbench.frameworks.{framework}.gemm").build_model
    weights = SMALL.canonical_weights(0)
    with pytest.raises(ValueError, match="weight"):
        build(SMALL, {"weight": np.zeros((96, 95), np.float32)}, "cpu")
    with pytest.raises(ValueError, match="extra"):
        build(SMALL, {**weights, "extra": np.zeros(2, np.float32)}, "cpu")


@pytest.mark.slow
@pytest.mark.matrix  # make test checks every framework's gemm in-process (the worker path: env --peak, the matrix's)
def test_every_runtime_passes_parity_in_a_worker() -> None:
    """The worker path (`fwbench verify`): Keras on all three backends, each in its own process. (torch's, TensorFlow's
    and JAX's own gemm cells pass parity in workers in tests/test_thread_budget.py, make test's serial pass.)"""
    from fwbench.runner.verify import verify_model

    runtimes = ["keras:tensorflow", "keras:jax", "keras:torch"]
    checks = verify_model("gemm", runtimes, Settings(threads=1, timeout_s=300))
    ran = [c for c in checks if c.status != "skipped"]
    assert ran, "no framework installed"
    failed = [(c.runtime, c.status, c.reason, c.rel_l2_vs_reference) for c in ran if not c.passed]
    assert not failed
    assert all(c.rel_l2_vs_reference is not None and c.rel_l2_vs_reference < PARITY_TOLERANCE for c in ran)


@pytest.mark.slow
@pytest.mark.matrix  # make test checks every framework's gemm in-process
def test_env_peak_end_to_end_for_one_framework(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`env --peak` with torch only: one stored run of suite peak, the table, the peak line, and a report
    of the same database that shows GFLOP/s and % peak (100% for the peak's own cell)."""
    require("torch")
    import fwbench.cli as cli
    import fwbench.cli.peak as peak
    from fwbench.store import Store

    monkeypatch.setattr(peak, "peak_runtimes", lambda: ("torch:eager",))
    db = tmp_path / "peak.db"
    assert cli.main(["env", "--peak", "--threads", "1", "--max-time", "1", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "GFLOP/s" in out and "torch:eager" in out and "peak: " in out and "suite peak" in out
    with Store.open(db, readonly=True) as store:
        (run,) = store.runs()
        (row,) = store.results()
    assert run.suite == "peak" and row.model == "gemm" and row.batch_size == GEMM.n
    assert row.status == "ok" and row.threads == 1 and row.parity is not None and row.parity.passed
    assert row.flops and row.median_s
    gflops = row.flops / row.median_s / 1e9
    assert f"peak: {format_gflops(gflops)} GFLOP/s (torch:eager, threads 1)" in out

    assert cli.main(["report", "--db", str(db), "--format", "json"]) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert data["peak"]["runtime"] == "torch:eager" and data["peak"]["gflops"] == pytest.approx(gflops)
    assert data["results"][0]["achieved_gflops"] == pytest.approx(gflops)
    assert data["results"][0]["peak_fraction"] == pytest.approx(1.0)
