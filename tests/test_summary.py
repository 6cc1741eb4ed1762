"""Runtime-vs-baseline statistics (fwbench.report.summary) against scipy on fixed, seeded samples."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from fwbench.report.summary import (
    ALPHA,
    BOOTSTRAP_SEED,
    N_RESAMPLES,
    compare_cells,
    geometric_mean_ci,
    grouped_pairs,
    holm,
    mann_whitney_p_many,
    pair_summaries,
    ratio_of_medians,
    ratio_of_medians_many,
    resolve_baseline,
)
from fwbench.spec import Case
from fwbench.store import Store
from report_store import Cell, add_run, timed

RNG = np.random.default_rng(2024)
A = RNG.lognormal(np.log(2e-3), 0.05, 40)
B = RNG.lognormal(np.log(1e-3), 0.05, 31)


def scipy_ratio_ci(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    interval = stats.bootstrap(
        (a, b),
        lambda x, y, axis=-1: np.median(x, axis=axis) / np.median(y, axis=axis),
        paired=False,
        vectorized=True,
        n_resamples=N_RESAMPLES,
        method="percentile",
        rng=np.random.default_rng(BOOTSTRAP_SEED),
    ).confidence_interval
    return float(interval.low), float(interval.high)


def test_ratio_of_medians_is_scipys_bootstrap_and_mann_whitney() -> None:
    estimate = ratio_of_medians(A, B)
    assert estimate.ratio == pytest.approx(np.median(A) / np.median(B), rel=1e-15)
    assert (estimate.ci_low, estimate.ci_high) == pytest.approx(scipy_ratio_ci(A, B), rel=1e-12)
    assert estimate.p_value == pytest.approx(stats.mannwhitneyu(A, B, alternative="two-sided").pvalue, rel=1e-12)
    assert estimate.ci_low < estimate.ratio < estimate.ci_high  # type: ignore[operator]
    assert ratio_of_medians(A, B) == estimate  # seeded: the same samples, the same interval


def test_a_cell_gets_the_same_numbers_alone_or_in_a_batch() -> None:
    """Cells are bootstrapped in batches of equal sample counts; a cell's result must not depend on its batch."""
    rng = np.random.default_rng(5)
    pairs = [
        (rng.lognormal(0, 0.1, na), rng.lognormal(0.1, 0.1, nb))
        for na, nb in [(30, 30), (30, 30), (30, 25), (5, 6), (1, 3), (30, 30)]
    ]
    batched = ratio_of_medians_many(pairs)
    assert batched == [ratio_of_medians(a, b) for a, b in pairs]
    assert batched[4].ci_low is None and batched[4].p_value is not None  # one sample: no interval
    assert ratio_of_medians([1.0, 1.0, 1.0], [1.0, 1.0]).p_value == 1.0  # no difference at all
    with pytest.raises(ValueError):
        ratio_of_medians([], [1.0])


def scipy_p(x: np.ndarray, y: np.ndarray) -> float:
    """scipy's two-sided Mann–Whitney U p-value of one cell alone (default method 'auto'); NaN → 1."""
    p = float(stats.mannwhitneyu(x, y, alternative="two-sided").pvalue)
    return 1.0 if np.isnan(p) else p


@pytest.mark.parametrize("seed", range(6))
def test_mann_whitney_p_values_are_scipys_cell_by_cell(seed: int) -> None:
    """Batched p-values equal scipy's for each cell alone, exactly: raw samples, samples with ties (rounded) and
    all-equal samples mixed in one batch, at sizes where scipy's 'auto' takes the exact test and where it takes
    the normal approximation."""
    rng = np.random.default_rng(seed)
    for n1, n2 in ((1, 1), (3, 7), (8, 30), (9, 9), (20, 45), (60, 2)):
        cells = []
        for _ in range(3):
            a, b = rng.lognormal(0, 0.05, n1), rng.lognormal(0.03, 0.05, n2)
            cells += [(a, b), (np.round(a, 2), np.round(b, 2)), (np.ones(n1), np.ones(n2))]
        expected = [scipy_p(x, y) for x, y in cells]
        num, den = np.stack([x for x, _ in cells]), np.stack([y for _, y in cells])
        assert mann_whitney_p_many(num, den).tolist() == expected
        assert [e.p_value for e in ratio_of_medians_many(cells, per_cell_ci=False)] == expected
        assert [ratio_of_medians(x, y).p_value for x, y in cells] == expected
        if min(n1, n2) <= 8:  # the exact path is taken cell by cell where a cell has no ties ...
            exact = [
                float(stats.mannwhitneyu(x, y, alternative="two-sided", method="exact").pvalue) for x, y in cells[::3]
            ]
            assert expected[::3] == exact
            # ... and is lost when scipy chooses once for a whole batch that has ties somewhere: why ties split batches
            naive = stats.mannwhitneyu(num, den, alternative="two-sided", axis=-1).pvalue
            assert n1 * n2 == 1 or naive[::3].tolist() != exact


