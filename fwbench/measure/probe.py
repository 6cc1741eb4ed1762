"""``fwbench env --noise``: how much this machine's timings move from process to process, and the rounds that
follow from it.

A fixed probe, framework-free (numpy only): a 256 × 256 float32 matmul (BLAS, ~1 ms: a kernel-bound call)
and a 64-element add (~1 µs: a dispatch-bound call, like a small model's eager step), each timed in blocks of
:data:`BLOCK_S` seconds (``timeit``; calls per block from the adaptive timer's calibration), interleaved, in
``rounds`` fresh processes (``python -m fwbench.measure.probe``) pinned to one CPU with one thread, the way a
worker is. Per probe it reports the spread of blocks within a process, the spread of the processes' medians
(what a CI over one process misses), the machine's noise counters, and the fewest rounds whose 95% CI
half-width (Student t over rounds) would be within :data:`TARGET_REL_CI` — at least :data:`~fwbench.measure.rounds.MIN_ROUNDS_FOR_CI`.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
import timeit
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fwbench.measure.rounds import MIN_ROUNDS_FOR_CI, time_estimate
from fwbench.measure.timer import calibrate_block

BLOCK_S = 0.05
TARGET_REL_CI = 0.02
MAX_ROUNDS = 30
PROBES = ("gemm-256", "add-64")


@dataclass(frozen=True)
class ProbeSpread:
    """One probe over all rounds: median seconds per call, the median within-process CV of its blocks, the CV
    of the rounds' medians, the CI half-width the rounds give, and the rounds recommended."""

    name: str
    median_s: float
    within_cv: float
    between_cv: float
    rel_half_width: float | None
    recommended_rounds: int


def _calls(name: str) -> Callable[[], object]:
    rng = np.random.default_rng(0)
    if name == "gemm-256":
        a, b = rng.standard_normal((256, 256), dtype=np.float32), rng.standard_normal((256, 256), dtype=np.float32)
        return lambda: a @ b
    x = rng.standard_normal(64)
    return lambda: x + x


def probe_process(seconds: float) -> dict[str, list[float]]:
    """One round (this process): the probes' blocks alternated for ``seconds``; seconds per call by probe."""
    timers = {name: timeit.Timer(_calls(name)) for name in PROBES}
    counts = {name: calibrate_block(timed, BLOCK_S, seconds)[0] for name, timed in timers.items()}
    samples: dict[str, list[float]] = {name: [] for name in PROBES}
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for name, timed in timers.items():
            samples[name].append(timed.timeit(counts[name]) / counts[name])
    return samples


def recommended_rounds(between_log_sd: float) -> int:
    """The fewest rounds whose CI half-width t(R − 1) · s / √R is within TARGET_REL_CI (log scale), at least
    MIN_ROUNDS_FOR_CI, at most MAX_ROUNDS."""
    from scipy import stats  # here: the probe processes and the CLI import this module without it

    for rounds in range(MIN_ROUNDS_FOR_CI, MAX_ROUNDS + 1):
        if stats.t.ppf(0.975, rounds - 1) * between_log_sd / math.sqrt(rounds) <= math.log1p(TARGET_REL_CI):
            return rounds
    return MAX_ROUNDS


def spreads(rounds: list[dict[str, list[float]]]) -> list[ProbeSpread]:
    """Each probe's :class:`ProbeSpread` over the rounds' samples."""
    out = []
    for name in PROBES:
        per_round = [np.asarray(r[name]) for r in rounds if r[name]]
        medians = np.array([np.median(r) for r in per_round])
        within = float(np.median([np.std(r, ddof=1) / np.mean(r) for r in per_round if r.size > 1]))
        between_log_sd = float(np.std(np.log(medians), ddof=1)) if medians.size > 1 else 0.0
        estimate = time_estimate(per_round)
        out.append(
            ProbeSpread(
                name=name,
                median_s=float(np.median(np.concatenate(per_round))),
                within_cv=within,
                between_cv=math.expm1(between_log_sd),
                rel_half_width=None if estimate is None else estimate.rel_half_width,
                recommended_rounds=recommended_rounds(between_log_sd),
            )
        )
    return out


def run_rounds(rounds: int, seconds: float, cpu: int) -> list[dict[str, list[float]]]:
    """``rounds`` fresh probe processes, one after another, each pinned to ``cpu`` with one BLAS thread."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    results = []
    for _ in range(rounds):
        done = subprocess.run(
            [sys.executable, "-m", "fwbench.measure.probe", "--seconds", str(seconds), "--cpu", str(cpu)],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        results.append(json.loads(done.stdout))
    return results


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="fwbench noise probe: one round (started by `fwbench env --noise`)")
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--cpu", type=int, required=True)
    args = parser.parse_args()
    os.sched_setaffinity(0, [args.cpu])
    print(json.dumps(probe_process(args.seconds)))


if __name__ == "__main__":
    main()
