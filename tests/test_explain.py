"""``fwbench explain``: the split of a difference between two runtimes' profiled calls by op category (its parts add up
to the difference of the wall times), the matmul/conv rate beside it, the kernel libraries each cell recorded, the
levers, the refusals; and the rate row ``fwbench profile`` gains. One end-to-end run profiles the MLP in torch:eager
and jax:jit (a worker each); the rest works on profiles built here."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from conftest import fwbench_here
from fwbench.cli import explain as explain_cli
from fwbench.cli.explain import chosen_levers, chosen_runtimes, levers_by_base
from fwbench.frameworks.kernel_reports import VERBOSE_ENVIRONMENT
from fwbench.messages import NO_PROFILER, Job
from fwbench.models import get_model
from fwbench.profile.categories import CATEGORIES, Category
from fwbench.profile.cells import ProfiledCell
from fwbench.profile.summary import OpRow, ProfileSummary
from fwbench.report.explain import (
    OUTSIDE_OPS,
    OVERLAP,
    UNACCOUNTED,
    Explanation,
    explain_rows,
    headline,
    kernel_lines,
    lever_rows,
    parts,
    warning_lines,
)
from fwbench.report.html.page import to_html
from fwbench.report.kernels import TITLE, entry_summary, kernel_rows
from fwbench.report.peak import Peak
from fwbench.report.profile_rates import ModelFlops, category_rate, comparable_peak, matmul_flops, unrated_reason
from fwbench.report.table import report_tables
from fwbench.runner.outcome import CellOutcome
from fwbench.spec import Case, Plan, Settings, SpecError
from fwbench.store import ProfileRecord, RunRecord, Store
from report_store import Cell, add_run


def profiled(
    categories: dict[Category, float], overhead_s: float, overlap_s: float = 0.0, median_s: float = 0.0
) -> ProfiledCell:
    """A profile whose categories take ``categories`` seconds a call (ops overlapping by ``overlap_s``) and whose
    call spends ``overhead_s`` outside every op."""
    full = dict.fromkeys(CATEGORIES, 0.0) | categories
    busy = sum(full.values()) - overlap_s
    summary = ProfileSummary(2, busy + overhead_s, busy, overlap_s, overhead_s, full, [], [])
    return ProfiledCell(summary, "/t/trace.json", "profiler", median_s or busy + overhead_s, busy + overhead_s, "by op")


def record(runtime: str, cell: ProfiledCell, details: dict | None = None) -> ProfileRecord:
    return ProfileRecord(
        1, 1, f"bert-base|{runtime}", "bert-base", runtime, "inference", 1, 128, "fp32", "cpu", "ok", None, cell,
        details or {},
    )  # fmt: skip


SLOW = profiled({"matmul/conv": 0.080, "elementwise/activation": 0.010, "data movement": 0.004}, 0.006, 0.001)
FAST = profiled({"matmul/conv": 0.035, "elementwise/activation": 0.012, "attention/softmax": 0.002}, 0.003)


def test_the_parts_add_up_to_the_difference_of_the_wall_times_largest_first() -> None:
    found = parts(SLOW, FAST)
    assert sum(part.difference_s for part in found) == pytest.approx(FAST.summary.wall_s - SLOW.summary.wall_s)
    assert [part.label for part in found[:2]] == ["matmul/conv", "data movement"]  # |−45 ms|, then |−4 ms|
    assert found[-1].label == OVERLAP and found[-1].a_s == pytest.approx(-0.001)
    assert {part.label for part in found} == {
        "matmul/conv",
        "elementwise/activation",
        "data movement",
        "attention/softmax",
        OUTSIDE_OPS,
        OVERLAP,
    }  # fmt: skip  (the categories neither side has are left out)


def test_the_parts_keep_what_the_profiler_recorded_outside_the_workers_window() -> None:
    beyond = dataclasses.replace(SLOW, summary=dataclasses.replace(SLOW.summary, wall_s=0.080, overhead_s=0.0))
    found = parts(beyond, FAST)  # ops over 93 ms in a window of 80 ms: outside is 0, 13 ms are unaccounted
    assert sum(part.difference_s for part in found) == pytest.approx(FAST.summary.wall_s - 0.080)
    assert found[-1].label == UNACCOUNTED and found[-1].a_s == pytest.approx(-0.013)
    explanation = Explanation("x", record("a", beyond), record("b", FAST), None, None)
    assert any("outside the worker's clock window" in line for line in warning_lines(explanation))


def test_the_table_rates_the_matmuls_and_the_headline_names_the_faster_runtime() -> None:
    flops = matmul_flops("bert-base", "inference", 1, 128)
    assert flops is not None
    peak = Peak(200.0, "jax:jit", 1, 2, "fp32", "cpu")
    explanation = Explanation(
        "bert-base", record("torch:eager", SLOW), record("tensorflow:function", FAST), flops, peak
    )
    headers, rows = explain_rows(explanation)
    assert headers[1:3] == ["torch:eager", "tensorflow:function"]
    matmul = next(row for row in rows if row[0] == "matmul/conv")
    assert matmul[3].startswith("−45") and matmul[4] == f"{-0.045 / (FAST.summary.wall_s - SLOW.summary.wall_s):.0%}"
    rate = category_rate(SLOW, flops, peak)
    assert rate is not None and rate.gflops == pytest.approx(flops.total / 0.080 / 1e9)
    assert matmul[5] == rate.text() and "of peak" in matmul[5]
    assert [row[0] for row in rows[-3:]] == ["wall (profiled)", "median without profiler", "profiler overhead"]
    text = headline(explanation)
    assert text.startswith("tensorflow:function is ") and "as fast as torch:eager" in text and "matmul/conv" in text


def test_a_rate_needs_flops_time_and_a_split_by_op_and_a_peak_of_the_same_kind() -> None:
    flops = ModelFlops(8 * 10**9, 10**9)
    assert category_rate(SLOW, None, None) is None
    assert category_rate(profiled({"other": 0.01}, 0.001), flops, None) is None  # no matmul time
    one_program = dataclasses.replace(SLOW, attribution="one compiled program (fusion): the profiler does not split it")
    assert category_rate(one_program, flops, None) is None
    fused = profiled({"matmul/conv": 0.080, "compiled fusion": 0.020}, 0.001)  # 20% of the ops' time in fusions
    assert category_rate(fused, flops, None) is None and "compiled fusions hold 20%" in str(unrated_reason(fused))
    rate = category_rate(SLOW, flops, None)
    assert rate is not None and rate.gflops == pytest.approx(8e9 / 0.080 / 1e9) and rate.peak_fraction is None
    peak = Peak(200.0, "jax:jit", 1, 2, "fp32", "cpu")
    assert comparable_peak(peak, "bf16", "cpu", 2) is None and comparable_peak(peak, "fp32", "cpu", 1) is None
    assert comparable_peak(peak, "fp32", "cpu", None) is peak
    assert matmul_flops("bert-base", "training", 1, 128) is None
    bert = get_model("bert-base")
    assert matmul_flops("bert-base", "inference", 1, 128) == ModelFlops(
        bert.forward_flops(1, 128), 12 * 4 * 128 * 128 * 768
    )  # attention: 4·S²·H per layer, 12 layers
    assert matmul_flops("resnet50", "inference", 1, None) == ModelFlops(get_model("resnet50").forward_flops(1, None))


def test_a_fused_attention_op_takes_attentions_flops_out_of_the_matmul_rate() -> None:
    sdpa = OpRow("aten::_scaled_dot_product_flash_attention_for_cpu", "attention/softmax", 12.0, 0.006)
    fused = dataclasses.replace(SLOW, summary=dataclasses.replace(SLOW.summary, ops=[sdpa]))
    softmax_only = OpRow("_MklSoftmax", "attention/softmax", 12.0, 0.001)
    unfused = dataclasses.replace(SLOW, summary=dataclasses.replace(SLOW.summary, ops=[softmax_only]))
    flops = ModelFlops(9 * 10**9, 10**9)
    fused_rate, unfused_rate = category_rate(fused, flops, None), category_rate(unfused, flops, None)
    assert fused_rate is not None and fused_rate.gflops == pytest.approx(8e9 / 0.080 / 1e9)
    assert unfused_rate is not None and unfused_rate.gflops == pytest.approx(9e9 / 0.080 / 1e9)


def test_kernel_lines_list_each_runtimes_libraries_or_say_none_were_recorded() -> None:
    kernels = [
        {"library": "oneMKL", "version": "2024.0", "isa": "Intel(R) Architecture processors", "ops": ["SGEMM"]},
        {"library": "Eigen", "version": None, "isa": None, "ops": [], "not_reported": "Eigen reports nothing"},
    ]
    lines = kernel_lines([record("torch:eager", SLOW, {"kernels": kernels}), record("jax:jit", FAST)])
    assert lines[0] == (
        "torch:eager kernels: oneMKL 2024.0 (ISA Intel(R) Architecture processors; SGEMM) · Eigen (ISA not reported)"
    )
    assert lines[1] == "jax:jit kernels: none recorded"


def test_runtimes_and_levers_are_chosen_as_asked() -> None:
    assert chosen_runtimes("torch:eager, tensorflow:function") == ("torch:eager", "tensorflow:function")
    for bad in ("torch:eager", "torch:eager,torch:eager", "a,b,c"):
        with pytest.raises(SpecError, match="two different runtimes"):
            chosen_runtimes(bad)
    runtimes = ("torch:eager", "tensorflow:function")
    assert chosen_levers("auto", runtimes) == ["torch:compile", "onnxruntime:torch", "tensorflow:xla"]
    assert chosen_levers("none", runtimes) == []
    assert chosen_levers("torch:script,tensorflow:function", runtimes) == ["torch:script"]
    assert levers_by_base(["torch:compile", "tensorflow:xla", "torch:script"], runtimes) == {
        "torch:eager": ["torch:compile", "torch:script"],
        "tensorflow:function": ["tensorflow:xla"],
    }


def test_explain_refuses_bad_input_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "e.db"
    code, _, err = fwbench_here(capsys, "explain", "mlp", "--runtimes", "torch:eager", "--db", str(db))
    assert code == 2 and "two different runtimes" in err and len(err.strip().splitlines()) == 1
    code, _, err = fwbench_here(
        capsys, "explain", "no-such-model", "--runtimes", "torch:eager,jax:jit", "--db", str(db)
    )
    assert code == 2 and "unknown model" in err


def test_explain_profiles_both_runtimes_and_splits_their_difference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "e.db"
    code, out, err = fwbench_here(
        capsys,
        *("explain", "mlp", "--runtimes", "torch:eager,jax:jit", "--levers", "none", "--batch-size", "4"),
        *("--threads", "1", "--calls", "2", "--db", str(db), "--out", str(tmp_path / "traces")),
    )
    assert code == 0, err
    assert "as fast as" in out and "per profiled call" in out and "median without profiler" in out
    assert "torch:eager kernels: " in out and "jax:jit kernels: " in out and "rate: the model's" in out
    with Store.open(db, readonly=True) as store:
        records = {r.runtime: r for r in store.profiles()}
    assert set(records) == {"torch:eager", "jax:jit"} and all(r.status == "ok" for r in records.values())
    a, b = records["torch:eager"].cell, records["jax:jit"].cell
    assert a is not None and b is not None
    assert sum(p.difference_s for p in parts(a, b)) == pytest.approx(b.summary.wall_s - a.summary.wall_s, abs=1e-9)
    for runtime, row in records.items():  # each cell recorded its kernel libraries, each entry says where from
        assert row.details["kernels"], runtime
        assert all(entry.get("source") or entry.get("not_reported") for entry in row.details["kernels"]), runtime


def test_profiled_calls_unlike_the_timed_ones_are_flagged() -> None:
    distorted = profiled({"matmul/conv": 0.1}, 0.05, median_s=0.1)  # profiled 150 ms, 100 ms without the profiler
    explanation = Explanation("bert-base", record("torch:eager", distorted), record("jax:jit", FAST), None, None)
    (line,) = warning_lines(explanation)
    assert line.startswith("warning: torch:eager's profiled calls took +50%")
    assert warning_lines(Explanation("bert-base", record("a", SLOW), record("b", FAST), None, None)) == []
    one_program = dataclasses.replace(FAST, attribution="one compiled program (fusion.1)")
    lines = warning_lines(Explanation("x", record("a", SLOW), record("b", one_program), None, None))
    assert lines == ["warning: b's profile is not split by op (one compiled program (fusion.1))"]
    flipped = dataclasses.replace(FAST, unprofiled_median_s=0.2)  # faster under the profiler, slower without it
    lines = warning_lines(Explanation("x", record("a", SLOW), record("b", flipped), None, None))
    assert any("the other sign" in line for line in lines)


def test_reports_show_the_kernel_libraries_each_runtime_recorded(tmp_path: Path) -> None:
    kernels = [
        {"library": "oneMKL", "version": "2024.0", "isa": "Intel(R) Architecture processors", "ops": ["SGEMM"],
         "source": "MKL_VERBOSE"},
        {"library": "Eigen", "version": None, "isa": None, "ops": ["all ops"], "source": "IsMklEnabled()",
         "not_reported": "Eigen reports nothing"},
    ]  # fmt: skip
    cells = [
        Cell(Case("bert-tiny", "torch:eager", batch_size=1, seq_len=64), [1e-3] * 6, details={"kernels": kernels[:1]}),
        Cell(Case("bert-tiny", "torch:eager", batch_size=8, seq_len=64), [4e-3] * 6, details={"kernels": kernels[:1]}),
        Cell(
            Case("bert-tiny", "tensorflow:function", batch_size=1, seq_len=64),
            [2e-3] * 6,
            details={"kernels": kernels[1:]},
        ),
    ]
    with Store.open(tmp_path / "k.db") as store:
        run_id = add_run(store, cells)
        results = store.results([run_id])
    assert kernel_rows(results) == [
        ["torch:eager", "oneMKL", "2024.0", "Intel(R) Architecture processors", "SGEMM", "MKL_VERBOSE",
         "bert-tiny b1 s64, bert-tiny b8 s64"],
        ["tensorflow:function", "Eigen", "—", "not reported: Eigen reports nothing", "all ops", "IsMklEnabled()",
         "bert-tiny b1 s64"],
    ]  # fmt: skip
    tables, legend = report_tables(results)
    assert any(table.title == TITLE for table in tables) and any(
        line.startswith("Kernel libraries:") for line in legend
    )
    page = to_html(store_runs(tmp_path / "k.db"), results, baseline="torch:eager")
    assert '<section id="kernels">' in page and "not reported: Eigen reports nothing" in page


def store_runs(path: Path) -> list[RunRecord]:
    with Store.open(path, readonly=True) as store:
        return store.runs()


def test_the_kernel_probe_runs_in_a_cells_first_round_only() -> None:
    job = Job(Case("mlp", "torch:eager"), Settings(), record_kernels=False)
    assert Job.from_json(job.to_json()).record_kernels is False
    assert Job.from_json(Job(Case("mlp", "torch:eager"), Settings()).to_json()).record_kernels is True


def test_a_failed_probe_says_why_in_short() -> None:
    failed: dict[str, object] = {
        "library": None,
        "version": None,
        "isa": None,
        "ops": [],
        "source": None,
        "not_reported": "x" * 500,
    }
    text = entry_summary(failed)
    assert text.startswith("not reported: xxx") and text.endswith("…") and len(text) < 200


def test_a_rate_above_the_measured_peak_says_it_is_not_one() -> None:
    peak = Peak(200.0, "jax:jit", 1, 2, "fp32", "cpu")
    rate = category_rate(SLOW, ModelFlops(int(0.080 * 300e9)), peak)  # 300 GFLOP/s against a 200 GFLOP/s peak
    assert rate is not None and rate.above_peak and "above the peak" in rate.text()
    within = category_rate(SLOW, ModelFlops(int(0.080 * 150e9)), peak)
    assert within is not None and not within.above_peak and "above" not in within.text()


def lever_plan() -> Plan:
    return Plan((Case("bert-base", "onnxruntime:torch", seq_len=128),), Settings(threads=2))


def test_only_a_lever_fwbench_cannot_profile_is_timed_as_a_plain_cell(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = lever_plan()
    (case,) = plan.cases
    calls: list[tuple[Case, bool]] = []

    def fake_run_worker(case: Case, settings: Settings, check_parity: bool = True, **_: object) -> CellOutcome:
        calls.append((case, check_parity))
        return CellOutcome(case, "ok", fields={"median_s": 0.1}, details={"kernels": [{"library": "MLAS"}]})

    monkeypatch.setattr(explain_cli, "run_worker", fake_run_worker)
    no_profiler = dataclasses.replace(
        record("onnxruntime:torch", SLOW), case_key=case.key, cell=None, status="error",
        reason=f"NotImplementedError during profile: onnxruntime:torch {NO_PROFILER}",
    )  # fmt: skip
    lever = explain_cli.measured_lever(no_profiler, plan, None, None)
    assert lever.plain and lever.median_s == 0.1 and lever.kernels == ({"library": "MLAS"},)
    assert calls == [(case, True)]  # parity checked
    mismatch = dataclasses.replace(no_profiler, status="mismatch", reason="outputs off the reference")
    lever = explain_cli.measured_lever(mismatch, plan, None, None)
    assert lever.median_s is None and lever.note == "mismatch: outputs off the reference" and len(calls) == 1
    (row,) = lever_rows(0.2, [explain_cli.measured_lever(no_profiler, plan, None, None)])
    assert row[2] == "2.00× (plain cell)"


def test_a_library_that_reports_only_from_start_up_gets_a_probe_cell(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = lever_plan()
    (case,) = plan.cases
    silent = {"library": "oneDNN", "isa": None, "not_reported": "silent", VERBOSE_ENVIRONMENT: {"ONEDNN_VERBOSE": "1"}}
    envs: list[object] = []
    status = "ok"

    def fake_run_worker(case: Case, settings: Settings, check_parity: bool = True, **kwargs: object) -> CellOutcome:
        envs.append(kwargs.get("env"))
        return CellOutcome(case, status, "it hung" if status != "ok" else None,
                           details={"kernels": [{"library": "oneDNN", "isa": "avx2", "source": "oneDNN verbose"}]})  # fmt: skip

    monkeypatch.setattr(explain_cli, "run_worker", fake_run_worker)
    probed = explain_cli.probed_kernels(case, plan, {"kernels": [silent]})
    assert envs == [{"ONEDNN_VERBOSE": "1"}] and probed is not None
    assert probed[0]["isa"] == "avx2" and "a probe cell started with ONEDNN_VERBOSE=1" in probed[0]["source"]
    status = "timeout"
    (failed,) = explain_cli.probed_kernels(case, plan, {"kernels": [silent]}) or []
    assert failed["isa"] is None and "the probe cell started with ONEDNN_VERBOSE=1 ended timeout: it hung" in str(
        failed["not_reported"]
    )
    assert explain_cli.probed_kernels(case, plan, {"kernels": [{"library": "MLAS"}]}) is None and len(envs) == 2


def test_a_headline_over_parts_that_go_both_ways_names_two() -> None:
    a = profiled({"matmul/conv": 0.050, "elementwise/activation": 0.005}, 0.004)
    b = profiled({"matmul/conv": 0.045, "elementwise/activation": 0.012}, 0.003)  # +7 ms, −5 ms, −1 ms: +1 ms
    text = headline(Explanation("resnet50", record("a", a), record("b", b), None, None))
    assert "its parts go both ways: elementwise/activation +7 ms, matmul/conv −5 ms." in text
