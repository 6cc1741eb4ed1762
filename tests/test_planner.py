"""The grid planner and argument validation."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pytest

import fwbench.models as models
from fwbench.models.base import ModelDescription, ParamSpec
from fwbench.runner.planner import build_grids_plan, build_plan, parse_names, parse_positive_ints
from fwbench.spec import Case, Plan, Settings, SpecError
from fwbench.suites import Grid


class SequenceModel(ModelDescription):
    """A stand-in with a sequence axis and a maximum length of 512."""

    name = "seqmodel"
    arch: ClassVar[str] = "seqmodel"
    has_sequence = True
    max_seq_len = 512
    output_names = ("logits",)

    def param_schema(self) -> list[ParamSpec]:
        return [ParamSpec("w", (2,))]

    def canonical_weights(self, seed: int = 0) -> dict[str, np.ndarray]:
        return {"w": np.zeros(2, np.float32)}

    def make_inputs(self, batch_size: int, seq_len: int | None, seed: int = 0) -> dict[str, np.ndarray]:
        return {"x": np.zeros((batch_size, seq_len or 1), np.float32)}

    def forward_flops(self, batch_size: int, seq_len: int | None) -> int:
        return batch_size * (seq_len or 1)


@pytest.fixture
def seq_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(models.MODELS, "seqmodel", SequenceModel())


@pytest.mark.parametrize("text", ["0", "-3", "1,,2", "two", "1.5", "", "1,0", " "])
def test_bad_integer_lists_are_rejected(text: str) -> None:
    with pytest.raises(SpecError, match="--batch-sizes .*positive integer"):
        parse_positive_ints("--batch-sizes", text)


def test_integer_lists_parse() -> None:
    assert parse_positive_ints("--seq-lens", "8, 64,128") == [8, 64, 128]
    assert parse_names("--models", "mlp,mlp") == ["mlp", "mlp"]
    with pytest.raises(SpecError):
        parse_names("--models", "mlp,")


def test_mlp_ignores_seq_lens_one_cell_per_batch() -> None:
    plan = build_plan(["mlp"], ["torch:eager", "tensorflow:function"], [1, 2, 4, 2], [8, 64], Settings())
    assert [(c.runtime, c.batch_size, c.seq_len) for c in plan.cases] == [
        ("torch:eager", 1, None),
        ("torch:eager", 2, None),
        ("torch:eager", 4, None),
        ("tensorflow:function", 1, None),
        ("tensorflow:function", 2, None),
        ("tensorflow:function", 4, None),
    ]
    assert plan.skipped == ()


def test_cells_beyond_max_length_are_skipped_with_reason(seq_model: None) -> None:
    plan = build_plan(["seqmodel", "mlp"], ["torch:eager"], [1, 8], [128, 1024], Settings())
    assert {(c.model, c.batch_size, c.seq_len) for c in plan.cases} == {
        ("seqmodel", 1, 128),
        ("seqmodel", 8, 128),
        ("mlp", 1, None),
        ("mlp", 8, None),
    }
    assert [(s.case.batch_size, s.case.seq_len) for s in plan.skipped] == [(1, 1024), (8, 1024)]
    assert "exceeds seqmodel's maximum of 512" in plan.skipped[0].reason
    assert plan.size == 6


def test_plan_with_no_runnable_cell_is_an_error(seq_model: None) -> None:
    with pytest.raises(SpecError, match="no runnable cell: sequence length 1024 exceeds"):
        build_plan(["seqmodel"], ["torch:eager"], [1], [1024], Settings())


@pytest.mark.parametrize(
    ("models_", "runtimes", "message"),
    [
        (["nope"], ["torch:eager"], "unknown model 'nope'; allowed: mlp"),
        (["mlp"], ["torch:fast"], "unknown runtime 'torch:fast'; allowed: torch:eager"),
    ],
)
def test_unknown_names(models_: list[str], runtimes: list[str], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        build_plan(models_, runtimes, [1], [], Settings())


def test_plan_round_trips_through_json(seq_model: None) -> None:
    plan = build_plan(["seqmodel"], ["torch:eager"], [1], [8, 4096], Settings(threads=3), suite="x")
    again = Plan.from_json(plan.to_json())
    assert again == plan


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(batch_size=0),
        dict(batch_size=-1),
        dict(seq_len=0),
        dict(phase="predict"),
        dict(dtype="fp8"),
        dict(device="tpu"),
    ],
)
def test_case_validation(kwargs: dict[str, Any]) -> None:  # Any: values Case's types refuse, on purpose
    with pytest.raises(SpecError):
        Case("mlp", "torch:eager", **kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(threads=0),
        dict(warmup_calls=1),
        dict(max_time_s=0),
        dict(timeout_s=-1),
        dict(protocol="fast"),
        dict(memory_limit_bytes=0),
    ],
)
def test_settings_validation(kwargs: dict[str, Any]) -> None:  # Any: values Settings' types refuse, on purpose
    with pytest.raises(SpecError):
        Settings(**kwargs)


def test_hf2019_suite_is_the_2019_grid() -> None:
    from fwbench.suites import load_suite

    suite = load_suite("hf2019")
    (grid,) = suite.grids
    plan = build_plan(
        grid.models, grid.runtimes, grid.batch_sizes, grid.seq_lens, Settings(**suite.settings), suite=suite.name
    )
    assert plan.size == 3 * 4 * 4 * 6 and plan.settings.protocol == "hf2019"
    # BERT and DistilBERT stop at 512 positions: their 1024-token cells are N/A, as in 2019
    assert {(s.case.model, s.case.seq_len) for s in plan.skipped} == {("bert-base", 1024), ("distilbert-base", 1024)}
    assert len(plan.skipped) == 2 * 4 * 4


def test_each_grid_plans_with_its_own_phase_and_dtype() -> None:
    """A grid's own phase/dtype beat the plan-wide defaults; an impossible one names the grid it came from."""
    inference = Grid(["mlp"], ["torch:eager"], [2])
    training = Grid(["mlp"], ["torch:eager", "torch:script"], [2], phase="training", dtype="bf16")
    plan = build_grids_plan([inference, training], Settings(), dtype="fp32")
    assert [(c.runtime, c.phase, c.dtype) for c in plan.cases] == [
        ("torch:eager", "inference", "fp32"),
        ("torch:eager", "training", "bf16"),
    ]
    assert [(s.case.runtime, s.case.phase) for s in plan.skipped] == [("torch:script", "training")]
    fit = Grid(["mlp"], ["torch:eager"], [3], phase="fit", where="suite mine.toml [[grid]] 2")
    with pytest.raises(SpecError, match=r"^suite mine.toml \[\[grid\]\] 2: phase fit: batch size 3 does not divide"):
        build_grids_plan([inference, fit], Settings())
    with pytest.raises(SpecError, match="^phase fit with dtype 'bf16' cannot be run yet"):
        build_grids_plan([Grid(["mlp"], ["torch:eager"], [2], phase="fit", dtype="bf16")], Settings())


def test_models_without_seq_lens_run_text_models_at_the_default_length() -> None:
    from fwbench.runner.planner import DEFAULT_SEQ_LEN, PlanChoices, resolve_plan

    plan = resolve_plan(PlanChoices(models="mlp,bert-tiny", runtimes="torch:eager"))
    assert {(case.model, case.seq_len) for case in plan.cases} == {("mlp", None), ("bert-tiny", DEFAULT_SEQ_LEN)}
    given = resolve_plan(PlanChoices(models="bert-tiny", runtimes="torch:eager", seq_lens="8,16"))
    assert {case.seq_len for case in given.cases} == {8, 16}
