"""Suites: built-in files, several grids per suite, a settings file, validation and estimates."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from fwbench.cli import build_parser, main, plan_from_args, suite_plan
from fwbench.frameworks import get_runtime
from fwbench.models import get_model
from fwbench.runner.estimate import format_estimate
from fwbench.runner.phases import estimate_s
from fwbench.runner.planner import PlanChoices, resolve_plan
from fwbench.spec import Case, Settings, SpecError
from fwbench.suites import builtin_suites, load_settings_file, load_suite, parse_suite


def _run_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["run", *argv])


def test_builtin_suites_all_load_and_plan() -> None:
    assert builtin_suites() == [
        "bf16",
        "bf16-training",
        "data",
        "deploy",
        "distributed",
        "generate",
        "generate-full",
        "hf2019",
        "mlp",
        "quick",
        "runtimes",
        "serving",
        "serving-full",
        "tfjs",
        "training",
    ]
    for name in builtin_suites():
        if name == "distributed" and len(os.sched_getaffinity(0)) < 2:  # 2 processes on 2 cores: refused on fewer
            with pytest.raises(SpecError, match="--procs 2 with 1 thread"):
                suite_plan(load_suite(name), threads=1)
            continue
        plan = suite_plan(load_suite(name), threads=1)
        assert plan.cases and plan.suite == name


def test_quick_suite_covers_every_framework_and_a_real_size_model() -> None:
    plan = suite_plan(load_suite("quick"), threads=2)
    frameworks = {get_runtime(case.runtime).framework for case in plan.cases}
    assert frameworks == {"torch", "tensorflow", "jax", "keras"}
    assert {"mlp", "bert-tiny", "bert-base"} <= {case.model for case in plan.cases}
    assert get_model("bert-base").parameter_count() > 100e6
    assert plan.settings.rounds == 3  # the fewest rounds that give a CI
    assert estimate_s(plan.cases, plan.settings) < 480  # the main job with CIs: ≤ 8 minutes on 2 cores (issue 14)


def test_the_generate_suite_is_the_two_decoders_in_each_frameworks_fastest_mode_ort_and_genai() -> None:
    plan = suite_plan(load_suite("generate"), threads=2)
    assert {case.phase for case in plan.cases} == {"generate"} and plan.settings.new_tokens == 32
    assert {case.model for case in plan.cases} == {"gpt2", "smollm-135m"}
    assert {(case.batch_size, case.seq_len) for case in plan.cases} == {(1, 128), (8, 128)}
    frameworks = [get_runtime(runtime).framework for runtime in {case.runtime for case in plan.cases}]
    # one mode each, ONNX Runtime and a vendor's generation loop
    assert sorted(frameworks) == ["jax", "onnxruntime", "onnxruntime-genai", "tensorflow", "torch"]
    full = suite_plan(load_suite("generate-full"), threads=2)
    assert {case.runtime for case in plan.cases} < {case.runtime for case in full.cases}


def test_the_serving_suites_hold_the_floor_and_fit_their_time() -> None:
    """serving: each framework's native runtime, a deployment engine, TorchServe and the floor, on one core each
    side, within 10 minutes by the estimate; serving-full: every built-in inference runtime."""
    from fwbench.frameworks import BUILTIN_PACKAGE, native_runtimes, runtimes

    plan = suite_plan(load_suite("serving"), threads=2)
    assert {case.phase for case in plan.cases} == {"serving"} and plan.settings.threads == 1
    assert {case.model for case in plan.cases} == {"bert-tiny", "resnet-tiny"}
    served = {case.runtime for case in plan.cases}
    assert {"floor:identity", "onnxruntime:torch", "torchserve:torch", *native_runtimes()} == served
    assert estimate_s(plan.cases, plan.settings) < 600
    full = suite_plan(load_suite("serving-full"), threads=2)
    inference = {
        name
        for name, info in runtimes().items()
        if "inference" in info.phases and info.module.startswith(BUILTIN_PACKAGE) and not info.unavailable
    }
    assert {case.runtime for case in full.cases} == inference | {"floor:identity", "torchserve:torch"}


def test_runtimes_suite_is_every_builtin_runtime_on_bert_base_and_resnet50() -> None:
    from fwbench.frameworks import BUILTIN_PACKAGE, runtimes

    plan = suite_plan(load_suite("runtimes"), threads=2)
    inference = {  # built in (a test may have loaded the fake plugin runtimes into this process)
        name
        for name, info in runtimes().items()
        if "inference" in info.phases and info.module.startswith(BUILTIN_PACKAGE)
    }
    assert {case.runtime for case in plan.cases} == inference
    assert {case.model for case in plan.cases} == {"bert-base", "resnet50"}


def test_deploy_suite_is_every_deployment_runtime_against_the_fastest_modes() -> None:
    from fwbench.frameworks import runtimes

    plan = suite_plan(load_suite("deploy"), threads=2)
    # what fwbench export writes (onnxruntime-genai:torch's artefact is a generation loop's, phase generate only)
    deployment = {name for name, info in runtimes().items() if info.artefact and "inference" in info.phases}
    assert {case.runtime for case in plan.cases} == deployment | {"torch:eager", "tensorflow:xla"}
    assert {(case.model, case.batch_size) for case in plan.cases} == {
        (model, batch) for model in ("bert-base", "resnet50") for batch in (1, 8)
    }
    assert {case.dtype for case in plan.cases} == {"fp32", "int8"}
    int8 = {(c.model, c.runtime, c.batch_size, c.seq_len) for c in plan.cases if c.dtype == "int8"}
    fp32 = {(c.model, c.runtime, c.batch_size, c.seq_len) for c in plan.cases if c.dtype == "fp32"}
    assert int8 and int8 <= fp32  # every int8 cell beside its own fp32 cell (the report's reduced-precision table)
    assert {runtime for _, runtime, _, _ in int8} == {r for r, info in runtimes().items() if "int8" in info.dtypes}


@pytest.mark.parametrize(("suite", "phase"), [("bf16", "inference"), ("bf16-training", "training")])
def test_bf16_suites_pair_every_fp32_cell_with_its_bf16_cell(suite: str, phase: str) -> None:
    """Issue 20's measurement: the same cells in fp32 and bf16, so every runtime's fp32/bf16 ratio is in one run."""
    plan = suite_plan(load_suite(suite), threads=2)
    cells = {(case.model, case.runtime, case.batch_size, case.phase) for case in plan.cases}
    by_dtype = {
        dtype: {(c.model, c.runtime, c.batch_size, c.phase) for c in plan.cases if c.dtype == dtype}
        for dtype in ("fp32", "bf16")
    }
    assert by_dtype["fp32"] == by_dtype["bf16"] == cells
    assert {phase_ for *_, phase_ in cells} == {phase}
    assert {runtime for _, runtime, *_ in cells} == {
        "torch:eager",
        "torch:compile",
        "tensorflow:function",
        "tensorflow:xla",
        "jax:jit",
        "keras:jax",
    }


def test_grids_are_merged_in_order_without_duplicates() -> None:
    suite = parse_suite(
        "two",
        """
