"""The consistency checks of the bf16 policy: a runtime computing pure bfloat16 is flagged next to runtimes that
follow the mixed policy (errors computed here by the frameworks themselves), an observed op class off the policy
is flagged, and the stored precision record reads back typed."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from conftest import import_jax_backend, require
from fwbench.frameworks import create_backend
from fwbench.models import get_model
from fwbench.precision import BF16_RULES, EXPECTED_DTYPES, OBSERVED_OPS, policy_mismatches
from fwbench.report.flags import precision_flags
from fwbench.runner.cell import parity
from fwbench.spec import Settings
from model_checks import reference_outputs
from test_report import row


def bf16_parity(runtime: str, pure: bool = False) -> tuple[dict[str, Any], dict[str, list[str]] | None]:
    """bert-tiny's bf16 parity check (parity shape) in ``runtime`` and what its graph showed; ``pure``: every
    weight and op in bfloat16 (the JAX parameter pytree cast and the model run without the policy), as a
    framework that ignores the policy would compute."""
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
        seen = backend.observe_precision(inputs)
    finally:
        if hasattr(backend, "_inference_mode"):  # torch's compile entered it for the process
            backend._inference_mode.__exit__(None, None, None)
    return parity(got, reference_outputs(description, weights, arrays), "bf16", description.name), seen


@pytest.fixture(scope="module")
def quiet_xla() -> None:
    """fwbench.frameworks.jax.backend imported without leaving its XLA variables in this environment."""
    require("jax")
    import_jax_backend()


def test_the_consistency_flag_fires_on_a_runtime_computing_pure_bf16(quiet_xla: None) -> None:
    runs = {
        "torch:eager": bf16_parity("torch:eager"),
        "jax:jit": bf16_parity("jax:jit"),
        "pure:jax": bf16_parity("jax:jit", pure=True),
    }
    checks = {runtime: check for runtime, (check, _) in runs.items()}
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
    # a training check (one loss) is never compared; the same errors as training rows flag nothing
    assert precision_flags([dataclasses.replace(r, phase="training") for r in records]) == {}
    # and the pure run's own graph shows it: its layer norms read the bfloat16 stream
    pure_seen = runs["pure:jax"][1]
    assert pure_seen is not None and "bfloat16" in pure_seen["layer_norm"], pure_seen
    assert any(m.startswith("layer_norm") for m in policy_mismatches("bf16", pure_seen)), pure_seen
    assert policy_mismatches("bf16", runs["jax:jit"][1] or {}) == []


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


def test_the_observations_catch_a_layer_norm_on_a_bfloat16_stream() -> None:
    """The layer-norm observation reads the stream entering the norm, so it can fail: torch with its weights in
    bfloat16 (model.to), and TF's layer norm traced on a bfloat16 tensor, both show it."""
    torch = require("torch")
    tf = require("tensorflow")
    description = get_model("bert-tiny")
    backend = create_backend("torch:eager", "cpu", Settings(threads=1))
    backend.build(description, description.canonical_weights(0))
    backend.model.to(torch.bfloat16)
    seen = backend.observe_precision(backend.make_inputs(description.make_inputs(2, 8, 0)))
    assert seen is not None and seen["layer_norm"] == ["bfloat16"], seen
    assert any(m.startswith("layer_norm") for m in policy_mismatches("bf16", seen)), seen
    from fwbench.frameworks.tensorflow import precision

    gamma, beta = tf.Variable(tf.ones([8])), tf.Variable(tf.zeros([8]))
    stream = tf.zeros([2, 8], tf.bfloat16)
    graph_seen = precision.observed_dtypes(lambda x: precision.layer_norm(x, gamma, beta, 1e-5), [stream])
    assert graph_seen["layer_norm"] == ["bfloat16", "float32"], graph_seen


