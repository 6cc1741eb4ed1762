"""A process and the processes it started (an input pipeline's workers): their memory without double counting
shared pages (PSS) and the CPU time they used, read with psutil, the same way for every framework (Linux)."""

from __future__ import annotations

import multiprocessing.forkserver
import multiprocessing.resource_tracker
import time
from dataclasses import dataclass

import psutil


def multiprocessing_helpers() -> set[int]:
    """The pids of this process's multiprocessing helpers, started on first use and alive until it exits: the
    resource tracker (spawn and forkserver workers, shared memory) and the fork server."""
    helpers = (
        getattr(multiprocessing.resource_tracker._resource_tracker, "_pid", None),
        getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None),
    )
    return {pid for pid in helpers if isinstance(pid, int)}


def children(pid: int | None = None) -> list[psutil.Process]:
    """The live descendants of process ``pid`` (this process when None), every generation, but for this process's
    multiprocessing helpers (:func:`multiprocessing_helpers`): what a loader started to do its work."""
    helpers = multiprocessing_helpers()
    try:
        return [child for child in psutil.Process(pid).children(recursive=True) if child.pid not in helpers]
    except psutil.NoSuchProcess:
        return []


def _pss(process: psutil.Process) -> int | None:
    try:
        return int(process.memory_full_info().pss)
    except (psutil.NoSuchProcess, psutil.AccessDenied, AttributeError):  # gone, or a kernel without smaps
        return None


@dataclass(frozen=True)
class TreeMemory:
    """Proportional set sizes in bytes: this process's, and its descendants' summed (shared pages split
    between the processes that map them, so the total counts each page once)."""

    parent_bytes: int | None
    workers_bytes: int
    workers: int

    @property
    def total_bytes(self) -> int | None:
        return None if self.parent_bytes is None else self.parent_bytes + self.workers_bytes


def tree_memory() -> TreeMemory:
    """PSS of this process and of its live descendants now."""
    descendants = children()
    sizes = [size for size in map(_pss, descendants) if size is not None]
    return TreeMemory(_pss(psutil.Process()), sum(sizes), len(descendants))


def _cpu_s(process: psutil.Process) -> float | None:
    try:
        times = process.cpu_times()
    except psutil.NoSuchProcess:
        return None
    return float(times.user + times.system)


def tree_cpu_s() -> dict[int, float]:
    """CPU seconds (user + system) used so far by this process and each live descendant, by pid."""
    processes = [psutil.Process(), *children()]
    return {process.pid: cpu for process in processes if (cpu := _cpu_s(process)) is not None}


def cpu_used_s(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds used between two :func:`tree_cpu_s` readings by the processes alive at the second (a process
    started in between counts from zero)."""
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())


def wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    """Wait up to ``timeout_s`` for the processes ``pids`` to end; the pids still running then (zombies of this
    process are reaped, not counted)."""
    deadline = time.monotonic() + timeout_s
    alive = list(pids)
    while alive:
        alive = [pid for pid in alive if running(pid)]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return alive


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
