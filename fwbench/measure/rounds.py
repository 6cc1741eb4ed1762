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
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fwbench.measure.moderate import Unit, VariancePrior

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
    dof: float | None = None  # the CI's degrees of freedom: rounds − 1, more when the variance was moderated
    moderated: bool = False  # the CI's variance was moderated over the run (fwbench.measure.moderate)

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


def round_variance(centres: FloatArray) -> float:
    """The round-level variance of ``centres`` (ddof 1): what :mod:`fwbench.measure.moderate` pools."""
    return float(np.var(centres, ddof=1))


def _estimate(
    centres: FloatArray,
    values: int,
    *,
    p_value: bool,
    prior: VariancePrior | None = None,
    log_time: float | None = None,
    runtimes: tuple[str, ...] = (),
) -> Estimate:
    """The estimate exp(mean of ``centres``) (log scale) with its Student-t CI over rounds and, for a ratio,
    the two-sided p-value of "no difference" (log ratio 0). With a ``prior``, the round-level variance is its
    moderated value at ``log_time`` (log seconds per call; default: the centre itself)."""
    rounds = centres.size
    centre = float(np.mean(centres))
    if rounds < MIN_ROUNDS_FOR_CI:
        return Estimate(math.exp(centre), None, None, rounds, values)
    variance, dof, moderated = round_variance(centres), float(rounds - 1), False
    if prior is not None:
        at = centre if log_time is None else log_time
        variance, dof, moderated = prior.posterior(Unit(variance, dof, at, runtimes))
    standard_error = math.sqrt(variance / rounds)
    estimate = _from_spread(centre, standard_error, dof, rounds, values, p_value=p_value)
    return dataclasses.replace(estimate, moderated=moderated)


@functools.lru_cache(maxsize=4096)
def t_quantile(dof: float) -> float:
    """The two-sided CONFIDENCE quantile of Student's t on ``dof`` degrees of freedom (cached: a run's moderated
    cells share a few)."""
    from scipy import stats  # here, not at import: the store and the CLI read Block without paying for scipy.stats

    return float(stats.t.ppf(1 - (1 - CONFIDENCE) / 2, dof))


def _from_spread(
    centre: float, standard_error: float, dof: float, rounds: int, values: int, *, p_value: bool
) -> Estimate:
    from scipy import stats  # here, not at import: the store and the CLI read Block without paying for scipy.stats

    half = t_quantile(dof) * standard_error
    p: float | None = None
    if p_value:
        if standard_error > 0:
            p = float(2 * stats.t.sf(abs(centre) / standard_error, dof))
        else:
            p = 1.0 if centre == 0 else 0.0
    return Estimate(math.exp(centre), math.exp(centre - half), math.exp(centre + half), rounds, values, p, dof)


def time_estimate(
    rounds: Sequence[Sequence[float] | FloatArray], prior: VariancePrior | None = None, runtimes: tuple[str, ...] = ()
) -> Estimate | None:
    """A cell's time (seconds per call): geometric mean over rounds of each round's median, CI over rounds (its
    variance moderated by ``prior``, fitted over the run's cells: :func:`time_unit`); None without a positive
    time."""
    logs = _usable_logs(rounds, log=True)
    if not logs:
        return None
    estimate = _estimate(round_centres(logs), sum(r.size for r in logs), p_value=False, prior=prior, runtimes=runtimes)
    if len(logs) == 1:  # one round: its median exactly, not exp(log(median)) one rounding away
        (raw,) = _usable_logs(rounds, log=False)
        return dataclasses.replace(estimate, value=float(np.median(raw)))
    return estimate


