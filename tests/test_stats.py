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
