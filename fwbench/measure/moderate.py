"""Moderated (empirical-Bayes) round-level variances: the cells of one run share what they say about noise.

A cell measured in R rounds has a round-level variance s² on d = R − 1 degrees of freedom; with R = 3 that s² is
itself so uncertain that its t interval needs the quantile t(2) = 4.30. The cells of a run measure on the same
machine in the same session, so their variances are alike in kind; limma (Smyth 2004, "Linear models and
empirical Bayes methods for assessing differential expression in microarray experiments") treats thousands of
genes with three replicates each this way:

- a prior for the true variances, scaled inverse-χ² with d₀ degrees of freedom around s₀², fitted to the cells'
  s² by the method of moments on log s² (``fitFDist``); s₀² follows the log of the per-call time (limma-trend):
  µs-scale calls are noisier than ms-scale ones;
- each cell's posterior variance s̃² = (d₀ s₀² + d s²) / (d₀ + d), used with d₀ + d degrees of freedom (capped
  at the run's pooled degrees of freedom, as limma does).

When the cells' variances differ more than their sampling noise explains, the fit gives a small d₀ and the
intervals stay close to each cell's own. Two guards keep a noisier cell from being narrowed towards quieter ones:
a runtime whose cells are together significantly above the trend (one-sided 5%) is moderated towards its own,
higher level (``VariancePrior.shifts``: only ever upwards), and a single cell whose own variance is implausibly
far above its prior (above the 90th percentile of the F(d, d₀) distribution it would follow) keeps its own
variance and degrees of freedom (a simplification of limma's ``robust`` option). Fewer than :data:`MIN_CELLS`
cells with a variance, or a fit that fails: no prior (each cell's own interval). ``tests/test_moderate.py``
checks coverage by simulation: heavy-tailed round effects, cells from µs to tens of ms, the trend holding, not
holding, one outlier cell, and one runtime two and three times noisier than the others.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

MIN_CELLS = 6  # fewer cells with a variance: no prior
MIN_CELLS_FOR_TREND = 10  # fewer: a prior without a trend in the per-call time
SHIFT_Z = 1.645  # one-sided 5%: a runtime's cells together this far above the trend get their own level
OUTLIER_QUANTILE = 0.9  # a cell whose s² / s₀² is above this quantile of F(d, d₀) keeps its own variance


@dataclass(frozen=True)
class Unit:
    """What one cell (or one pair of cells) says about noise: its variance ``variance`` (log scale, over round
    centres) on ``dof`` degrees of freedom, at covariate ``log_time`` (log seconds per call), and the runtimes it
    belongs to (a cell's one, a pair's two: :attr:`VariancePrior.shifts`)."""

    variance: float
    dof: float
    log_time: float
    runtimes: tuple[str, ...] = ()

    @property
    def usable(self) -> bool:
        """A variance on positive degrees of freedom at a finite time."""
        return self.dof > 0 and math.isfinite(self.variance) and self.variance >= 0 and math.isfinite(self.log_time)


@functools.lru_cache(maxsize=4096)
def _outlier_limit(dof: float, prior_dof: float) -> float:
    """The OUTLIER_QUANTILE of F(dof, prior_dof) (χ²(dof)/dof for an infinite prior_dof)."""
    from scipy import stats  # here, not at import: the store and the CLI import this module's types cheaply

    if math.isfinite(prior_dof):
        return float(stats.f.ppf(OUTLIER_QUANTILE, dof, prior_dof))
    return float(stats.chi2.ppf(OUTLIER_QUANTILE, dof)) / dof


@dataclass(frozen=True)
class VariancePrior:
    """The fitted prior: ``dof`` (d₀; math.inf when the variances are all alike within sampling noise),
    log s₀² = ``intercept`` + ``slope`` · log time (+ the largest of its runtimes' ``shifts``), the number of cells
    it was fitted on and their pooled degrees of freedom (the cap on any posterior's). ``shifts``: log-variance
    raises for the runtimes whose cells are, together, significantly noisier than the trend says (one-sided, 5%):
    a noisier runtime's cells are moderated towards its own level, never pulled below it."""

    dof: float
    intercept: float
    slope: float
    cells: int
    pooled_dof: float
    shifts: Mapping[str, float] = field(default_factory=dict)

    def variance_at(self, log_time: float, runtimes: Sequence[str] = ()) -> float:
        """s₀² at a per-call time of exp(``log_time``) seconds, for a unit of ``runtimes``."""
        shift = max((self.shifts.get(runtime, 0.0) for runtime in runtimes), default=0.0)
        return math.exp(self.intercept + self.slope * log_time + shift)

    def posterior(self, unit: Unit) -> tuple[float, float, bool]:
        """(moderated variance, its degrees of freedom, True) of ``unit``; its own (variance, dof, False) when it is
        an outlier against the prior or not usable."""
        if not unit.usable:
            return unit.variance, unit.dof, False
        prior_variance = self.variance_at(unit.log_time, unit.runtimes)
        if unit.variance > _outlier_limit(unit.dof, self.dof) * prior_variance:
            return unit.variance, unit.dof, False
        if not math.isfinite(self.dof):
            return prior_variance, self.pooled_dof, True
        variance = (self.dof * prior_variance + unit.dof * unit.variance) / (self.dof + unit.dof)
        return variance, min(self.dof + unit.dof, self.pooled_dof), True

    def to_dict(self) -> dict[str, Any]:
        """For JSON: d₀ as None when infinite."""
        return {
            "dof": self.dof if math.isfinite(self.dof) else None,
            "intercept": self.intercept,
            "slope": self.slope,
            "cells": self.cells,
            "pooled_dof": self.pooled_dof,
            "shifts": dict(self.shifts),
        }


@dataclass(frozen=True)
class RunPriors:
    """The priors of one run on one machine: of cell times and of paired log ratios (None: too few to fit)."""

    times: VariancePrior | None
    pairs: VariancePrior | None


def trigamma_inverse(value: float) -> float:
    """y with trigamma(y) = ``value`` (> 0): limma's Newton iteration."""
    from scipy import special

    if value > 1e7:
        return 1 / math.sqrt(value)
    if value < 1e-6:
        return 1 / value
    y = 0.5 + 1 / value
    for _ in range(50):
        tri = float(special.polygamma(1, y))
        step = tri * (1 - tri / value) / float(special.polygamma(2, y))
        y += step
        if -step / y < 1e-8:
            break
    return y


def _trend(times: FloatArray, values: FloatArray, trend: bool) -> tuple[float, float, FloatArray]:
    """(intercept, slope, residuals) of ``values`` against ``times``: a least-squares line, or their mean."""
    if trend:
        slope, intercept = (float(c) for c in np.polyfit(times, values, 1))
    else:
        slope, intercept = 0.0, float(np.mean(values))
    return intercept, slope, values - (intercept + slope * times)


def _runtime_shifts(units: Sequence[Unit], residuals: FloatArray, spread: float) -> dict[str, float]:
    """The runtimes whose units' mean residual (log variance above the trend) is significantly positive (one-sided
    z-test at 5% against the residuals' spread) and that mean, each."""
    members: dict[str, list[float]] = {}
    for unit, residual in zip(units, residuals):
        for runtime in unit.runtimes:
            members.setdefault(runtime, []).append(float(residual))
    shifts = {}
    for runtime, values in members.items():
        mean = float(np.mean(values))
        if mean > 0 and mean / math.sqrt(spread / len(values)) > SHIFT_Z:
            shifts[runtime] = mean
    return shifts


def fit_prior(units: Sequence[Unit]) -> VariancePrior | None:
    """The prior fitted to ``units`` (limma's fitFDist, with a linear trend of log s₀² in log time from
    :data:`MIN_CELLS_FOR_TREND` units on, and the significantly noisier runtimes' shifts); None below
    :data:`MIN_CELLS` usable units, or when the fit fails."""
    from scipy import special

    usable = [u for u in units if u.usable]
    if len(usable) < MIN_CELLS:
        return None
    variances = np.array([u.variance for u in usable])
    positive = variances[variances > 0]
    if positive.size == 0:
        return None
    variances = np.maximum(variances, 1e-5 * float(np.median(positive)))  # limma: zeros would be log(0)
    dofs = np.array([u.dof for u in usable])
    times = np.array([u.log_time for u in usable])
    adjusted = np.log(variances) - special.digamma(dofs / 2) + np.log(dofs / 2)
    trend = len(usable) >= MIN_CELLS_FOR_TREND and float(np.ptp(times)) > 0
    parameters = 2 if trend else 1
    try:
        intercept, slope, residuals = _trend(times, adjusted, trend)
        shifts = _runtime_shifts(usable, residuals, float(np.sum(residuals**2)) / (len(usable) - parameters))
        if shifts:  # refit the trend with the noisier runtimes' levels taken out
            raised = np.array([max((shifts.get(r, 0.0) for r in u.runtimes), default=0.0) for u in usable])
            intercept, slope, residuals = _trend(times, adjusted - raised, trend)
    except (np.linalg.LinAlgError, ValueError, FloatingPointError):
        return None
    spread = float(np.sum(residuals**2)) / (len(usable) - parameters) - float(np.mean(special.polygamma(1, dofs / 2)))
    pooled = float(np.sum(dofs))
    if spread > 0:
        prior_dof = 2 * trigamma_inverse(spread)
        intercept += float(special.digamma(prior_dof / 2)) - math.log(prior_dof / 2)
    else:
        prior_dof = math.inf
    if not all(math.isfinite(v) for v in (intercept, slope)):
        return None
    return VariancePrior(prior_dof, intercept, slope, len(usable), pooled, shifts)
