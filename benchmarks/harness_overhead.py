"""Harness overhead and protocol efficiency, measured in one process.

1. fwbench's worker path (CellRunner, adaptive protocol) on the torch MLP at batch 1, against a
   bare ``timeit`` of the same call in the same process: ratio of medians (goal ≤ 1.02).
2. The same for a ~10 µs no-op (a 10 µs spin), where harness overhead would show most.
3. Calls needed by the adaptive protocol to reach a CI half-width ≤ 1% of the median, against
   hf2019's fixed repeat=30 × number=3 and the CI half-width it reaches.
Rounds alternate harness and bare timing so that drift hits both. Usage:
    .venv/bin/python benchmarks/harness_overhead.py [--rounds 5] [--runtime torch:eager]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import time
import timeit

from fwbench.measure import environment, timer
from fwbench.measure.stats import summarize
from fwbench.runner.protocol import Job, thread_environment
from fwbench.spec import Case, Settings


def bare_median(step, number: int, repeat: int = 200) -> float:
    """Median seconds per call of plain timeit.repeat(number=number)."""
    return statistics.median(t / number for t in timeit.repeat(step, number=number, repeat=repeat))


def spin(seconds: float):
    def step() -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runtime", default="torch:eager")
    parser.add_argument("--max-time", type=float, default=3.0)
    args = parser.parse_args()
    threads = environment.physical_core_count()
    os.environ.update(thread_environment(threads, 1))
    settings = Settings(threads=threads, max_time_s=args.max_time)

    from fwbench.runner.worker import CellRunner  # imports no framework until run()

    case = Case("mlp", args.runtime, batch_size=1)
    runner = CellRunner(Job(case, settings, (), os.getppid()), io.StringIO())
    result = runner.run()
    backend, description = runner.backend, runner.backend.description
    step = backend.make_step(backend.make_inputs(description.make_inputs(1, None, settings.seed)))
    ratios = []
    print(f"{args.runtime} mlp b=1, {threads} threads")
    for i in range(args.rounds):
        harness = timer.run_adaptive(step, args.max_time)
        harness_median = summarize(harness.samples_s).median_s
        bare = bare_median(step, harness.calls_per_sample)
        ratios.append(harness_median / bare)
        print(f"  round {i}: harness {harness_median * 1e6:.3f} µs ({harness.calls_per_sample} calls/sample), "
              f"bare timeit {bare * 1e6:.3f} µs, ratio {ratios[-1]:.4f}")
    print(f"  worker-path median (first CellRunner run): {summarize(result['samples_s']).median_s * 1e6:.3f} µs")
    print(f"  median ratio harness/bare: {statistics.median(ratios):.4f}")

    noop = spin(10e-6)
    noop_ratios = []
    for _ in range(args.rounds):
        harness = timer.run_adaptive(noop, args.max_time)
        noop_ratios.append(summarize(harness.samples_s).median_s / bare_median(noop, harness.calls_per_sample))
    print(f"10 µs spin: median ratio harness/bare {statistics.median(noop_ratios):.4f} "
          f"(harness median {summarize(harness.samples_s).median_s * 1e6:.3f} µs)")

    fixed = timer.run_hf2019(step)
    fixed_summary = summarize(fixed.samples_s)
    adaptive = timer.run_adaptive(step, max_time_s=30.0, target_rel_ci=0.01)
    adaptive_summary = summarize(adaptive.samples_s)
    print(f"hf2019 (repeat=30, number=3): {fixed.total_calls} calls, median {fixed_summary.median_s * 1e6:.3f} µs, "
          f"CI half-width {fixed_summary.rel_ci_half_width:.2%}")
    print(f"adaptive (target 1%): {adaptive.total_calls} timed calls in {len(adaptive.samples_s)} blocks of "
          f"{adaptive.calls_per_sample}, {adaptive.elapsed_s:.2f} s, median {adaptive_summary.median_s * 1e6:.3f} µs, "
          f"CI half-width {adaptive_summary.rel_ci_half_width:.2%} ({adaptive.stop_reason})")


if __name__ == "__main__":
    main()
