"""The adaptive timer's stopping rule (fwbench.measure.stats) against scipy on fixed, seeded data."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as scipy_stats

from fwbench.measure.stats import order_statistic_median_ci, relative_half_width

SAMPLES = np.random.default_rng(42).lognormal(mean=-9.0, sigma=0.1, size=200)


def test_order_statistic_ci_covers_the_true_median_95_percent_of_the_time() -> None:
    covered = 0
    for seed in range(200):
        interval = order_statistic_median_ci(np.random.default_rng(1000 + seed).normal(0.0, 1.0, size=101).tolist())
        assert interval is not None
        covered += interval[0] <= 0.0 <= interval[1]
    assert 0.90 <= covered / 200 <= 0.995


def test_degenerate_samples() -> None:
    assert relative_half_width([1.0]) == float("inf")
    assert order_statistic_median_ci([1.0]) is None


def test_relative_half_width_uses_the_order_statistic_interval() -> None:
    median = np.median(SAMPLES)
    expected = scipy_stats.quantile_test(SAMPLES, q=median, p=0.5).confidence_interval(0.95)
    assert relative_half_width(SAMPLES.tolist()) == pytest.approx(
        (expected.high - expected.low) / 2 / median, rel=1e-12
    )
    assert order_statistic_median_ci(SAMPLES[:5].tolist()) is None


@pytest.mark.parametrize("confidence", [0.5, 0.9, 0.95, 0.99])
def test_the_order_statistics_are_scipys_for_every_sample_count(confidence: float) -> None:
    """The interval's ends are the order statistics scipy.stats.quantile_test picks (binomial ppf and isf), computed
    without scipy (the worker does not import scipy.stats), for every count a timed window reaches and a few more."""
    from fwbench.measure.stats import median_ci_indices

    for count in [*range(2, 700), 1000, 1001, 2048, 4999, 5000, 20011]:
        binomial = scipy_stats.binom(count, 0.5)
        tail = (1 - confidence) / 2
        low, high = int(binomial.ppf(tail)) - 1, int(binomial.isf(tail))
        assert median_ci_indices(count, confidence) == (low if low >= 0 else None, high if high < count else None)


@pytest.mark.parametrize("count", [6, 9, 20, 64, 101, 777, 3001])
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_the_interval_is_quantile_tests_own(count: int, confidence: float) -> None:
    """scipy.stats.quantile_test's interval itself (not re-derived) on shuffled seeded samples."""
    samples = np.random.default_rng(count).lognormal(mean=-9.0, sigma=0.2, size=count)
    expected = scipy_stats.quantile_test(samples, q=float(np.median(samples)), p=0.5).confidence_interval(confidence)
    interval = order_statistic_median_ci(samples.tolist(), confidence)
    if np.isnan(expected.low) or np.isnan(expected.high):
        assert interval is None
    else:
        assert interval == (float(expected.low), float(expected.high))
