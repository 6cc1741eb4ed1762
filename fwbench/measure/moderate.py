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
intervals stay close to each cell's own. A cell whose own variance is implausibly far above the prior (above the
90th percentile of the F(d, d₀) distribution it would follow) keeps its own variance and degrees of freedom, so
an outlier is not narrowed (a simplification of limma's ``robust`` option). Fewer than :data:`MIN_CELLS` cells
with a variance: no prior (each cell's own interval). ``tests/test_moderate.py`` checks coverage by simulation:
heavy-tailed round effects, cells from µs to tens of ms, the trend holding, not holding, and one outlier.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MIN_CELLS = 6  # fewer cells with a variance: no prior
MIN_CELLS_FOR_TREND = 10  # fewer: a prior without a trend in the per-call time
OUTLIER_QUANTILE = 0.9  # a cell whose s² / s₀² is above this quantile of F(d, d₀) keeps its own variance


@dataclass(frozen=True)
class Unit:
    """What one cell (or one pair of cells) says about noise: its variance ``variance`` (log scale, over round
    centres) on ``dof`` degrees of freedom, at covariate ``log_time`` (log seconds per call)."""

    variance: float
    dof: float
    log_time: float


@dataclass(frozen=True)
class VariancePrior:
    """The fitted prior: ``dof`` (d₀; math.inf when the variances are all alike within sampling noise),
    log s₀² = ``intercept`` + ``slope`` · log time, the number of cells it was fitted on and their pooled
    degrees of freedom (the cap on any posterior's)."""

    dof: float
    intercept: float
    slope: float
    cells: int
    pooled_dof: float

    def variance_at(self, log_time: float) -> float:
        """s₀² at a per-call time of exp(``log_time``) seconds."""
        return math.exp(self.intercept + self.slope * log_time)

    def posterior(self, unit: Unit) -> tuple[float, float]:
        """(moderated variance, its degrees of freedom) of ``unit``; its own (variance, dof) when it is an
        outlier against the prior."""
        from scipy import stats  # here, not at import: the store and the CLI import this module's types cheaply

        prior_variance = self.variance_at(unit.log_time)
        if unit.dof <= 0:
            return prior_variance, min(self.dof, self.pooled_dof)
        if math.isfinite(self.dof):
            limit = float(stats.f.ppf(OUTLIER_QUANTILE, unit.dof, self.dof))
        else:
            limit = float(stats.chi2.ppf(OUTLIER_QUANTILE, unit.dof)) / unit.dof
        if unit.variance > limit * prior_variance:
            return unit.variance, unit.dof
        if not math.isfinite(self.dof):
            return prior_variance, self.pooled_dof
        variance = (self.dof * prior_variance + unit.dof * unit.variance) / (self.dof + unit.dof)
        return variance, min(self.dof + unit.dof, self.pooled_dof)

    def to_dict(self) -> dict[str, float | int | None]:
        """For JSON: d₀ as None when infinite."""
        return {
            "dof": self.dof if math.isfinite(self.dof) else None,
            "intercept": self.intercept,
            "slope": self.slope,
            "cells": self.cells,
            "pooled_dof": self.pooled_dof,
        }


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


def fit_prior(units: Sequence[Unit]) -> VariancePrior | None:
    """The prior fitted to ``units`` with a positive dof (limma's fitFDist, with a linear trend of log s₀² in
    log time from :data:`MIN_CELLS_FOR_TREND` units on); None below :data:`MIN_CELLS` units."""
    from scipy import special

    usable = [u for u in units if u.dof > 0 and math.isfinite(u.variance) and u.variance >= 0]
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
    if trend:
        slope, intercept = (float(c) for c in np.polyfit(times, adjusted, 1))
        residuals = adjusted - (intercept + slope * times)
        spread = float(np.sum(residuals**2)) / (len(usable) - 2)
    else:
        slope, intercept = 0.0, float(np.mean(adjusted))
        spread = float(np.var(adjusted, ddof=1))
    spread -= float(np.mean(special.polygamma(1, dofs / 2)))
    pooled = float(np.sum(dofs))
    if spread > 0:
        prior_dof = 2 * trigamma_inverse(spread)
        intercept += float(special.digamma(prior_dof / 2)) - math.log(prior_dof / 2)
    else:
        prior_dof = math.inf
    return VariancePrior(prior_dof, intercept, slope, len(usable), pooled)