def test_the_policy_table_is_the_one_the_observations_and_the_docs_use() -> None:
    """EXPECTED_DTYPES is derived from BF16_RULES, and docs/precision.md's table names every rule's op class."""
    observed_rules = [rule for rule in BF16_RULES if rule.observed is not None]
    assert [rule.op_class for rule in observed_rules] == list(OBSERVED_OPS)
    assert EXPECTED_DTYPES["bf16"] == {rule.op_class: rule.observed for rule in observed_rules}
    assert set(EXPECTED_DTYPES["fp32"].values()) == {"float32"}
    docs = (Path(__file__).resolve().parents[1] / "docs" / "precision.md").read_text()
    table_rows = [line.split("|")[1].strip() for line in docs.splitlines() if line.startswith("| ")]
    for rule in BF16_RULES:
        assert any(rule.op_class in first for first in table_rows), rule.op_class


def test_bf16_cells_say_whether_the_cpu_has_bf16_units() -> None:
    """The worker stores the CPU's bfloat16 units with every bf16 CPU cell; the note says emulated without."""
    from fwbench.measure.environment import BF16_UNITS, cpu_bf16_units
    from fwbench.report.flags import bf16_units_flag, cell_flags

    units = cpu_bf16_units()
    assert set(units) <= set(BF16_UNITS)
    assert bf16_units_flag(row(dtype="bf16", details={"cpu_bf16_units": []})) == [
        "bf16 emulated (no avx512_bf16/amx_bf16)"
    ]
    native = row(dtype="bf16", details={"cpu_bf16_units": ["avx512_bf16", "amx_bf16"]})
    assert "bf16 units: avx512_bf16,amx_bf16" in cell_flags(native)
    assert bf16_units_flag(row(dtype="fp32", details={"cpu_bf16_units": []})) == []
    assert bf16_units_flag(row(dtype="bf16")) == []  # stored before the units were recorded: nothing claimed


class _Observed:
    """A backend stand-in whose framework graph shows ``seen`` (or whose observation raises it)."""

    def __init__(self, seen: Any) -> None:
        self.seen = seen

    def observe_precision(self, inputs: Any) -> Any:
        if isinstance(self.seen, Exception):
            raise self.seen
        return self.seen


def test_a_cell_off_the_policy_is_a_mismatch_and_a_failed_look_is_recorded() -> None:
    import io

    from fwbench.messages import Job
    from fwbench.runner.cell import Cell
    from fwbench.spec import Case

    def recorded(seen: Any) -> dict[str, Any]:
        cell = Cell(
            Job(Case("bert-tiny", "jax:jit", batch_size=2, seq_len=16, dtype="bf16"), Settings()), io.StringIO()
        )
        cell.result["status"] = "ok"
        cell.record_precision(_Observed(seen), ())  # type: ignore[arg-type]
        return cell.result

    off = recorded({"matmul": ["bfloat16"], "layer_norm": ["bfloat16"]})
    assert off["status"] == "mismatch" and "layer_norm: bfloat16 (policy: float32)" in off["reason"], off
    on = recorded({"matmul": ["bfloat16"], "layer_norm": ["float32"]})
    assert on["status"] == "ok" and on["precision"]["mismatches"] == [], on
    engine = recorded(None)
    assert engine["status"] == "ok" and engine["precision"]["observed"] is None, engine
    failed = recorded(RuntimeError("tracing failed\nsecond line"))
    assert failed["status"] == "ok" and failed["precision"]["error"] == "RuntimeError: tracing failed", failed


def test_verify_marks_a_runtime_whose_errors_set_it_apart() -> None:
    from rich.console import Console

    from fwbench.report.verify_table import parity_table
    from fwbench.runner.verify import OutputCheck

    def check(runtime: str, error: float) -> OutputCheck:
        return OutputCheck(
            "bert-tiny", runtime, "ok", None, "last_hidden_state", (2, 16, 128), 0.0, 0.0, error, 0.0, 1.2e-2
        )

    checks = [check("torch:eager", 3.6e-4), check("jax:jit", 4.0e-4), check("pure:jax", 9.2e-3)]
    console = Console(record=True, width=400)
    console.print(parity_table("bf16", checks))
    lines = {line.split("│")[2].strip(): line for line in console.export_text().splitlines() if line.count("│") > 3}
    assert "ok, but last_hidden_state error 9.2e-03 is 23x" in lines["pure:jax"], lines
    assert "ok, but" not in lines["torch:eager"] and "ok, but" not in lines["jax:jit"], lines