def test_no_per_cell_ci_changes_nothing_else() -> None:
    rng = np.random.default_rng(11)
    pairs = [
        (rng.lognormal(0, 0.1, na), rng.lognormal(0.1, 0.1, nb))
        for na, nb in [(30, 30), (30, 30), (30, 25), (5, 6), (1, 3), (6, 5)]
    ]
    full, quick = ratio_of_medians_many(pairs), ratio_of_medians_many(pairs, per_cell_ci=False)
    assert [(e.ratio, e.p_value) for e in full] == [(e.ratio, e.p_value) for e in quick]
    assert all(e.ci_low is None and e.ci_high is None for e in quick)
    assert all(e.ci_low is not None for e in full[:4])


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


def fixture_rows(store: Store) -> tuple[int, list[dict[str, Any]]]:
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
        estimate = ratio_of_medians(base.samples, other.samples)
        assert (by_batch[batch].ratio, by_batch[batch].ci_low, by_batch[batch].p_value) == (
            estimate.ratio,
            estimate.ci_low,
            estimate.p_value,
        )
    assert by_batch[1].ratio == pytest.approx(2.0, rel=0.02) and by_batch[1].significant
    assert by_batch[4].ratio == pytest.approx(2 / 3, rel=0.02) and by_batch[4].significant
    assert not by_batch[2].significant and by_batch[2].ci_low < 1 < by_batch[2].ci_high  # type: ignore[operator]
    assert by_batch[8].ratio is None and by_batch[8].baseline_status == "oom" and not by_batch[8].comparable
    assert by_batch[16].ratio is None and by_batch[16].runtime_reason == "boom"
    # Holm over the three comparable cells, in their order
    raw = [by_batch[b].p_value for b in (1, 2, 4)]
    assert [by_batch[b].p_adjusted for b in (1, 2, 4)] == pytest.approx(holm(raw))  # type: ignore[arg-type]
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
    assert seconds["torch:eager"] / seconds["jax:jit"] < 1 < jax.geomean_ratio  # type: ignore[operator]
    tf = summaries["tensorflow:function"]
    assert tf.n_common == 0 and tf.geomean_ratio is None and tf.ci_low is None
    assert tf.failed_runtime == {"skipped": 3} and tf.failed_baseline == {}


def test_correction_for_the_number_of_cells(store: Store) -> None:
    """Three cells each with a raw p ≈ 0.03: each alone would be 'significant', Holm over three says none is."""
    a = np.arange(1.0, 11.0) * 1e-3
    cells = []
    for batch in (1, 2, 3):
        cells += [Cell(bert("torch:eager", batch), list(a + 3.5e-3)), Cell(bert("jax:jit", batch), list(a))]
    add_run(store, cells)
    compared = compare_cells(store.results(), "torch:eager", "jax:jit")
    assert all(c.p_value is not None and c.p_value < ALPHA for c in compared)
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


def test_grouped_pairs_without_per_cell_cis(store: Store) -> None:
    """per_cell_ci=False: ci_low/ci_high None, and the same ratios, p-values, significance and pair summaries
    (geometric-mean CI over cells included) as with them, and as compare_cells per pair."""
    _, rows = fixture_rows(store)
    full, quick = grouped_pairs(rows, "torch:eager"), grouped_pairs(rows, "torch:eager", per_cell_ci=False)
    assert [p.summary for p in full] == [p.summary for p in quick]
    assert full[0].summary.ci_low is not None
    for f, q in zip(full, quick):
        assert f.cells == compare_cells(rows, "torch:eager", f.summary.runtime)
        assert q.cells == compare_cells(rows, "torch:eager", q.summary.runtime, per_cell_ci=False)
        for x, y in zip(f.cells, q.cells):
            assert (x.ratio, x.p_value, x.p_adjusted, x.significant) == (
                y.ratio,
                y.p_value,
                y.p_adjusted,
                y.significant,
            )
            assert y.ci_low is None and y.ci_high is None


def test_baseline_resolution(store: Store) -> None:
    add_run(store, [Cell(bert("jax:jit", 1), timed(1e-3)), Cell(bert("tensorflow:function", 1), timed(1e-3))])
    rows = store.results()
    assert resolve_baseline(rows, None) == "jax:jit"  # torch:eager absent: the first runtime
    assert resolve_baseline(rows, "tensorflow:function") == "tensorflow:function"
    with pytest.raises(ValueError, match="--baseline torch:eager is not in these results; runtimes there: jax:jit"):
        resolve_baseline(rows, "torch:eager")
    assert resolve_baseline([], None) is None and pair_summaries(rows, "torch:eager") == []
