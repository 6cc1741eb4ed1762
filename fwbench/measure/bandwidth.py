"""The memory bandwidth of a set of cores, measured as STREAM's copy kernel measures it: every thread (one per core,
pinned to it) copies its own slice of an array far larger than the last-level cache into another, repeatedly; the
bandwidth is the bytes moved (read + written, as STREAM counts a copy) over the slowest thread's time, the best of
the repeats. Decoding one token at batch 1 reads every weight once, so this, not the FLOP peak, bounds it."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

ARRAY_BYTES = 512 * 1024 * 1024  # each of the two arrays: far beyond any CPU's last-level cache today
REPEATS = 5


@dataclass(frozen=True)
class Bandwidth:
    """``bytes_per_s``: the best repeat's bytes copied (read + written) per second over ``cpus``; every repeat's
    figure in ``repeats_bytes_per_s``."""

    bytes_per_s: float
    cpus: tuple[int, ...]
    array_bytes: int
    repeats_bytes_per_s: tuple[float, ...]
    kernel: str = "copy (STREAM: 2 × the array's bytes per pass, one thread per CPU, each pinned)"

    def to_dict(self) -> dict[str, object]:
        return {
            "bytes_per_s": self.bytes_per_s,
            "cpus": list(self.cpus),
            "array_bytes": self.array_bytes,
            "repeats_bytes_per_s": list(self.repeats_bytes_per_s),
            "kernel": self.kernel,
        }


def copy_bandwidth(cpus: Sequence[int], array_bytes: int = ARRAY_BYTES, repeats: int = REPEATS) -> Bandwidth:
    """Measure the copy bandwidth of ``cpus`` (one pinned thread each) over two float64 arrays of ``array_bytes``."""
    count = len(cpus)
    elements = array_bytes // 8 // count * count
    source = np.ones(elements)
    target = np.full(elements, 2.0)  # both written before timing (np.zeros would leave its pages untouched)
    slices = [slice(i * elements // count, (i + 1) * elements // count) for i in range(count)]
    start = threading.Barrier(count + 1)
    done = threading.Barrier(count + 1)
    seconds = np.zeros((repeats, count))

    def work(index: int) -> None:
        os.sched_setaffinity(0, {cpus[index]})  # this thread only (Linux: 0 is the calling thread)
        part = slices[index]
        for repeat in range(repeats):
            start.wait()
            began = time.perf_counter()
            np.copyto(target[part], source[part])  # numpy releases the GIL for the copy
            seconds[repeat, index] = time.perf_counter() - began
            done.wait()

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for _ in range(repeats):
        start.wait()
        done.wait()
    for thread in threads:
        thread.join()
    moved = 2.0 * elements * 8
    rates = tuple(float(moved / row.max()) for row in seconds)
    return Bandwidth(max(rates), tuple(cpus), elements * 8, rates)
