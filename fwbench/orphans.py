"""No orphans: a process fwbench starts asks the kernel to kill it when the process that started it dies (Linux's
``PR_SET_PDEATHSIG``). Standard library only: a worker calls it before anything heavier is imported."""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies; nothing where that cannot be asked (not Linux).
    Also fit for ``subprocess.Popen(preexec_fn=...)``: the child asks, between fork and exec."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def die_with_manager(manager_pid: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (not Linux: the parent check alone); exit now if
    it already has (its parent is no longer ``manager_pid``)."""
    die_with_parent()
    if os.getppid() != manager_pid:
        os._exit(3)
