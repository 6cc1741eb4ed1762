"""The consistency checks of the bf16 policy: a runtime computing pure bfloat16 is flagged next to runtimes that
follow the mixed policy (errors computed here by the frameworks themselves), an observed op class off the policy
is flagged, and the stored precision record reads back typed."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np
import pytest

from fwbench.frameworks import create_backend
from fwbench.models import get_model
from fwbench.precision import EXPECTED_DTYPES, OBSERVED_OPS, policy_mismatches
from fwbench.report.flags import precision_flags
from fwbench.runner.cell import parity
from fwbench.spec import Settings
from test_report import row


def bf16_parity(runtime: str, pure: bool = False) -> dict[str, Any]:
    """bert-tiny's bf16 parity check (parity shape) in ``runtime``; ``pure``: every weight and op in bfloat16
    (the JAX parameter pytree cast and the model run without the policy), as a framework that ignores the
    policy would compute."""
    description = get_model("bert-tiny")
    weights = description.canonical_weights(0)
    arrays = description.make_inputs(*description.parity_shape(), 0)
    backend = create_backend(runtime, "cpu", Settings(threads=1), dtype="fp32" if pure else "bf16")
    backend.build(description, weights)
    if pure:
        import jax
        import jax.numpy as jnp

        cast = jax.tree.map(lambda leaf: leaf.astype(jnp.bfloat16), backend.model.params)
        backend.model = dataclasses.replace(backend.model, params=cast)
    inputs = backend.make_inputs(arrays)
    try:
        backend.compile(inputs)
        got = backend.to_numpy(backend.infer(inputs))
    finally:
        if hasattr(backend, "_inference_mode"):  # torch's compile entered it for the process
            backend._inference_mode.__exit__(None, None, None)
    return parity(got, description.reference_forward(weights, arrays), "bf16", description.name)


@pytest.fixture(scope="module")
def quiet_xla() -> None:
    """fwbench.frameworks.jax.backend imported without leaving its XLA variables in this environment."""
    pytest.importorskip("jax")
    saved = {name: os.environ.get(name) for name in ("XLA_FLAGS", "XLA_PYTHON_CLIENT_PREALLOCATE")}
    import fwbench.frameworks.jax.backend  # noqa: F401

    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def test_the_consistency_flag_fires_on_a_runtime_computing_pure_bf16(quiet_xla: None) -> None:
    checks = {
        "torch:eager": bf16_parity("torch:eager"),
        "jax:jit": bf16_parity("jax:jit"),
        "pure:jax": bf16_parity("jax:jit", pure=True),
    }
    records = [
        row(id=i, model="bert-tiny", runtime=runtime, dtype="bf16", details={"parity": check})
        for i, (runtime, check) in enumerate(checks.items(), start=1)
    ]
    flags = precision_flags(records)
    flagged = {key[2] for key in flags}
    assert flagged == {"pure:jax"}, (flags, {r: c["outputs"] for r, c in checks.items()})
    assert "computes another precision" in next(iter(flags.values()))
    # the pure run still passes the bf16 parity limit: the limit alone would not have told it apart
    assert all(check["ok"] for check in checks.values()), checks


def test_an_op_class_off_the_policy_is_flagged_and_the_record_reads_back() -> None:
    observed = {"matmul": ["bfloat16"], "layer_norm": ["bfloat16"], "softmax": ["float32"]}
    mismatches = policy_mismatches("bf16", observed)
    assert mismatches == ["layer_norm: bfloat16 (policy: float32)"]
    assert policy_mismatches("bf16", {**observed, "layer_norm": ["float32"]}) == []
    assert policy_mismatches("fp32", {"matmul": ["bfloat16"]}) == ["matmul: bfloat16 (policy: float32)"]
    details = {
        "parity": {"ok": True, "outputs": {"logits": {"rel_l2": 3e-3, "max_abs": 1e-3}}},
        "precision": {"policy": "bf16", "observed": observed, "mismatches": mismatches},
    }
    record = row(dtype="bf16", details=details)
    assert record.precision is not None and record.precision.observed["layer_norm"] == ("bfloat16",)
    assert record.precision.mismatches == tuple(mismatches)
    flags = precision_flags([record])  # alone in its cell: no error comparison, the observation still flags
    assert list(flags.values()) == ["off policy: layer_norm: bfloat16 (policy: float32)"]
    assert row().precision is None  # stored before observation: no record, no flag
    assert precision_flags([row(details={"parity": details["parity"]})]) == {}


def test_the_policy_table_covers_every_observed_op_class() -> None:
    for dtype, expected in EXPECTED_DTYPES.items():
        assert set(expected) == set(OBSERVED_OPS), dtype
    assert {expected for expected in EXPECTED_DTYPES["fp32"].values()} == {"float32"}
    assert np.dtype(EXPECTED_DTYPES["bf16"]["layer_norm"]) == np.float32
