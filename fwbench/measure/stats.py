"""The adaptive timer's stopping rule: the distribution-free CI of the median of one process's samples (seconds per
call), from order statistics. The statistics fwbench stores and reports are over rounds:
:mod:`fwbench.measure.rounds`.

The interval is ``scipy.stats.quantile_test``'s (two-sided, p = 0.5), computed here with numpy alone from the exact
binomial distribution of the number of samples below the median: the stopping rule runs inside the timed window of
every worker, and importing ``scipy.stats`` costs a worker about 1.3 CPU-seconds at start-up. Which order statistics
bound the interval depends on the sample count and the confidence only, so each pair is computed once.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

CONFIDENCE = 0.95


def load() -> None:
    """Compute the order-statistic indices of the sample counts a timed window is likely to reach, so that none is
    first computed inside it (the worker calls this before its first timed call)."""
    for count in range(2, 64):
        median_ci_indices(count, CONFIDENCE)


@functools.lru_cache(maxsize=4096)
def median_ci_indices(count: int, confidence: float) -> tuple[int | None, int | None]:
    """(low, high) 0-based indices into ``count`` sorted samples of the two-sided distribution-free ``confidence``
    interval of the median, as ``scipy.stats.quantile_test(...).confidence_interval`` chooses them: ``low`` =
    B.ppf(α/2) − 1 and ``high`` = B.isf(α/2) for B ~ Binomial(count, ½), α = 1 − confidence; None where an end falls
    outside the samples (too few of them)."""
    tail = (1 - confidence) / 2
    k = np.arange(1, count + 1, dtype=np.float64)
    log_choose = np.concatenate(([0.0], np.cumsum(np.log((count - k + 1) / k))))  # log C(count, i), i = 0..count
    pmf = np.exp(log_choose - count * math.log(2.0))
    cdf = np.cumsum(pmf)
    ppf = int(np.searchsorted(cdf, tail * (1 - 1e-12), side="left"))  # smallest i with CDF(i) ≥ tail
    survival = np.append(cdf[::-1][1:], 0.0)  # P(X > i) = CDF(count − i − 1) by symmetry: no cancellation
    isf = int(np.argmax(survival <= tail * (1 + 1e-12)))  # smallest i with SF(i) ≤ tail (SF(count) = 0 is)
    low, high = ppf - 1, isf
    return (low if low >= 0 else None), (high if high < count else None)


def order_statistic_median_ci(samples: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Distribution-free CI of the median from order statistics (what ``scipy.stats.quantile_test`` gives).

    Exact coverage of at least ``confidence``, O(n) memory and well under a millisecond at 5000 samples: the
    adaptive timer's stopping rule uses it inside the timed window, where a bootstrap's resampling arrays would
    inflate the measured resident peak. None while too few samples.
    """
    data = np.asarray(samples, dtype=np.float64)
    if data.size < 2:
        return None
    low, high = median_ci_indices(int(data.size), confidence)
    if low is None or high is None:
        return None
    ordered = np.sort(data)
    return float(ordered[low]), float(ordered[high])


def relative_half_width(samples: Sequence[float]) -> float:
    """Order-statistic CI half-width of the median over the median; inf while it cannot be computed."""
    ci = order_statistic_median_ci(samples)
    median = float(np.median(samples)) if len(samples) else 0.0
    if ci is None or median <= 0:
        return math.inf
    return (ci[1] - ci[0]) / 2 / median
