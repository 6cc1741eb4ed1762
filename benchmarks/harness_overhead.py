"""Harness overhead and protocol efficiency of fwbench, measured on this machine.

1. Worker path vs bare timeit: the median that ``fwbench run`` stores for the MLP at batch 1 (a
   real worker process: pinning, thread budget, warm-up, adaptive protocol, manager polling),
   against a bare ``timeit.repeat`` of the very same call (``model(x)`` with autograd off) in a
   separate process given the same CPUs and thread variables but none of fwbench's timing code.
   Rounds alternate the two so that drift hits both. Goal: ratio ≤ 1.02.
2. A 10 µs spin timed in one process by the adaptive protocol and by bare timeit. Both use
   timeit's inner loop by construction; this checks that block sizing and the stopping rule add
   nothing to the per-call figure at the shortest calls fwbench is meant for.
3. Protocols through the real worker: calls needed by ``adaptive`` to reach a 95% CI half-width
   ≤ 1% of the median, against hf2019's fixed repeat=30 × number=3 and the CI half-width it gets.
   The CI is the one process's: the order-statistic CI of its samples' median, the adaptive protocol's
   stopping rule (``fwbench.measure.stats``). What fwbench stores and reports is a CI over rounds of fresh
   processes, which one worker cannot give.

    .venv/bin/python benchmarks/harness_overhead.py [--rounds 5] [--runtime torch:eager]
        [--threads N] [--max-time 3] [--repeat 100] [--adaptive-budget 30]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import timeit
from collections.abc import Callable

from fwbench.measure import environment, timer
from fwbench.measure.stats import order_statistic_median_ci
from fwbench.messages import thread_environment
from fwbench.runner.manager import run_worker, worker_cpus
from fwbench.spec import Case, Settings


def bare(runtime: str, threads: int, number: int, repeat: int) -> None:
    """(Child process.) Build the cell's model and print the median of a bare timeit, s per call."""
    from fwbench.frameworks import create_backend
    from fwbench.models import get_model

    description = get_model("mlp")
    backend = create_backend(runtime, "cpu", Settings(threads=threads))
    backend.configure_threads(threads, 1)
    backend.configure_precision()
    backend.build(description, description.canonical_weights(0))
    inputs = backend.make_inputs(description.make_inputs(1, None, 0))
    backend.compile(inputs)
    step = backend.make_step(inputs)  # for torch on the CPU: functools.partial(model, x)
    for _ in range(3):
        step()
    per_call = [t / number for t in timeit.repeat(step, number=number, repeat=repeat)]
    print(json.dumps({"median_s": statistics.median(per_call)}))


def bare_in_child(runtime: str, threads: int, number: int, repeat: int) -> float:
    cpus = worker_cpus(threads)
    env = {**os.environ, **thread_environment(threads, 1)}
    code = (
        f"import os; os.sched_setaffinity(0, {list(cpus)}); import sys; sys.argv = {sys.argv[:1]!r}; "
        f"import runpy; m = runpy.run_path({__file__!r}); m['bare']({runtime!r}, {threads}, {number}, {repeat})"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["median_s"])


def spin(seconds: float) -> Callable[[], None]:
    """A step that busy-waits ``seconds`` (a call whose cost is known)."""

    def step() -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runtime", default="torch:eager")
    parser.add_argument("--max-time", type=float, default=3.0, help="parts 1 and 2: each timing's budget, s")
    parser.add_argument("--repeat", type=int, default=100, help="parts 1 and 2: bare timeit's repeats")
    parser.add_argument("--threads", type=int, help="thread budget (default: the physical cores)")
    parser.add_argument("--adaptive-budget", type=float, default=30.0, help="part 3: the adaptive cell's budget, s")
    args = parser.parse_args()
    threads = args.threads or environment.physical_core_count()
    settings = Settings(threads=threads, max_time_s=args.max_time)
    case = Case("mlp", args.runtime, batch_size=1)

    print(f"1. {args.runtime} mlp b=1, {threads} threads on CPUs {list(worker_cpus(threads))}")
    ratios = []
    for i in range(args.rounds):
        outcome = run_worker(case, settings, check_parity=False)  # parity is checked after timing: not measured here
        assert outcome.status == "ok", outcome.reason
        worker_median = outcome.fields["median_s"]
        bare_median = bare_in_child(args.runtime, threads, outcome.fields["calls_per_sample"], args.repeat)
        ratios.append(worker_median / bare_median)
        print(
            f"   round {i}: fwbench worker {worker_median * 1e6:.3f} µs "
            f"({outcome.fields['calls_per_sample']} calls/sample), bare timeit {bare_median * 1e6:.3f} µs, "
            f"ratio {ratios[-1]:.4f}"
        )
    print(
        f"   median ratio worker/bare over {args.rounds} rounds: {statistics.median(ratios):.4f} "
        f"(min {min(ratios):.4f}, max {max(ratios):.4f})"
    )

    noop = spin(10e-6)
    noop_ratios = []
    for _ in range(args.rounds):
        harness = timer.run_adaptive(noop, args.max_time)
        direct = statistics.median(
            t / harness.calls_per_sample
            for t in timeit.repeat(noop, number=harness.calls_per_sample, repeat=args.repeat)
        )
        noop_ratios.append(statistics.median(harness.samples_s) / direct)
    print(f"2. 10 µs spin: median ratio adaptive/bare timeit {statistics.median(noop_ratios):.4f}")

    for protocol, extra in (("hf2019", {}), ("adaptive", {"max_time_s": args.adaptive_budget})):
        outcome = run_worker(
            case,
            Settings(threads=threads, protocol=protocol, **extra),  # type: ignore[arg-type]
            check_parity=False,
        )
        assert outcome.status == "ok", outcome.reason
        fields = outcome.fields
        ci = order_statistic_median_ci(outcome.samples)  # one worker is one round: no CI is stored for it
        half = "n/a (fewer than 2 samples)" if ci is None else f"{(ci[1] - ci[0]) / 2 / fields['median_s']:.2%}"
        calls = len(outcome.samples) * fields["calls_per_sample"]
        print(
            f"3. {protocol}: {calls} timed calls ({len(outcome.samples)} samples × {fields['calls_per_sample']}), "
            f"median {fields['median_s'] * 1e6:.3f} µs, within-process 95% CI half-width {half}, "
            f"stop: {outcome.details['stop_reason']}, {outcome.details['timing_elapsed_s']:.2f} s"
        )


if __name__ == "__main__":
    main()
