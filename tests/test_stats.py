"""Statistics against numpy and scipy on fixed, seeded data."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as scipy_stats

from fwbench.measure.stats import (
    BOOTSTRAP_SEED,
    N_RESAMPLES,
    median_ci,
    order_statistic_median_ci,
    relative_half_width,
    summarize,
)

SAMPLES = np.random.default_rng(42).lognormal(mean=-9.0, sigma=0.1, size=200)


def test_summary_matches_numpy() -> None:
    s = summarize(SAMPLES)
    assert s.n == 200
    assert s.median_s == pytest.approx(np.median(SAMPLES))
    assert s.mean_s == pytest.approx(np.mean(SAMPLES))
    assert s.stdev_s == pytest.approx(np.std(SAMPLES, ddof=1))
    assert s.min_s == SAMPLES.min() and s.max_s == SAMPLES.max()
    assert s.iqr_s == pytest.approx(scipy_stats.iqr(SAMPLES))


def test_median_ci_is_scipys_seeded_percentile_bootstrap() -> None:
    expected = scipy_stats.bootstrap(
        (SAMPLES,),
        np.median,
        confidence_level=0.95,
        n_resamples=N_RESAMPLES,
        method="percentile",
        rng=np.random.default_rng(BOOTSTRAP_SEED),
    ).confidence_interval
    assert median_ci(SAMPLES) == pytest.approx((expected.low, expected.high), rel=1e-12)
    assert median_ci(SAMPLES) == median_ci(SAMPLES.copy())  # deterministic


def test_median_ci_width_matches_large_sample_theory() -> None:
    """For normal data the median's standard error is sqrt(pi/2)·sigma/sqrt(n); averaged over 20 samples."""
    half_widths = []
    for seed in range(20):
        data = np.random.default_rng(seed).normal(10.0, 1.0, size=2000)
        low, high = median_ci(data)  # type: ignore[misc]
        assert low < np.median(data) < high
        half_widths.append((high - low) / 2)
    theory_half = 1.96 * np.sqrt(np.pi / 2) / np.sqrt(2000)
    assert np.mean(half_widths) == pytest.approx(theory_half, rel=0.1)


@pytest.mark.parametrize("interval", [median_ci, order_statistic_median_ci])
def test_median_ci_covers_the_true_median_95_percent_of_the_time(interval) -> None:  # type: ignore[no-untyped-def]
    covered = 0
    for seed in range(200):
        low, high = interval(np.random.default_rng(1000 + seed).normal(0.0, 1.0, size=101))
        covered += low <= 0.0 <= high
    assert 0.90 <= covered / 200 <= 0.995


def test_degenerate_samples() -> None:
    assert median_ci([1.0]) is None
    assert median_ci([2.0, 2.0, 2.0]) == (2.0, 2.0)
    assert summarize([3.0]).ci_low_s is None
    assert relative_half_width([1.0]) == float("inf")
    with pytest.raises(ValueError):
        summarize([])


def test_relative_half_width_uses_the_order_statistic_interval() -> None:
    median = np.median(SAMPLES)
    expected = scipy_stats.quantile_test(SAMPLES, q=median, p=0.5).confidence_interval(0.95)
    assert relative_half_width(SAMPLES) == pytest.approx((expected.high - expected.low) / 2 / median, rel=1e-12)
    # the stopping rule's interval and the stored bootstrap interval agree roughly
    assert relative_half_width(SAMPLES) == pytest.approx(summarize(SAMPLES).rel_ci_half_width, rel=0.4)
    assert order_statistic_median_ci(SAMPLES[:5]) is None
