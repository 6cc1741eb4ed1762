"""Runtime-vs-baseline statistics (fwbench.speedups) against scipy on fixed, seeded samples."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from fwbench.measure.rounds import paired_log_ratios, paired_speedup, unpaired_ratio
from fwbench.spec import Case
from fwbench.speedups import (
    ALPHA,
    BOOTSTRAP_SEED,
    N_RESAMPLES,
    compare_cells,
    geometric_mean_ci,
    grouped_pairs,
    holm,
    pair_summaries,
    resolve_baseline,
    row_ratio,
)
from fwbench.store import ResultRecord, Store
from report_store import Cell, add_run, timed


def test_holm_against_a_hand_computed_example() -> None:
    # sorted: 0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 = 0.04 → running max 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.6]) == [1.0, 1.0] and holm([]) == [] and holm([0.2]) == [0.2]


def test_geometric_mean_and_its_bootstrap_over_cells() -> None:
    ratios = [2.0, 0.5, 1.5, 1.1, 0.9]
    centre, low, high = geometric_mean_ci(ratios)
    assert centre == pytest.approx(np.exp(np.mean(np.log(ratios))))
    expected = stats.bootstrap(
        (np.array(ratios),),
        stats.gmean,
        n_resamples=N_RESAMPLES,
        method="percentile",
        rng=np.random.default_rng(BOOTSTRAP_SEED),
    ).confidence_interval
    assert (low, high) == pytest.approx((expected.low, expected.high), rel=1e-12)
    assert geometric_mean_ci([]) == (None, None, None)
    assert geometric_mean_ci([3.0]) == (pytest.approx(3.0), None, None)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "db.sqlite") as opened:
        yield opened


def bert(runtime: str, batch: int, seq: int = 8) -> Case:
    return Case("bert-tiny", runtime, batch_size=batch, seq_len=seq)


def fixture_rows(store: Store) -> tuple[int, list[ResultRecord]]:
    """torch:eager against jax:jit: 2× faster, a tie, 1.5× slower, baseline oom, runtime error, and a cell only
    the baseline has; tensorflow:function skipped everywhere."""
    cells = [
        Cell(bert("torch:eager", 1), timed(2e-3, seed=1)),
        Cell(bert("jax:jit", 1), timed(1e-3, seed=2)),
        Cell(bert("torch:eager", 2), timed(4e-3, seed=3)),
        Cell(bert("jax:jit", 2), timed(4e-3, seed=4)),
        Cell(bert("torch:eager", 4), timed(8e-3, seed=5)),
        Cell(bert("jax:jit", 4), timed(12e-3, seed=6)),
        Cell(bert("torch:eager", 8), status="oom", reason="killed at 2 GiB"),
        Cell(bert("jax:jit", 8), timed(0.2, seed=7)),
        Cell(bert("torch:eager", 16), timed(0.5, seed=8)),
        Cell(bert("jax:jit", 16), status="error", reason="boom"),
        Cell(bert("torch:eager", 32), timed(1.0, seed=9)),
        *(Cell(bert("tensorflow:function", b), status="skipped", reason="not installed") for b in (1, 2, 4)),
    ]
    run = add_run(store, cells)
    return run, store.results([run])


def test_cells_match_by_shape_and_only_ok_cells_get_a_ratio(store: Store) -> None:
    _, rows = fixture_rows(store)
    cells = compare_cells(rows, "torch:eager", "jax:jit")
    assert [c.batch_size for c in cells] == [1, 2, 4, 8, 16]  # batch 32: only the baseline has it
    by_batch = {c.batch_size: c for c in cells}
    for batch in (1, 2, 4):
        base = next(r for r in rows if r.runtime == "torch:eager" and r.batch_size == batch)
        other = next(r for r in rows if r.runtime == "jax:jit" and r.batch_size == batch)
        estimate = row_ratio(base, other)
        assert estimate is not None and estimate.paired and (estimate.rounds, estimate.values) == (3, 30)
        expected = paired_speedup(paired_log_ratios(base.blocks, other.blocks))
        assert expected is not None and (estimate.ratio, estimate.ci_low, estimate.p_value) == (
            expected.value,
            expected.ci_low,
            expected.p_value,
        )
        assert (by_batch[batch].ratio, by_batch[batch].ci_low, by_batch[batch].p_value) == (
            estimate.ratio,
            estimate.ci_low,
            estimate.p_value,
        )
        assert (by_batch[batch].rounds, by_batch[batch].pairs) == (3, 30)
    assert by_batch[1].ratio == pytest.approx(2.0, rel=0.02) and by_batch[1].significant
    assert by_batch[4].ratio == pytest.approx(2 / 3, rel=0.02) and by_batch[4].significant
    low, high = by_batch[2].ci_low, by_batch[2].ci_high
    assert not by_batch[2].significant and low is not None and high is not None and low < 1 < high
    assert by_batch[8].ratio is None and by_batch[8].baseline_status == "oom" and not by_batch[8].comparable
    assert by_batch[16].ratio is None and by_batch[16].runtime_reason == "boom"
    # Holm over the three comparable cells, in their order
    raw = [p for p in (by_batch[b].p_value for b in (1, 2, 4)) if p is not None]
    assert len(raw) == 3 and [by_batch[b].p_adjusted for b in (1, 2, 4)] == pytest.approx(holm(raw))
    assert all(c.significant == (c.p_adjusted is not None and c.p_adjusted < ALPHA) for c in cells)


def test_pair_summary_is_a_geometric_mean_over_common_ok_cells_with_failure_counts(store: Store) -> None:
    _, rows = fixture_rows(store)
    summaries = {s.runtime: s for s in pair_summaries(rows, "torch:eager")}
    assert list(summaries) == ["jax:jit", "tensorflow:function"]
    jax = summaries["jax:jit"]
    ratios = [c.ratio for c in compare_cells(rows, "torch:eager", "jax:jit") if c.ratio is not None]
    assert jax.n_common == 3 and jax.geomean_ratio == pytest.approx(stats.gmean(ratios))
    assert (jax.ci_low, jax.ci_high) == pytest.approx(geometric_mean_ci(ratios)[1:])
    assert (jax.n_faster, jax.n_slower) == (1, 1)
    assert jax.failed_baseline == {"oom": 1} and jax.failed_runtime == {"error": 1}
    # the 2019 study's summary (total seconds over the cells both ran) says jax:jit is *slower* here;
    # the geometric mean of per-cell ratios weighs each cell alike and says it is faster
    both = [b for b in (1, 2, 4)]
    seconds = {
        rt: sum(np.median(r.samples) for r in rows if r.runtime == rt and r.batch_size in both)
        for rt in ("torch:eager", "jax:jit")
    }
    assert jax.geomean_ratio is not None and seconds["torch:eager"] / seconds["jax:jit"] < 1 < jax.geomean_ratio
    tf = summaries["tensorflow:function"]
    assert tf.n_common == 0 and tf.geomean_ratio is None and tf.ci_low is None
    assert tf.failed_runtime == {"skipped": 3} and tf.failed_baseline == {}


def test_correction_for_the_number_of_cells(store: Store) -> None:
    """Three cells each with a raw p ≈ 0.03: each alone would be 'significant', Holm over three says none is.
    Per round the baseline's blocks are the runtime's times exp(d) for d = 0.07, 0.10, 0.13: mean 0.1, SD 0.03,
    t = 0.1 / (0.03 / √3) = 5.8 on 2 degrees of freedom, p = 0.029."""
    a = np.arange(1.0, 11.0) * 1e-3
    other = list(np.concatenate([a, a, a]))
    base = list(np.concatenate([a * np.exp(d) for d in (0.07, 0.10, 0.13)]))
    cells = []
    for batch in (1, 2, 3):
        cells += [Cell(bert("torch:eager", batch), base), Cell(bert("jax:jit", batch), other)]
    add_run(store, cells)
    compared = compare_cells(store.results(), "torch:eager", "jax:jit")
    assert all(c.p_value == pytest.approx(0.0288, abs=1e-3) for c in compared)
    assert all(c.p_adjusted is not None and c.p_adjusted >= ALPHA and not c.significant for c in compared)
    (summary,) = pair_summaries(store.results(), "torch:eager")
    assert (summary.n_faster, summary.n_slower, summary.n_common) == (0, 0, 3)


def test_runs_are_never_mixed_and_groups_are_per_run(store: Store) -> None:
    add_run(store, [Cell(bert("torch:eager", 1), timed(2e-3, seed=1)), Cell(bert("jax:jit", 1), timed(1e-3, seed=2))])
    add_run(store, [Cell(bert("jax:jit", 1), timed(4e-3, seed=3))])  # no baseline in run 2
    rows = store.results()
    (cell,) = compare_cells(rows, "torch:eager", "jax:jit")
    assert cell.run_id == 1 and cell.ratio == pytest.approx(2.0, rel=0.02)
    (pair,) = grouped_pairs(rows, "torch:eager")
    assert pair.run_id == 1 and pair.summary.n_common == 1


def test_rows_from_two_runs_or_before_rounds_are_not_paired(store: Store) -> None:
    """Blocks pair only within one run's group: across runs the ratio is unpaired (both sides' round spreads);
    a row stored before rounds (one round, no blocks) gets a ratio but no CI and no significance."""
    add_run(store, [Cell(bert("torch:eager", 1), timed(2e-3, seed=1))])
    add_run(store, [Cell(bert("jax:jit", 1), timed(1e-3, seed=2))])
    add_run(
        store,
        [
            Cell(bert("torch:eager", 1), timed(2e-3, seed=3), rounds=0),
            Cell(bert("jax:jit", 1), timed(1e-3, seed=4), rounds=0),
        ],
    )
    one, two, legacy_base, legacy_other = store.results()
    across = row_ratio(one, two)
    expected = unpaired_ratio(one.round_samples, two.round_samples)
    assert across is not None and expected is not None and not across.paired
    assert (across.ratio, across.ci_low, across.p_value) == (expected.value, expected.ci_low, expected.p_value)
    assert across.ratio == pytest.approx(2.0, rel=0.02) and across.ci_low is not None
    assert across.p_value is not None and across.p_value < ALPHA
    assert legacy_base.blocks == () and legacy_base.round_count == 1
    (cell,) = compare_cells([legacy_base, legacy_other], "torch:eager", "jax:jit")
    assert cell.ratio == pytest.approx(2.0, rel=0.02)
    assert cell.ci_low is None and cell.p_value is None and not cell.significant and cell.rounds == 1


def test_paired_blocks_cancel_drift_that_unpaired_statistics_count(store: Store) -> None:
    """Both runtimes see the same slow drift (each cycle 3% slower than the last): paired per-cycle ratios
    are all exactly 2, so the paired CI is a point; the same times unpaired give a wide CI."""
    drift = np.exp(0.03 * np.arange(30))
    add_run(store, [Cell(bert("torch:eager", 1), list(2e-3 * drift)), Cell(bert("jax:jit", 1), list(1e-3 * drift))])
    base, other = store.results()
    paired = row_ratio(base, other)
    unpaired = unpaired_ratio(base.round_samples, other.round_samples)
    assert paired is not None and paired.paired and unpaired is not None
    assert (paired.ratio, paired.ci_low, paired.ci_high) == pytest.approx((2.0, 2.0, 2.0), rel=1e-12)
    assert unpaired.value == pytest.approx(2.0, rel=1e-12)
    assert unpaired.ci_low is not None and unpaired.ci_high is not None
    assert unpaired.ci_low < 1.6 and unpaired.ci_high > 2.5


def test_baseline_resolution(store: Store) -> None:
    add_run(store, [Cell(bert("jax:jit", 1), timed(1e-3)), Cell(bert("tensorflow:function", 1), timed(1e-3))])
    rows = store.results()
    assert resolve_baseline(rows, None) == "jax:jit"  # torch:eager absent: the first runtime
    assert resolve_baseline(rows, "tensorflow:function") == "tensorflow:function"
    with pytest.raises(ValueError, match="--baseline torch:eager is not in these results; runtimes there: jax:jit"):
        resolve_baseline(rows, "torch:eager")
    assert resolve_baseline([], None) is None and pair_summaries(rows, "torch:eager") == []
