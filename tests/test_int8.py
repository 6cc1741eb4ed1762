"""`--dtype int8`: ONNX Runtime's dynamic quantisation and LiteRT's dynamic-range quantisation of our exported
models, checked against the float64 reference with int8's own limit; every other runtime skipped with the reason;
the report's table of reduced precision against the same runtime's fp32 cell. ``make test`` runs an int8 cell of the
MLP on onnxruntime:torch (it checks its parity at the int8 limit); litert:tensorflow's cell and ``fwbench verify`` of
every tiny model on the three quantising engines are the matrix's (``make test-matrix``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import require, run_args
from fwbench.cli import main
from fwbench.frameworks import get_runtime
from fwbench.report.dtypes import dtype_comparisons
from fwbench.runner.planner import build_plan
from fwbench.runner.tolerances import PARITY_REL_L2_TOLERANCE, parity_tolerance
from fwbench.runner.verify import verify_model
from fwbench.spec import Case, Settings
from fwbench.store import Store
from report_store import Cell, add_run, timed

INT8_RUNTIMES = ("onnxruntime:torch", "onnxruntime:tensorflow", "litert:tensorflow")
OTHERS = ("torch:eager", "openvino:torch", "tensorflow:savedmodel", "jax:jit")


def test_int8_runs_on_the_quantising_engines_only() -> None:
    plan = build_plan(["mlp"], [*OTHERS, *INT8_RUNTIMES], [1], [], Settings(), dtype="int8")
    assert [case.runtime for case in plan.cases] == list(INT8_RUNTIMES)
    reasons = {s.case.runtime: s.reason for s in plan.skipped}
    assert reasons == {
        r: f"{r} cannot compute in int8 (it computes in {', '.join(get_runtime(r).dtypes)})" for r in OTHERS
    }


def test_int8_is_inference_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "r.db"
    args = ["run", "--models", "mlp", "--runtimes", "onnxruntime:torch", "--dtype", "int8", "--db", str(db)]
    assert main([*args, "--phase", "training"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "int8" in err and not db.exists()


@pytest.mark.slow
@pytest.mark.matrix  # the MLP's int8 cells: test_an_int8_cell_stores_what_was_quantised_and_the_cpus_int8_units
@pytest.mark.parametrize("model", ["bert-tiny", "resnet-tiny"])
def test_int8_engines_stay_within_the_int8_limit_and_really_quantise(model: str) -> None:
    require("onnxruntime")
    checks = verify_model(model, INT8_RUNTIMES, Settings(threads=1, timeout_s=300), dtype="int8")
    assert {c.runtime for c in checks} == set(INT8_RUNTIMES)
    failed = [(c.runtime, c.output, c.status, c.reason, c.rel_l2_vs_reference) for c in checks if not c.passed]
    assert not failed
    limit = parity_tolerance(model, "int8")
    errors = [c.rel_l2_vs_reference for c in checks]
    assert all(e is not None and e <= limit for e in errors)
    # 8-bit weights move every output by far more than float32 rounding does: the file was really quantised
    assert all(e is not None and e > 10 * PARITY_REL_L2_TOLERANCE["fp32"] for e in errors)


def test_the_report_sets_reduced_precision_beside_the_same_runtimes_fp32(
    db_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def parity(rel_l2: float, limit: float) -> dict[str, object]:
        outputs = {"logits": {"rel_l2": rel_l2, "max_abs": rel_l2}}
        return {"parity": {"ok": True, "tolerance_rel_l2": limit, "outputs": outputs}}

    runtime = "onnxruntime:torch"
    cells = [
        Cell(Case("mlp", runtime, batch_size=8), timed(2e-3, seed=1), details=parity(3e-7, 1e-4)),
        Cell(Case("mlp", runtime, batch_size=8, dtype="int8"), timed(1e-3, seed=2), details=parity(1.2e-2, 0.1)),
        Cell(Case("mlp", "litert:tensorflow", batch_size=8, dtype="int8"), timed(1e-3, seed=3)),  # no fp32 cell
    ]
    with Store.open(db_path) as store:
        add_run(store, cells)
        results = store.results()
    (item,) = dtype_comparisons(results)
    assert item.row.runtime == runtime and item.row.dtype == "int8" and item.fp32.dtype == "fp32"
    assert item.speedup is not None and item.speedup.ratio == pytest.approx(2.0, rel=0.05)
    assert item.speedup.ci_low is not None and item.speedup.ci_low > 1  # 3 rounds a side: a CI
    assert (item.error, item.fp32_error, item.limit) == (1.2e-2, 3e-7, 0.1)
    assert main(["report", "--db", str(db_path)]) == 0
    out = capsys.readouterr().out
    assert "Reduced precision against fp32" in out and "1.2e-02" in out and "3.0e-07" in out
    page = db_path.parent / "report.html"
    assert main(["report", "--db", str(db_path), "--html", str(page)]) == 0
    html = page.read_text()
    section = html[html.index('<section id="reduced-precision">') :]
    assert "1.2e-02" in section.split("</section>")[0] and "int8" in section.split("</section>")[0]


@pytest.mark.slow
@pytest.mark.parametrize(  # ONNX Runtime's in make test, LiteRT's in the matrix (make test-matrix)
    "runtime", ["onnxruntime:torch", pytest.param("litert:tensorflow", marks=pytest.mark.matrix)]
)
def test_an_int8_cell_stores_what_was_quantised_and_the_cpus_int8_units(db_path: Path, runtime: str) -> None:
    require("onnxruntime")
    from fwbench.measure.environment import cpu_int8_units

    flags = ("--models", "mlp", "--runtimes", runtime, "--dtype", "int8")
    assert main(run_args(*flags, db=db_path, max_time=0.2)) == 0
    with Store.open(db_path, readonly=True) as store:
        rows = {row.runtime: row for row in store.results()}
    assert set(rows) == {runtime} and all(row.status == "ok" for row in rows.values())
    if runtime == "onnxruntime:torch":
        ort = rows["onnxruntime:torch"].details["compile_report"]
        assert ort["quantized_ops"].get("MatMulInteger", 0) >= 1 and "reduce_range=True" in ort["quantization"]
    else:
        assert rows["litert:tensorflow"].details["compile_report"]["int8_tensors"] >= 1
    assert all(row.details["cpu_int8_units"] == cpu_int8_units() for row in rows.values())
