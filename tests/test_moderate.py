"""Moderated round-level variances (fwbench.measure.moderate): the prior fit recovers known parameters, the
posterior is limma's, and over seeded simulated runs the moderated 95% CI covers ≈95% when the variances follow
a trend in the per-call time, stays honest (and moderates less) when they do not, and never narrows an outlier."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from fwbench.measure.moderate import MIN_CELLS, Unit, VariancePrior, fit_prior, trigamma_inverse
from fwbench.measure.rounds import time_estimate, time_unit

RUNS = 150  # simulated runs per scenario
CELLS = 20  # cells per run, as in the quick suite
ROUNDS = 3
BLOCKS = 10


def test_trigamma_inverse_inverts_trigamma() -> None:
    from scipy import special

    for y in (0.05, 0.7, 3.0, 40.0):
        assert trigamma_inverse(float(special.polygamma(1, y))) == pytest.approx(y, rel=1e-6)


def test_the_fit_recovers_the_prior_of_simulated_variances() -> None:
    """2000 cells with 2 degrees of freedom each, true variances scaled-inverse-χ² (d₀ = 10, s₀² = 1e-3): the
    fitted d₀ and s₀² are close to the truth; variances all alike give an infinite (or very large) d₀."""
    rng = np.random.default_rng(0)
    true_variances = 1e-3 * 10 / rng.chisquare(10, 2000)
    units = [Unit(float(v * rng.chisquare(2) / 2), 2.0, -7.0) for v in true_variances]
    prior = fit_prior(units)
    assert prior is not None and 7 <= prior.dof <= 14 and prior.slope == 0.0, prior
    assert prior.variance_at(-7.0) == pytest.approx(1e-3, rel=0.1)
    alike = fit_prior([Unit(float(1e-3 * rng.chisquare(2) / 2), 2.0, -7.0) for _ in range(2000)])
    assert alike is not None and alike.dof > 50


def test_the_trend_follows_the_per_call_time() -> None:
    """Noisier µs cells than ms cells: the fitted s₀² decreases with the per-call time as simulated."""
    rng = np.random.default_rng(1)
    times = rng.uniform(math.log(1e-6), math.log(1e-2), 400)
    units = [Unit(float((0.05 * math.exp(-0.2 * (t + 7))) ** 2 * rng.chisquare(2) / 2), 2.0, float(t)) for t in times]
    prior = fit_prior(units)
    assert prior is not None and prior.slope == pytest.approx(-0.4, abs=0.08)  # log s² = 2 log sd


def test_posterior_and_fallbacks() -> None:
    prior = VariancePrior(dof=4.0, intercept=math.log(0.01), slope=0.0, cells=20, pooled_dof=40.0)
    variance, dof, moderated = prior.posterior(Unit(0.02, 2.0, 0.0))
    assert variance == pytest.approx((4 * 0.01 + 2 * 0.02) / 6) and dof == 6.0 and moderated
    assert prior.posterior(Unit(5.0, 2.0, 0.0)) == (5.0, 2.0, False)  # an outlier keeps its own
    assert VariancePrior(math.inf, math.log(0.01), 0.0, 20, 40.0).posterior(Unit(0.02, 2.0, 0.0)) == (
        pytest.approx(0.01),
        40.0,
        True,
    )
    shifted = VariancePrior(4.0, math.log(0.01), 0.0, 20, 40.0, {"noisy": math.log(3.0)})
    assert shifted.variance_at(0.0, ("quiet", "noisy")) == pytest.approx(0.03)  # a pair: its noisier runtime's level
    assert shifted.posterior(Unit(math.inf, 2.0, 0.0))[2] is False  # not usable: its own, unmoderated
    odd = [Unit(0.01 * (i + 1), 2.0, float(i)) for i in range(12)] + [
        Unit(0.01, 2.0, math.inf),
        Unit(math.nan, 2.0, 0.0),
    ]
    assert fit_prior(odd) is not None and fit_prior(odd).cells == 12  # type: ignore[union-attr]
    assert fit_prior([Unit(0.01, 2.0, 0.0)] * (MIN_CELLS - 1)) is None  # too few cells: each cell's own interval
    zeros = fit_prior([Unit(0.0, 2.0, 0.0)] * 3 + [Unit(0.01 * (i + 1), 2.0, 0.0) for i in range(5)])
    assert zeros is not None and math.isfinite(zeros.intercept)  # a zero variance (identical rounds) is not log(0)


def _simulate(rng: np.random.Generator, spreads: Callable[[np.ndarray], np.ndarray]) -> tuple[np.ndarray, list]:
    """One run: CELLS cells from 2 µs to 20 ms per call, ROUNDS rounds of BLOCKS blocks; each round shifted by a
    heavy-tailed (Student t, 4 df) effect of SD ``spreads(log times)``, each block by 1% noise."""
    log_times = rng.uniform(math.log(2e-6), math.log(2e-2), CELLS)
    sds = spreads(log_times)
    cells = [
        [np.exp(t + rng.standard_t(4) / math.sqrt(2) * sd + rng.normal(0, 0.01, BLOCKS)) for _ in range(ROUNDS)]
        for t, sd in zip(log_times, sds)
    ]
    return log_times, cells


def _trend(log_times: np.ndarray) -> np.ndarray:
    """3% at 1 ms, noisier for shorter calls."""
    return 0.03 * np.exp(-0.1 * (log_times - math.log(1e-3)))


def _scenario(seed: int, spreads: Callable[[np.ndarray], np.ndarray]) -> dict[str, float]:
    """Coverage of the true time and median relative half-width, moderated and per cell, over RUNS runs; the
    coverage of cell 0 alone; the median fitted d₀."""
    rng = np.random.default_rng(seed)
    covered = {"moderated": 0, "own": 0, "cell0": 0}
    widths: dict[str, list[float]] = {"moderated": [], "own": []}
    prior_dofs = []
    for _ in range(RUNS):
        log_times, cells = _simulate(rng, spreads)
        prior = fit_prior([unit for cell in cells if (unit := time_unit(cell)) is not None])
        assert prior is not None
        prior_dofs.append(prior.dof)
        for index, (log_time, cell) in enumerate(zip(log_times, cells)):
            for name, estimate in (("moderated", time_estimate(cell, prior)), ("own", time_estimate(cell))):
                assert estimate is not None and estimate.ci_low is not None and estimate.ci_high is not None
                hit = estimate.ci_low <= math.exp(log_time) <= estimate.ci_high
                covered[name] += hit
                covered["cell0"] += hit and name == "moderated" and index == 0
                widths[name].append((estimate.ci_high - estimate.ci_low) / 2 / estimate.value)
    return {
        "moderated": covered["moderated"] / (RUNS * CELLS),
        "own": covered["own"] / (RUNS * CELLS),
        "cell0": covered["cell0"] / RUNS,
        "width_moderated": float(np.median(widths["moderated"])),
        "width_own": float(np.median(widths["own"])),
        "prior_dof": float(np.median(prior_dofs)),
    }


def test_moderated_intervals_cover_and_are_narrower_when_the_trend_holds() -> None:
    """True variances scaled-inverse-χ² (12 df) around the trend: ≈95% coverage (binomial SD over 3000
    intervals: 0.4%), and a median half-width well below the per-cell interval's (t(2) = 4.30)."""
    rng = np.random.default_rng(2)

    def spreads(log_times: np.ndarray) -> np.ndarray:
        return _trend(log_times) * np.sqrt(12 / rng.chisquare(12, log_times.size))

    result = _scenario(3, spreads)
    assert 0.935 <= result["moderated"] <= 0.975 and 0.935 <= result["own"] <= 0.975, result
    assert result["width_moderated"] < 0.75 * result["width_own"], result


