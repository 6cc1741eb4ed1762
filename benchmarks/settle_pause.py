"""How long the interleaved schedule's pause between two workers' blocks lasts (fwbench.measure.settle).

For each framework and thread count: a child process pinned to the first THREADS CPUs times blocks of a 256²
matmul on command; after each block the parent measures how long the child's threads keep running (the last
moment any of them was in state R, or its on-CPU time grew) and how long :func:`fwbench.measure.settle.settle`
waits before it would let the next worker's block start (at most ``--max-settle``, the old fixed pause).

    python benchmarks/settle_pause.py --frameworks torch,tensorflow,jax --threads 1,2 --blocks 8
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from fwbench.measure.settle import settle, threads_state

CHILD = """
import os, sys
framework, threads = sys.argv[1], int(sys.argv[2])
if framework == "torch":
    import torch
    torch.set_num_threads(threads)
    a = torch.randn(256, 256)
    def step(): return float((a @ a).sum())
elif framework == "tensorflow":
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    a = tf.random.normal((256, 256))
    f = tf.function(lambda x: tf.reduce_sum(x @ x))
    def step(): return f(a).numpy()
else:
    import jax, jax.numpy as jnp
    a = jnp.ones((256, 256))
    f = jax.jit(lambda x: (x @ x).sum())
    def step(): return f(a).block_until_ready()
for _ in range(20):
    step()
print("ready", flush=True)
for line in sys.stdin:
    for _ in range(int(line)):
        step()
    print("done", flush=True)
"""


def last_activity_s(pid: int, window_s: float) -> float:
    """Seconds after now until the last moment a thread of ``pid`` ran, watched for ``window_s``."""
    start = time.perf_counter()
    last, previous = 0.0, threads_state([pid])[1]
    while time.perf_counter() - start < window_s:
        running, total_ns = threads_state([pid])
        if running or total_ns != previous:
            last = time.perf_counter() - start
        previous = total_ns
        time.sleep(0.0002)
    return last


def measure(framework: str, threads: int, blocks: int, max_settle_s: float) -> tuple[list[float], list[float]]:
    """(seconds the child's threads ran after each block, seconds settle() waited after each block)."""
    cpus = sorted(os.sched_getaffinity(0))[:threads]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TF_CPP_MIN_LOG_LEVEL": "3"}
    env["XLA_FLAGS"] = f"--xla_cpu_multi_thread_eigen={'true' if threads > 1 else 'false'}"
    child = subprocess.Popen(
        ["taskset", "-c", ",".join(map(str, cpus)), sys.executable, "-c", CHILD, framework, str(threads)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parents[1],
    )
    spins, pauses = [], []
    try:
        assert child.stdin is not None and child.stdout is not None
        if child.stdout.readline().strip() != "ready":
            raise SystemExit(f"{framework}: the child did not start")
        for index in range(2 * blocks):
            time.sleep(0.2)  # quiet before the block, as after a peer's
            child.stdin.write("50\n")
            child.stdin.flush()
            child.stdout.readline()
            if index % 2:
                spins.append(last_activity_s(child.pid, max_settle_s))
            else:
                pauses.append(settle([child.pid], max_settle_s))
    finally:
        child.kill()
        child.wait()
    return spins, pauses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frameworks", default="torch,tensorflow,jax")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--blocks", type=int, default=8, help="blocks per measurement (each measured twice)")
    parser.add_argument("--max-settle", type=float, default=0.05, help="the longest pause, seconds (--settle)")
    args = parser.parse_args()
    print("| framework | threads | threads ran on after a block (median, max) | pause taken (median, max) |")
    print("|---|---|---|---|")
    for framework in args.frameworks.split(","):
        for threads in (int(t) for t in args.threads.split(",")):
            if threads > len(os.sched_getaffinity(0)):
                continue
            spins, pauses = measure(framework, threads, args.blocks, args.max_settle)
            print(
                f"| {framework} | {threads} | {np.median(spins) * 1e3:.1f} ms, {max(spins) * 1e3:.1f} ms "
                f"| {np.median(pauses) * 1e3:.1f} ms, {max(pauses) * 1e3:.1f} ms |"
            )


if __name__ == "__main__":
    main()
