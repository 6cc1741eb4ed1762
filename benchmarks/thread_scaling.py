"""Whether each native framework's gemm gets faster with a second thread, as ``fwbench run --threads`` gives it.

The gemm cell (``batch`` × 3072 by 3072 × 3072 in float32, 2·batch·3072² FLOP a call) runs in real workers, exactly
as ``fwbench run`` runs it (pinning, thread variables, the framework's own thread API), at 1 and at 2 threads, in
``--rounds`` alternated rounds; each round prints both medians and their ratio, then each runtime its median ratio.
A matmul this size scales almost linearly over physical cores, so a framework that obeys the budget shows about 2x;
one that ignored it (both cells on the same pool, or two threads squeezed onto one pinned CPU) shows about 1x. The
figure is this machine's, and another busy process on one of the two cores pulls a round towards 1x: that is why
this is a benchmark, not a test (tests/test_thread_budget.py checks the budget by construction: what the framework's
API reports, the cell's CPUs, every thread's affinity).

    python benchmarks/thread_scaling.py --runtimes torch:eager,tensorflow:function,jax:jit --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from fwbench.runner.manager import execute
from fwbench.spec import Case, Plan, Settings
from fwbench.store import Store

NATIVE_RUNTIMES = "torch:eager,tensorflow:function,jax:jit"


def gemm_median_s(store: Store, runtime: str, threads: int, batch: int, max_time_s: float) -> float:
    """The median seconds of one call of the gemm cell at ``threads`` threads, in a fresh worker."""
    plan = Plan(
        (Case("gemm", runtime, batch_size=batch),),
        Settings(threads=threads, max_time_s=max_time_s, timeout_s=300),
        suite="thread-scaling",
    )
    run_id = store.create_run(plan, f"thread_scaling.py threads={threads}", {}, "0")
    execute(store, run_id, plan)
    (row,) = store.results([run_id])
    if row.status != "ok" or row.median_s is None:
        raise SystemExit(f"{runtime} at {threads} threads: {row.status}: {row.reason}")
    return row.median_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtimes", default=NATIVE_RUNTIMES, help=f"comma-separated (default {NATIVE_RUNTIMES})")
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds of 2 then 1 thread (default 3)")
    parser.add_argument("--batch", type=int, default=512, help="the gemm's rows (default 512: 9.7 GFLOP a call)")
    parser.add_argument("--max-time", type=float, default=1.5, help="seconds of timed calls per cell (default 1.5)")
    parser.add_argument("--db", type=Path, help="keep the cells in this store (default: a temporary one)")
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        sys.exit(f"thread_scaling.py: needs 2 usable CPUs; this process may use {len(os.sched_getaffinity(0))}")
    with tempfile.TemporaryDirectory() as scratch:
        with Store.open(args.db or Path(scratch) / "scaling.db") as store:
            for runtime in args.runtimes.split(","):
                ratios = []
                for round_index in range(1, args.rounds + 1):
                    two = gemm_median_s(store, runtime, 2, args.batch, args.max_time)
                    one = gemm_median_s(store, runtime, 1, args.batch, args.max_time)
                    ratios.append(one / two)
                    print(
                        f"{runtime} round {round_index}: 1 thread {one * 1e3:.2f} ms, 2 threads {two * 1e3:.2f} ms, "
                        f"{one / two:.2f}x"
                    )
                print(f"{runtime}: median 1-thread/2-thread ratio {statistics.median(ratios):.2f}x over {args.rounds}")


if __name__ == "__main__":
    main()
