"""Statistics over rounds of timed blocks, the unit fwbench's verdicts are built on.

A cell is measured in R *rounds* (fresh worker processes each) of timed *blocks* (seconds per call). Two
levels of variation matter: between blocks of one process, and between processes (and the machine's drift
from one round to the next), which is usually the larger and which a CI over one process's blocks misses.

- The centre of a round is the median of its values (log seconds per call, or per-pair log time ratios).
- The estimate is the mean of the round centres (for times: the geometric mean of the round medians).
- Its 95% CI treats the rounds as the independent units: centre ± t(R − 1) · s / √R, with s the standard
  deviation of the round centres (log scale). Each round centre carries that round's block-to-block noise, so
  the interval covers both levels. This is what a two-stage (hierarchical) bootstrap — rounds, then blocks
  within each — estimates, without its two small-sample faults: with R = 3 a percentile interval of its draws
  has 2/3 of the true variance and a normal quantile, and the inner resampling counts the block noise twice
  (``tests/test_rounds.py`` shows both and checks ≈95% coverage of this interval on a simulated two-level
  process). A CI (and so a significance verdict) is given only with at least :data:`MIN_ROUNDS_FOR_CI` rounds:
  fewer say nothing about the spread between processes.

A *paired* speed-up uses blocks of two runtimes that ran back to back in the same cycle of the same round
(interleaved measurement): the values are the per-pair log ratios, so the drift both saw cancels. An
*unpaired* ratio (two runs, or cells not measured together) combines the two sides' round-level spreads
(Welch's degrees of freedom).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

CONFIDENCE = 0.95
MIN_ROUNDS_FOR_CI = 3

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Block:
    """One timed block: ``calls`` calls in ``seconds`` (wall), in round ``round`` (from 0), its index in the
    cell's round, the interleaving cycle it ran in (None when not interleaved: it has no pair partner), and when
    it started (unix seconds; None where unknown)."""

    round: int
    index: int
    cycle: int | None
    start_unix_s: float | None
    calls: int
    seconds: float

    @property
    def per_call_s(self) -> float:
        return self.seconds / self.calls


def blocks_by_round(blocks: Sequence[Block]) -> list[list[float]]:
    """Seconds per call of ``blocks``, one list per round, rounds and blocks in order."""
    rounds: dict[int, list[tuple[int, float]]] = {}
    for block in blocks:
        rounds.setdefault(block.round, []).append((block.index, block.per_call_s))
    return [[value for _, value in sorted(rounds[r])] for r in sorted(rounds)]


def paired_log_ratios(numerator: Sequence[Block], denominator: Sequence[Block]) -> list[list[float]]:
    """log(numerator time / denominator time) per call of the blocks that ran in the same cycle (adjacent in
    time), one list per round; empty when the two never ran together."""
    partner = {(b.round, b.cycle): b for b in denominator if b.cycle is not None}
    rounds: dict[int, list[float]] = {}
    for block in numerator:
        other = partner.get((block.round, block.cycle)) if block.cycle is not None else None
        if other is not None and block.seconds > 0 and other.seconds > 0:
            rounds.setdefault(block.round, []).append(math.log(block.per_call_s / other.per_call_s))
    return [rounds[r] for r in sorted(rounds)]


@dataclass(frozen=True)
class Estimate:
    """A hierarchical estimate: ``value`` (seconds per call, or a ratio), its 95% CI (None below
    :data:`MIN_ROUNDS_FOR_CI` rounds), the rounds and values (blocks, or block pairs) behind it, and for a
    ratio the two-sided p-value of "no difference" (Student t over rounds; None without a CI)."""

    value: float
    ci_low: float | None
    ci_high: float | None
    rounds: int
    values: int
    p_value: float | None = None

    @property
    def rel_half_width(self) -> float | None:
        """Half the CI width over the estimate (0.01 = ±1%), None without a CI."""
        if self.ci_low is None or self.ci_high is None or self.value <= 0:
            return None
        return (self.ci_high - self.ci_low) / 2 / self.value


def _usable_logs(rounds: Sequence[Sequence[float] | FloatArray], *, log: bool) -> list[FloatArray]:
    """The non-empty rounds as float arrays, logged when ``log`` (rounds with a non-positive time dropped)."""
    arrays = [np.asarray(r, dtype=np.float64) for r in rounds if len(r) > 0]
    if log:
        arrays = [np.log(a) for a in arrays if np.all(a > 0)]
    return arrays


def round_centres(rounds: Sequence[FloatArray]) -> FloatArray:
    """The median of each round's values."""
    return np.array([np.median(r) for r in rounds], dtype=np.float64)