models = ["mlp"]
runtimes = ["torch:eager"]
batch_sizes = [1, 2]

[[grid]]
models = ["mlp", "bert-tiny"]
runtimes = ["torch:eager"]
batch_sizes = [2]
seq_lens = [8]
""",
        "two.toml",
    )
    plan = suite_plan(suite, threads=1)
    assert [(c.model, c.batch_size, c.seq_len) for c in plan.cases] == [
        ("mlp", 1, None),
        ("mlp", 2, None),
        ("bert-tiny", 2, 8),
    ]


def test_a_grid_flag_replaces_that_axis_in_every_grid(tmp_path: Path) -> None:
    plan = plan_from_args(_run_args("--suite", "quick", "--batch-sizes", "3", "--threads", "1"))
    assert {case.batch_size for case in plan.cases} == {3}
    assert {case.model for case in plan.cases} == {"mlp", "bert-tiny", "bert-base"}


def test_the_quick_suite_buys_extra_rounds_within_its_budget_and_flags_override_it() -> None:
    quick = plan_from_args(_run_args("--suite", "quick", "--threads", "1")).settings
    assert (quick.budget_s, quick.target_ci, quick.round_limit) == (450.0, 0.05, 10)
    flagged = _run_args(
        "--suite", "quick", "--budget", "2m", "--target-ci", "0.1", "--max-rounds", "4", "--threads", "1"
    )
    settings = plan_from_args(flagged).settings
    assert (settings.budget_s, settings.target_ci, settings.max_rounds) == (120.0, 0.1, 4)
    assert plan_from_args(_run_args("--suite", "quick", "--budget", "1.5h", "--threads", "1")).settings.budget_s == 5400
    # the round limit is never below --rounds; without a budget (a grid of flags) there are no extra rounds
    plain = plan_from_args(_run_args("--models", "mlp", "--runtimes", "torch:eager", "--rounds", "12")).settings
    assert plain.budget_s is None and plain.round_limit == 12


def test_settings_file_sits_between_the_suite_and_the_flags(tmp_path: Path) -> None:
    config = tmp_path / "settings.toml"
    config.write_text('[settings]\nmax_time_s = 1.5\ntimeout_s = 100.0\nprotocol = "hf2019"\n')
    plan = plan_from_args(_run_args("--suite", "quick", "--config", str(config), "--timeout", "50", "--threads", "1"))
    assert plan.settings.max_time_s == 1.5  # the file beats the suite's 7.5
    assert plan.settings.timeout_s == 50  # the flag beats the file
    assert plan.settings.protocol == "hf2019"
    assert load_settings_file(config) == {"max_time_s": 1.5, "timeout_s": 100.0, "protocol": "hf2019"}


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("[settings]\nthreds = 2\n", "unknown [settings] keys ['threds']"),
        ("threads = 2\n", "unknown keys ['threads']; a settings file holds one [settings] table"),
        ("# nothing\n", "no [settings] table"),
        ('[settings]\nprotocol = "fast"\n', "unknown protocol 'fast'"),
        ("[settings\n", "not valid TOML"),
    ],
)
def test_bad_settings_files(capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str, fragment: str) -> None:
    config = tmp_path / "settings.toml"
    config.write_text(content)
    db = tmp_path / "x.db"
    assert main(["run", "--suite", "quick", "--config", str(config), "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert fragment in err and len(err.strip().splitlines()) == 1
    assert not db.exists()


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ('[[grid]]\nmodels = ["mlp"]\nruntimes = ["torch:eager"]\n', "[[grid]] 1: missing keys ['batch_sizes']"),
        (
            '[[grid]]\nmodels = ["mlp"]\nruntimes = ["torch:eager"]\nbatch_sizes = [1]\nnodes = 2\n',
            "[[grid]] 1: unknown keys ['nodes']; allowed: ['batch_sizes', 'device', 'dtype', 'models', 'phase', "
            "'procs', 'runtimes', 'scaling', 'seq_lens', 'workers']",
        ),
        (
            '[[grid]]\nmodels = ["mlp"]\nruntimes = ["torch:eager"]\nbatch_sizes = [1]\nphase = 1\n',
            "[[grid]] 1: phase must be a string",
        ),
        (
            'phase = ["training"]\n[[grid]]\nmodels = ["mlp"]\nruntimes = ["torch:eager"]\nbatch_sizes = [1]\n',
            "phase must be a string",
        ),
        (
            '[[grid]]\nmodels = ["mlp"]\nruntimes = ["torch:eager"]\nbatch_sizes = [1]\n'
            '[[grid]]\nmodels = ["mlp"]\nruntimes = ["torch:eager"]\nbatch_sizes = [1]\ndtype = "fp16"\n',
            "dtype 'fp16' cannot be run yet; runnable: fp32, bf16",
        ),
        (
            '[[grid]]\nmodels = ["mlp"]\nruntimes = ["torch:eager"]\nbatch_sizes = [1]\n'
            '[[grid]]\nmodels = ["mlp"]\nruntimes = ["torch:eager"]\nbatch_sizes = [3]\nphase = "fit"\n',
            "phase fit: batch size 3 does not divide the 4096 fit samples",
        ),
        ("grid = 3\n", "grid must be an array of tables"),
        (
            '[[grid]]\nmodels = ["mlp"]\nruntimes = ["torch:eager"]\nbatch_sizes = [1]\n'
            '[[grid]]\nmodels = ["nope"]\nruntimes = ["torch:eager"]\nbatch_sizes = [1]\n',
            "unknown model 'nope'",
        ),
        (
            'models = ["mlp"]\nruntimes = ["torch:eager"]\nbatch_sizes = [1]\n[settings]\nspeed = 1\n',
            "unknown [settings] keys ['speed']",
        ),
        ('models = "mlp"\nruntimes = ["torch:eager"]\nbatch_sizes = [1]\n', "models must be a list of str"),
    ],
)
def test_bad_suite_grids(capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str, fragment: str) -> None:
    suite = tmp_path / "mine.toml"
    suite.write_text(content)
    db = tmp_path / "x.db"
    assert main(["run", "--suite", str(suite), "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert fragment in err and str(suite) in err and len(err.strip().splitlines()) == 1
    assert not db.exists()


MIXED = """
description = "inference in fp32 and bf16, training in fp32"