def paired_speedup(
    log_ratio_rounds: Sequence[Sequence[float] | FloatArray],
    prior: VariancePrior | None = None,
    log_time: float | None = None,
    runtimes: tuple[str, ...] = (),
) -> Estimate | None:
    """Speed-up from paired blocks: each round's values are log(t_baseline / t_other) of the block pairs that
    ran back to back; the estimate is exp(mean over rounds of the round's median), with CI and p-value (the
    variance moderated by ``prior``, fitted over the run's pairs, at ``log_time``: the pair's log seconds per
    call, :func:`ratio_unit`)."""
    rounds = _usable_logs(log_ratio_rounds, log=False)
    if not rounds:
        return None
    if prior is not None and log_time is None:
        raise ValueError("a moderated speed-up needs the pair's log time")
    return _estimate(
        round_centres(rounds),
        sum(r.size for r in rounds),
        p_value=True,
        prior=prior,
        log_time=log_time,
        runtimes=runtimes,
    )


def time_unit(rounds: Sequence[Sequence[float] | FloatArray], runtimes: tuple[str, ...] = ()) -> Unit | None:
    """What a cell's rounds say about noise, for :func:`fwbench.measure.moderate.fit_prior`: the variance of its
    rounds' log medians at its log time, for its runtime; None below 2 rounds."""
    logs = _usable_logs(rounds, log=True)
    if len(logs) < 2:
        return None
    centres = round_centres(logs)
    return Unit(round_variance(centres), float(centres.size - 1), float(np.mean(centres)), runtimes)


def ratio_unit(
    log_ratio_rounds: Sequence[Sequence[float] | FloatArray], log_time: float, runtimes: tuple[str, ...] = ()
) -> Unit | None:
    """What a pair's rounds of paired log ratios say about noise, at the pair's ``log_time``, for its two
    runtimes; None below 2 rounds."""
    rounds = _usable_logs(log_ratio_rounds, log=False)
    if len(rounds) < 2:
        return None
    centres = round_centres(rounds)
    return Unit(round_variance(centres), float(centres.size - 1), log_time, runtimes)


def unpaired_ratio(
    numerator_rounds: Sequence[Sequence[float] | FloatArray],
    denominator_rounds: Sequence[Sequence[float] | FloatArray],
    priors: tuple[VariancePrior | None, VariancePrior | None] = (None, None),
    runtimes: tuple[str | None, str | None] = (None, None),
) -> Estimate | None:
    """time(numerator) / time(denominator) for cells not measured in pairs (two runs, other sub-groups,
    sequential mode): the ratio of the two time estimates, its CI from both sides' round-level spreads
    (each moderated by its run's prior in ``priors``, when given; Welch–Satterthwaite degrees of freedom); a CI
    only when both sides have :data:`MIN_ROUNDS_FOR_CI` rounds."""
    top, bottom = _usable_logs(numerator_rounds, log=True), _usable_logs(denominator_rounds, log=True)
    if not top or not bottom:
        return None
    top_centres, bottom_centres = round_centres(top), round_centres(bottom)
    centre = float(np.mean(top_centres) - np.mean(bottom_centres))
    rounds = min(top_centres.size, bottom_centres.size)
    values = min(sum(r.size for r in top), sum(r.size for r in bottom))
    if rounds < MIN_ROUNDS_FOR_CI:
        return Estimate(math.exp(centre), None, None, rounds, values)
    sides = []
    moderated = False
    for centres, prior, runtime in zip((top_centres, bottom_centres), priors, runtimes):
        side_variance, side_dof = round_variance(centres), float(centres.size - 1)
        if prior is not None:
            unit = Unit(side_variance, side_dof, float(np.mean(centres)), () if runtime is None else (runtime,))
            side_variance, side_dof, side_moderated = prior.posterior(unit)
            moderated = moderated or side_moderated
        sides.append((side_variance / centres.size, side_dof))
    variance = sum(v for v, _ in sides)
    if variance > 0:  # a posterior's degrees of freedom are finite: capped at its run's pooled ones
        dof = variance**2 / sum(v**2 / d for v, d in sides)
    else:
        dof = float(top_centres.size + bottom_centres.size - 2)
    estimate = _from_spread(centre, math.sqrt(variance), dof, rounds, values, p_value=True)
    return dataclasses.replace(estimate, moderated=moderated)
