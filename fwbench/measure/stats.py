"""Statistics over raw timing samples (seconds per call), computed with scipy.

The centre is the median; its 95% confidence interval is a seeded percentile bootstrap
(``scipy.stats.bootstrap``), so the same samples always give the same interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import numpy.typing as npt
from scipy import stats

CONFIDENCE = 0.95
N_RESAMPLES = 2000
BOOTSTRAP_SEED = 0


@dataclass(frozen=True)
class Summary:
    """Statistics of one cell's samples, all in seconds per call (CI bounds None below 2 samples)."""

    n: int
    median_s: float
    ci_low_s: float | None
    ci_high_s: float | None
    mean_s: float
    stdev_s: float | None
    min_s: float
    max_s: float
    iqr_s: float

    @property
    def rel_ci_half_width(self) -> float | None:
        """Half the CI width divided by the median (0.01 = ±1%)."""
        if self.ci_low_s is None or self.ci_high_s is None or self.median_s <= 0:
            return None
        return (self.ci_high_s - self.ci_low_s) / 2 / self.median_s

    def to_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


def median_ci(samples: npt.ArrayLike, confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Bootstrap ``confidence`` interval of the median, seeded; None for fewer than 2 samples."""
    data = np.asarray(samples, dtype=np.float64)
    if data.size < 2:
        return None
    if np.all(data == data[0]):
        return float(data[0]), float(data[0])
    result = stats.bootstrap(
        (data,),
        np.median,
        confidence_level=confidence,
        n_resamples=N_RESAMPLES,
        method="percentile",
        vectorized=True,
        rng=np.random.default_rng(BOOTSTRAP_SEED),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def summarize(samples: Sequence[float]) -> Summary:
    """The :class:`Summary` of at least one sample."""
    data = np.asarray(samples, dtype=np.float64)
    if data.size == 0:
        raise ValueError("cannot summarise zero samples")
    ci = median_ci(data)
    q1, q3 = np.percentile(data, [25, 75])
    return Summary(
        n=int(data.size),
        median_s=float(np.median(data)),
        ci_low_s=None if ci is None else ci[0],
        ci_high_s=None if ci is None else ci[1],
        mean_s=float(np.mean(data)),
        stdev_s=float(np.std(data, ddof=1)) if data.size > 1 else None,
        min_s=float(np.min(data)),
        max_s=float(np.max(data)),
        iqr_s=float(q3 - q1),
    )


def order_statistic_median_ci(samples: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Distribution-free CI of the median from order statistics (``scipy.stats.quantile_test``).

    Exact coverage of at least ``confidence``, O(n) memory and about a millisecond at 5000 samples:
    the adaptive timer's stopping rule uses it inside the timed window, where a bootstrap's
    resampling arrays would inflate the measured resident peak. None while too few samples.
    """
    data = np.asarray(samples, dtype=np.float64)
    if data.size < 2:
        return None
    interval = stats.quantile_test(data, q=float(np.median(data)), p=0.5).confidence_interval(confidence)
    low, high = float(interval.low), float(interval.high)
    return None if math.isnan(low) or math.isnan(high) else (low, high)


def relative_half_width(samples: Sequence[float]) -> float:
    """Order-statistic CI half-width of the median over the median; inf while it cannot be computed."""
    ci = order_statistic_median_ci(samples)
    median = float(np.median(samples)) if len(samples) else 0.0
    if ci is None or median <= 0:
        return math.inf
    return (ci[1] - ci[0]) / 2 / median
