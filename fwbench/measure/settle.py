"""The pause between two workers' blocks: until the worker that timed the last block has gone quiet.

A framework's thread pool keeps its threads running for a while after its work (OpenMP's spin-wait in PyTorch,
ONNX Runtime's spinning pool); a block another worker times on the same CPUs meanwhile would share them. Measured
on the 2-core Xeon VM (docs/measurements.md, "The settle pause"): after a 50-call block of a 256² matmul, a torch
worker at 2 threads had a thread running for 5.4 ms (median; at most 8.7 ms); TensorFlow and JAX at 2 threads,
and every framework at 1 thread, 0 ms (JAX at most 3.2 ms). So instead of a fixed pause the manager watches the last worker's threads and starts the next
block once none of them has run for :data:`QUIET_S` (no thread in state R, and their summed on-CPU time
unchanged), waiting at most ``settle_s`` (``--settle``). Where the threads cannot be read (no /proc, no
schedstat), it waits the whole ``settle_s``, as before.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Sequence
from pathlib import Path

QUIET_S = 0.002  # a stretch this long with no thread of the last worker running ends the pause
POLL_S = 0.0002  # how often the threads are read while waiting


def expected_pause_s(max_s: float) -> float:
    """A pause's typical length for estimates (seconds): the quiet stretch after a few ms of spinning, at most
    ``max_s``."""
    return min(max_s, 3 * QUIET_S)


@functools.cache  # a property of the system: read once, not before every block
def readable() -> bool:
    """Whether this system lets the manager read each thread's state and on-CPU time (/proc with schedstat)."""
    return Path("/proc/self/task").is_dir() and Path(f"/proc/self/task/{os.getpid()}/schedstat").is_file()


def threads_state(pids: Sequence[int]) -> tuple[bool, int]:
    """(whether any thread of ``pids`` is running or runnable, their summed on-CPU nanoseconds) from
    /proc/PID/task/*/stat and schedstat; a process or thread that has ended counts as quiet."""
    running = False
    total_ns = 0
    for pid in pids:
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue  # the process has ended
        for task in tasks:
            try:
                stat = (task / "stat").read_text()
                total_ns += int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue  # the thread ended between the listing and the reads
            running = running or stat[stat.rindex(")") + 2] == "R"
    return running, total_ns


def settle(pids: Sequence[int], max_s: float, quiet_s: float = QUIET_S) -> float:
    """Wait until no thread of ``pids`` has run for ``quiet_s``, at most ``max_s``; the seconds waited. Where
    threads cannot be read (:func:`readable`), the whole ``max_s``."""
    start = time.perf_counter()
    deadline = start + max_s
    if max_s <= 0 or not readable():
        time.sleep(max(0.0, max_s))
        return time.perf_counter() - start
    running, last_ns = threads_state(pids)
    quiet_since = None if running else start
    while True:
        now = time.perf_counter()
        if (quiet_since is not None and now - quiet_since >= quiet_s) or now >= deadline:
            return now - start
        time.sleep(POLL_S)
        running, total_ns = threads_state(pids)
        if running or total_ns != last_ns:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.perf_counter()
        last_ns = total_ns