def test_when_the_trend_does_not_hold_it_moderates_less_and_stays_honest() -> None:
    """Spreads scattered ×/÷ e around the trend (log-normal, SD 1): the fitted d₀ is small, the intervals are
    closer to each cell's own than when the trend holds (wider, not narrower), and still cover ≈95%."""
    rng = np.random.default_rng(4)

    def scattered(log_times: np.ndarray) -> np.ndarray:
        return _trend(log_times) * np.exp(rng.normal(0, 1.0, log_times.size))

    def regular(log_times: np.ndarray) -> np.ndarray:
        return _trend(log_times) * np.sqrt(12 / rng.chisquare(12, log_times.size))

    result, holding = _scenario(5, scattered), _scenario(5, regular)
    assert result["prior_dof"] < holding["prior_dof"] and result["prior_dof"] < 3, (result, holding)
    assert result["width_moderated"] / result["width_own"] > holding["width_moderated"] / holding["width_own"]
    assert result["moderated"] >= 0.935, result


def test_an_outlier_cell_keeps_its_own_interval() -> None:
    """One cell ten times noisier than the trend says: its own coverage stays near 95% (150 runs: SD 1.8%)."""

    def outlier(log_times: np.ndarray) -> np.ndarray:
        spreads = _trend(log_times)
        spreads[0] *= 10
        return spreads

    result = _scenario(6, outlier)
    assert result["cell0"] >= 0.9 and result["moderated"] >= 0.935, result


@pytest.mark.parametrize("factor", [2.0, 3.0])
def test_a_steadily_noisier_runtime_is_moderated_towards_its_own_level(factor: float) -> None:
    """Four runtimes of ten cells each, one of them ``factor`` times noisier throughout: its cells together are
    significantly above the trend, so they are moderated towards their own level (a shift), and their CIs still
    cover ≈95% (without the shift: 87–88%); the others' coverage is untouched."""
    rng = np.random.default_rng(int(factor * 10))
    covered = {"noisy": 0, "others": 0}
    shifted = 0
    runs = 100
    for _ in range(runs):
        cells = []
        for runtime in range(4):
            for _ in range(10):
                log_time = rng.uniform(math.log(2e-6), math.log(2e-2))
                sd = float(_trend(np.array([log_time]))[0]) * (factor if runtime == 0 else 1.0)
                rounds = [
                    np.exp(log_time + rng.standard_t(4) / math.sqrt(2) * sd + rng.normal(0, 0.01, BLOCKS))
                    for _ in range(ROUNDS)
                ]
                cells.append((f"runtime{runtime}", log_time, rounds))
        prior = fit_prior([unit for name, _, cell in cells if (unit := time_unit(cell, (name,))) is not None])
        assert prior is not None
        shifted += "runtime0" in prior.shifts
        for name, log_time, cell in cells:
            estimate = time_estimate(cell, prior, (name,))
            assert estimate is not None and estimate.ci_low is not None and estimate.ci_high is not None
            covered["noisy" if name == "runtime0" else "others"] += (
                estimate.ci_low <= math.exp(log_time) <= estimate.ci_high
            )
    assert shifted >= 0.6 * runs, shifted
    assert covered["noisy"] / (10 * runs) >= 0.92 and covered["others"] / (30 * runs) >= 0.935, covered