[[grid]]
models = ["mlp"]
runtimes = ["torch:eager", "jax:jit"]
batch_sizes = [1, 8]

[[grid]]
models = ["mlp"]
runtimes = ["torch:eager", "jax:jit"]
batch_sizes = [8]
dtype = "bf16"

[[grid]]
models = ["mlp"]
runtimes = ["torch:eager", "torch:script"]
batch_sizes = [8]
phase = "training"
"""


def test_a_grid_sets_its_own_phase_and_dtype() -> None:
    suite = parse_suite("mixed", MIXED, "mixed.toml")
    assert [(g.phase, g.dtype, g.device) for g in suite.grids] == [
        ("inference", "fp32", "cpu"),
        ("inference", "bf16", "cpu"),
        ("training", "fp32", "cpu"),
    ]
    plan = suite_plan(suite, threads=1)
    cells = [(c.runtime, c.phase, c.dtype, c.batch_size) for c in plan.cases]
    assert cells == [
        ("torch:eager", "inference", "fp32", 1),
        ("torch:eager", "inference", "fp32", 8),
        ("jax:jit", "inference", "fp32", 1),
        ("jax:jit", "inference", "fp32", 8),
        ("torch:eager", "inference", "bf16", 8),
        ("jax:jit", "inference", "bf16", 8),
        ("torch:eager", "training", "fp32", 8),
    ]
    # torch:script has no training: kept as skipped with the reason, at plan time
    (skipped,) = plan.skipped
    assert (skipped.case.runtime, skipped.case.phase) == ("torch:script", "training") and skipped.reason


def test_a_suites_phase_and_dtype_are_every_grids_default() -> None:
    suite = parse_suite("t", 'phase = "training"\ndtype = "bf16"\n' + MIXED.split("\n", 2)[2], "t.toml")
    assert [(g.phase, g.dtype) for g in suite.grids] == [("training", "bf16")] * 2 + [("training", "bf16")]
    suite = parse_suite(
        "t",
        'dtype = "bf16"\n[[grid]]\nmodels = ["mlp"]\nruntimes = ["jax:jit"]\nbatch_sizes = [1]\ndtype = "fp32"\n',
        "t.toml",
    )
    assert [g.dtype for g in suite.grids] == ["fp32"]  # the grid's own value beats the suite's


def test_a_phase_or_dtype_flag_overrides_every_grids_own(tmp_path: Path) -> None:
    path = tmp_path / "mixed.toml"
    path.write_text(MIXED)
    plan = plan_from_args(_run_args("--suite", str(path), "--threads", "1"))
    assert {(c.phase, c.dtype) for c in plan.cases} == {
        ("inference", "fp32"),
        ("inference", "bf16"),
        ("training", "fp32"),
    }
    plan = plan_from_args(_run_args("--suite", str(path), "--phase", "training", "--threads", "1"))
    assert {(c.phase, c.dtype) for c in plan.cases} == {("training", "fp32"), ("training", "bf16")}
    plan = plan_from_args(_run_args("--suite", str(path), "--dtype", "fp32", "--threads", "1"))
    assert {(c.phase, c.dtype) for c in plan.cases} == {("inference", "fp32"), ("training", "fp32")}
    assert plan.suite == "mixed"


def test_resolve_plan_precedence_without_a_parser(tmp_path: Path) -> None:
    """flags > settings file > suite > defaults, through the planner's own entry point."""
    config = tmp_path / "settings.toml"
    config.write_text("[settings]\nmax_time_s = 1.5\nseed = 4\n")
    plan = resolve_plan(PlanChoices(suite="quick", config=config, settings={"threads": 1, "seed": 7}))
    assert (plan.settings.max_time_s, plan.settings.seed, plan.settings.threads) == (1.5, 7, 1)
    assert plan.settings.timeout_s == Settings().timeout_s  # the default: neither suite, file nor flag sets it
    plan = resolve_plan(PlanChoices(models="mlp", runtimes="torch:eager", settings={"threads": 1}))
    assert plan.suite is None and [(c.batch_size, c.phase, c.dtype) for c in plan.cases] == [(1, "inference", "fp32")]
    with pytest.raises(SpecError, match="give both --models and --runtimes"):
        resolve_plan(PlanChoices(models="mlp"))


def estimate_cell_s(case: Case, settings: Settings) -> float:
    return estimate_s([case], settings)


def test_estimates_grow_with_the_work() -> None:
    settings = Settings(threads=1, max_time_s=2.0)
    small = estimate_cell_s(Case("mlp", "torch:eager"), settings)
    big = estimate_cell_s(Case("bert-base", "torch:eager", batch_size=8, seq_len=128), settings)
    compiled = estimate_cell_s(Case("mlp", "torch:compile"), settings)
    assert 0 < small < big and small < compiled
    hf2019 = estimate_cell_s(
        Case("bert-base", "torch:eager", batch_size=8, seq_len=128), Settings(threads=1, protocol="hf2019")
    )
    assert hf2019 > big  # 90 calls of ~1 s each, where adaptive stops at its 2 s budget
    assert [format_estimate(s) for s in (40, 600, 9000)] == ["~40 s", "~10 min", "~2.5 h"]
    with pytest.raises(SpecError):
        suite_plan(parse_suite("x", 'models = ["mlp"]\nruntimes = ["torch:nope"]\nbatch_sizes = [1]\n', "x"), 1)
