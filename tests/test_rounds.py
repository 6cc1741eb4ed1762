"""Round-level statistics (fwbench.measure.rounds) on constructed data and on a simulated two-level process."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from fwbench.measure.rounds import (
    MIN_ROUNDS_FOR_CI,
    Block,
    blocks_by_round,
    paired_log_ratios,
    paired_speedup,
    time_estimate,
    unpaired_ratio,
)

TRUE_LOG_RATIO = 0.1


def simulate(
    rng: np.random.Generator, rounds: int, between: float, within: float, blocks: int = 15
) -> list[np.ndarray]:
    """Per-pair log ratios of ``rounds`` rounds: the true log ratio, a shift per round (SD ``between``: the
    worker processes and the machine's drift) and per-block noise (SD ``within``)."""
    return [TRUE_LOG_RATIO + rng.normal(0, between) + rng.normal(0, within, blocks) for _ in range(rounds)]


def naive_hierarchical_percentile(
    rounds: list[np.ndarray], rng: np.random.Generator, resamples: int = 1000
) -> tuple[float, float]:
    """The textbook two-stage percentile bootstrap (rounds, then blocks within each drawn round; median per
    round, mean over rounds): what the module's docstring says it does not use, and why. Every resample at once
    (rounds of equal size, as :func:`simulate` makes them): resample k draws rounds ``chosen[k]``, and from each
    drawn round j its blocks ``picks[k, j]``."""
    data = np.stack(rounds)  # (rounds, blocks)
    count, blocks = data.shape
    chosen = rng.integers(0, count, (resamples, count))
    picks = rng.integers(0, blocks, (resamples, count, blocks))
    draws = np.median(data[chosen[..., None], picks], axis=2).mean(axis=1)
    low, high = np.quantile(draws, [0.025, 0.975])
    return float(low), float(high)


@pytest.mark.parametrize(
    ("rounds", "between", "within"), [(3, 0.02, 0.01), (3, 0.0, 0.02), (5, 0.01, 0.03), (8, 0.02, 0.02)]
)
def test_the_ci_covers_the_true_ratio_95_percent_of_the_time(rounds: int, between: float, within: float) -> None:
    """Over 600 seeded simulations of a two-level process with known variances the 95% CI of the paired
    speed-up covers the true ratio 93–97.5% of the time (binomial SD at 95%: 0.9%), whichever level dominates."""
    rng = np.random.default_rng(rounds * 1000 + int(between * 1e4))
    trials = 600
    covered = 0
    for _ in range(trials):
        estimate = paired_speedup(simulate(rng, rounds, between, within))
        assert estimate is not None and estimate.ci_low is not None and estimate.ci_high is not None
        covered += estimate.ci_low <= math.exp(TRUE_LOG_RATIO) <= estimate.ci_high
    assert 0.93 <= covered / trials <= 0.975, covered / trials


def test_the_naive_hierarchical_bootstrap_is_too_narrow_with_three_rounds() -> None:
    """Why the interval is studentized: the percentile interval of a two-stage bootstrap covers far less than
    95% when the rounds differ and there are three of them."""
    rng = np.random.default_rng(3)
    trials = 150
    covered = 0
    for _ in range(trials):
        rounds = simulate(rng, 3, 0.02, 0.01)
        low, high = naive_hierarchical_percentile(rounds, rng, 400)
        covered += low <= TRUE_LOG_RATIO <= high
    assert covered / trials < 0.85, covered / trials


def test_estimates_on_constructed_rounds() -> None:
    # time: geometric mean of the round medians; below MIN_ROUNDS_FOR_CI rounds no CI
    two = time_estimate([[1.0, 2.0, 3.0], [4.0, 4.0, 4.0]])
    assert two is not None and two.value == pytest.approx(math.sqrt(2.0 * 4.0)) and two.ci_low is None
    assert two.rounds == 2 and two.values == 6 and MIN_ROUNDS_FOR_CI == 3
    one = time_estimate([[0.001, 0.003, 0.002]])
    assert one is not None and one.value == 0.002  # exactly the median: no log/exp rounding
    three = time_estimate([[1.0], [2.0], [4.0]])
    logs = np.log([1.0, 2.0, 4.0])
    half = stats.t.ppf(0.975, 2) * np.std(logs, ddof=1) / math.sqrt(3)
    assert three is not None and three.value == pytest.approx(2.0)
    assert (three.ci_low, three.ci_high) == pytest.approx((2.0 * math.exp(-half), 2.0 * math.exp(half)))
    assert time_estimate([]) is None and time_estimate([[0.0, 1.0]]) is None
    # paired: identical log ratios in every round: a zero-width CI and p = 0
    exact = paired_speedup([[0.5, 0.5], [0.5], [0.5, 0.5, 0.5]])
    assert exact is not None and exact.value == pytest.approx(math.exp(0.5)) and exact.p_value == 0.0
    assert exact.ci_low == pytest.approx(exact.ci_high)
    null = paired_speedup([[0.01], [-0.01], [0.0]])
    assert null is not None and null.p_value == pytest.approx(1.0)
    # unpaired: Welch's t on the round centres of both sides
    a, b = [[2.0], [2.2], [1.8]], [[1.0], [1.1], [0.9], [1.0]]
    ratio = unpaired_ratio(a, b)
    la, lb = np.log([2.0, 2.2, 1.8]), np.log([1.0, 1.1, 0.9, 1.0])
    welch = stats.ttest_ind(la, lb, equal_var=False)
    assert ratio is not None and ratio.value == pytest.approx(math.exp(la.mean() - lb.mean()))
    assert ratio.p_value == pytest.approx(welch.pvalue, rel=1e-9) and ratio.rounds == 3


def test_blocks_pair_by_round_and_cycle_only() -> None:
    base = [
        Block(0, 0, 10, None, 2, 4.0),
        Block(0, 1, 11, None, 2, 4.4),
        Block(1, 0, 20, None, 1, 2.0),
        Block(1, 1, None, None, 1, 2.0),
    ]
    other = [Block(0, 0, 10, None, 4, 4.0), Block(0, 1, 12, None, 4, 4.0), Block(1, 0, 20, None, 2, 2.0)]
    ratios = paired_log_ratios(base, other)
    assert ratios == [[pytest.approx(math.log(2.0))], [pytest.approx(math.log(2.0))]]  # cycle 11/12 and None unpaired
    assert blocks_by_round(base) == [[2.0, 2.2], [2.0, 2.0]]
