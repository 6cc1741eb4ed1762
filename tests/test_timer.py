"""Timers against known busy loops and sleeps."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pytest

from fwbench.measure import timer


def busy(seconds: float) -> Callable[[], None]:
    """A step that spins for ``seconds`` (steadier than sleep)."""

    def step() -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    return step


def test_first_call_time_is_measured() -> None:
    assert 0.05 <= timer.time_first_call(lambda: time.sleep(0.05)) < 0.5


def test_warm_up_makes_at_least_two_calls() -> None:
    calls: list[int] = []
    timer.warm_up(lambda: calls.append(1), 1)
    assert len(calls) == 2
    timer.warm_up(lambda: calls.append(1), 5)
    assert len(calls) == 7


def test_hf2019_is_timeit_repeat_30_number_3() -> None:
    calls: list[int] = []

    def step() -> None:
        calls.append(1)
        busy(0.001)()

    result = timer.run_hf2019(step)
    assert len(calls) == 90 and len(result.samples_s) == 30 and result.calls_per_sample == 3
    assert np.median(result.samples_s) == pytest.approx(0.001, rel=0.25)
    assert all(s >= 0.001 for s in result.samples_s)


def test_adaptive_blocks_last_at_least_min_block_and_converge() -> None:
    result = timer.run_adaptive(busy(0.0002), max_time_s=5.0, target_rel_ci=0.05, min_block_s=0.01)
    assert result.calls_per_sample * 0.0002 >= 0.01
    assert result.calls_per_sample <= 128  # power of two just above 50 calls
    assert np.median(result.samples_s) == pytest.approx(0.0002, rel=0.25)
    assert result.stop_reason == "converged"
    assert len(result.samples_s) >= timer.MIN_ADAPTIVE_SAMPLES


def test_adaptive_stops_at_its_budget_when_noise_never_settles() -> None:
    rng = np.random.default_rng(0)
    noisy = lambda: busy(float(rng.choice([0.0005, 0.004])))()  # noqa: E731
    start = time.perf_counter()
    result = timer.run_adaptive(noisy, max_time_s=0.5, target_rel_ci=1e-6, min_block_s=0.001)
    assert result.stop_reason == "budget"
    assert time.perf_counter() - start < 1.5
    assert len(result.samples_s) >= 2


def test_calibration_stops_growing_at_the_budget() -> None:
    import timeit

    number, elapsed = timer.calibrate_block(timeit.Timer(busy(0.02)), min_block_s=10.0, budget_s=0.05)
    assert number <= 2 and elapsed < 0.2