def _estimate(centres: FloatArray, values: int, *, p_value: bool) -> Estimate:
    """The estimate exp(mean of ``centres``) (log scale) with its Student-t CI over rounds and, for a ratio,
    the two-sided p-value of "no difference" (log ratio 0)."""
    rounds = centres.size
    centre = float(np.mean(centres))
    if rounds < MIN_ROUNDS_FOR_CI:
        return Estimate(math.exp(centre), None, None, rounds, values)
    standard_error = float(np.std(centres, ddof=1)) / math.sqrt(rounds)
    return _from_spread(centre, standard_error, rounds - 1, rounds, values, p_value=p_value)


def _from_spread(
    centre: float, standard_error: float, dof: float, rounds: int, values: int, *, p_value: bool
) -> Estimate:
    from scipy import stats  # here, not at import: the store and the CLI read Block without paying for scipy.stats

    half = float(stats.t.ppf(1 - (1 - CONFIDENCE) / 2, dof)) * standard_error
    p: float | None = None
    if p_value:
        if standard_error > 0:
            p = float(2 * stats.t.sf(abs(centre) / standard_error, dof))
        else:
            p = 1.0 if centre == 0 else 0.0
    return Estimate(math.exp(centre), math.exp(centre - half), math.exp(centre + half), rounds, values, p)


def time_estimate(rounds: Sequence[Sequence[float] | FloatArray]) -> Estimate | None:
    """A cell's time (seconds per call): geometric mean over rounds of each round's median, CI over rounds;
    None without a positive time."""
    logs = _usable_logs(rounds, log=True)
    if not logs:
        return None
    estimate = _estimate(round_centres(logs), sum(r.size for r in logs), p_value=False)
    if len(logs) == 1:  # one round: its median exactly, not exp(log(median)) one rounding away
        (raw,) = _usable_logs(rounds, log=False)
        return dataclasses.replace(estimate, value=float(np.median(raw)))
    return estimate


def paired_speedup(log_ratio_rounds: Sequence[Sequence[float] | FloatArray]) -> Estimate | None:
    """Speed-up from paired blocks: each round's values are log(t_baseline / t_other) of the block pairs that
    ran back to back; the estimate is exp(mean over rounds of the round's median), with CI and p-value."""
    rounds = _usable_logs(log_ratio_rounds, log=False)
    if not rounds:
        return None
    return _estimate(round_centres(rounds), sum(r.size for r in rounds), p_value=True)


def unpaired_ratio(
    numerator_rounds: Sequence[Sequence[float] | FloatArray], denominator_rounds: Sequence[Sequence[float] | FloatArray]
) -> Estimate | None:
    """time(numerator) / time(denominator) for cells not measured in pairs (two runs, other sub-groups,
    sequential mode): the ratio of the two time estimates, its CI from both sides' round-level spreads
    (Welch–Satterthwaite degrees of freedom); a CI only when both sides have :data:`MIN_ROUNDS_FOR_CI` rounds."""
    top, bottom = _usable_logs(numerator_rounds, log=True), _usable_logs(denominator_rounds, log=True)
    if not top or not bottom:
        return None
    top_centres, bottom_centres = round_centres(top), round_centres(bottom)
    centre = float(np.mean(top_centres) - np.mean(bottom_centres))
    rounds = min(top_centres.size, bottom_centres.size)
    values = min(sum(r.size for r in top), sum(r.size for r in bottom))
    if rounds < MIN_ROUNDS_FOR_CI:
        return Estimate(math.exp(centre), None, None, rounds, values)
    var_top = float(np.var(top_centres, ddof=1)) / top_centres.size
    var_bottom = float(np.var(bottom_centres, ddof=1)) / bottom_centres.size
    variance = var_top + var_bottom
    if variance > 0:
        dof = variance**2 / (var_top**2 / (top_centres.size - 1) + var_bottom**2 / (bottom_centres.size - 1))
    else:
        dof = float(top_centres.size + bottom_centres.size - 2)
    return _from_spread(centre, math.sqrt(variance), dof, rounds, values, p_value=True)
