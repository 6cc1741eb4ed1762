"""Timing protocols over a zero-argument ``step`` that makes one call and waits for it.

``step`` must include the device synchronisation (the worker composes ``infer`` and ``sync``),
so every timed call is measured to completion. Samples are seconds per call. Timed loops use
``timeit.Timer`` (garbage collection off while timing, as timeit does), for both protocols.

- ``hf2019``: ``timeit.repeat(repeat=30, number=3)`` exactly as the 2019 study: 30 samples,
  each the mean of 3 calls.
- ``adaptive``: blocks of ``number`` calls, ``number`` grown until a block lasts at least
  ``min_block_s``; at least 20 blocks are collected (time allowing), then more until the 95%
  CI half-width of the median is within ``target_rel_ci`` of it, or the time budget
  ``max_time_s`` is spent. The stopping rule uses the distribution-free order-statistic CI,
  which is cheap and allocates nothing sizeable inside the measured window; the stored CI is
  the bootstrap one, computed afterwards by the manager (it is usually the narrower of the two).
"""

from __future__ import annotations

import time
import timeit
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from fwbench.measure.stats import relative_half_width

Step = Callable[[], object]

HF2019_REPEAT = 30
HF2019_NUMBER = 3
MIN_ADAPTIVE_SAMPLES = 20
MAX_ADAPTIVE_SAMPLES = 100_000


@dataclass
class TimingResult:
    """Raw samples of one protocol run (seconds per call), when each sample's block started (seconds after the
    run started) and how it ended."""

    samples_s: list[float]
    calls_per_sample: int
    stop_reason: str
    elapsed_s: float
    starts_s: list[float] = field(default_factory=list)
    total_calls: int = field(init=False)

    def __post_init__(self) -> None:
        self.total_calls = self.calls_per_sample * len(self.samples_s)


def time_first_call(step: Step) -> float:
    """Seconds taken by the very first call (tracing and compilation included)."""
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


SETTLE_RATIO = 1.5  # a warm-up call this close to the fastest one so far counts as settled
MAX_SETTLE_CALLS = 50


def warm_up(
    step: Step, calls: int, settle_budget_s: float = 0.0, counters: Callable[[], dict[str, int]] | None = None
) -> list[float]:
    """Untimed calls until the first-call cost is gone; returns each call's seconds.

    At least ``calls`` (and at least 2) calls; then, while ``settle_budget_s`` lasts (at most
    ``MAX_SETTLE_CALLS`` more), more calls until one is no slower than ``SETTLE_RATIO`` × the fastest
    so far and leaves ``counters`` (compile-health counters) unchanged: a mode that is still
    specialising, profiling or recompiling keeps warming up instead of being timed.
    """
    read = counters or dict
    seconds: list[float] = []
    deadline = time.perf_counter() + settle_budget_s
    minimum = max(2, calls)
    while len(seconds) < minimum + MAX_SETTLE_CALLS:
        before = read()
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)
        if len(seconds) < minimum:
            continue
        settled = seconds[-1] <= SETTLE_RATIO * min(seconds) and read() == before
        if settled or time.perf_counter() >= deadline:
            break
    return seconds


def run_hf2019(step: Step) -> TimingResult:
    """timeit repeat=30, number=3, as the 2019 study did (``Timer.repeat`` is this loop of ``Timer.timeit``)."""
    start = time.perf_counter()
    timer = timeit.Timer(step)
    totals: list[float] = []
    starts: list[float] = []
    for _ in range(HF2019_REPEAT):
        starts.append(time.perf_counter() - start)
        totals.append(timer.timeit(HF2019_NUMBER))
    return TimingResult(
        samples_s=[t / HF2019_NUMBER for t in totals],
        calls_per_sample=HF2019_NUMBER,
        stop_reason="fixed",
        elapsed_s=time.perf_counter() - start,
        starts_s=starts,
    )


class BlockTimer(Protocol):
    """What the calibration rule times blocks with: a ``timeit.Timer``, or the manager's timer of a rank set."""

    def timeit(self, number: int) -> float:
        """Seconds of one block of ``number`` calls."""


def calibrate_block(timer: BlockTimer, min_block_s: float, budget_s: float) -> tuple[int, float]:
    """The smallest power-of-two call count whose block lasts ``min_block_s``, and that block's time.

    A block that reaches ``min_block_s`` is timed twice (when cheap) and the faster time decides,
    so a single scheduling hiccup does not settle on too few calls. Stops growing once the next
    block alone would take half of ``budget_s``.
    """
    number = 1
    while True:
        elapsed = timer.timeit(number)
        if elapsed >= min_block_s and elapsed <= budget_s / 20:
            elapsed = min(elapsed, timer.timeit(number))  # one hiccup must not fix a too-small block
        if elapsed >= min_block_s:
            return number, elapsed
        # Jump close to the target in one step, keeping to powers of two.
        factor = max(2, int(min_block_s / max(elapsed, 1e-9)))
        grown = number * (1 << (factor - 1).bit_length())
        if elapsed * grown / number > budget_s / 2:  # the next block alone would eat the budget
            return number, elapsed
        number = grown


def run_adaptive(
    step: Step,
    max_time_s: float,
    target_rel_ci: float = 0.01,
    min_block_s: float = 0.01,
    min_samples: int = MIN_ADAPTIVE_SAMPLES,
) -> TimingResult:
    """Timed blocks until the median's 95% CI half-width is ≤ ``target_rel_ci`` or the budget is spent.

    The calibration block is not kept as a sample. The stopping check runs each time the
    number of samples has grown by 10%, so its cost stays a small fraction of the loop.
    """
    start = time.perf_counter()
    deadline = start + max_time_s
    timer = timeit.Timer(step)
    number, _ = calibrate_block(timer, min_block_s, max_time_s)
    samples: list[float] = []
    starts: list[float] = []
    next_check = min_samples
    stop_reason = "budget"
    while len(samples) < MAX_ADAPTIVE_SAMPLES:
        starts.append(time.perf_counter() - start)
        samples.append(timer.timeit(number) / number)
        if len(samples) >= next_check:
            if relative_half_width(samples) <= target_rel_ci:
                stop_reason = "converged"
                break
            next_check = len(samples) + max(1, len(samples) // 10)
        if time.perf_counter() >= deadline and len(samples) >= 2:
            break
    else:
        stop_reason = "max_samples"
    return TimingResult(
        samples_s=samples,
        calls_per_sample=number,
        stop_reason=stop_reason,
        elapsed_s=time.perf_counter() - start,
        starts_s=starts,
    )
