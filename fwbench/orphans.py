"""No orphans: a process fwbench starts asks the kernel to kill it when the process that started it dies (Linux's
``PR_SET_PDEATHSIG``). Standard library only: a worker calls it before anything heavier is imported."""

from __future__ import annotations

import ctypes
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies; nothing where that cannot be asked (not Linux).
    Also fit for ``subprocess.Popen(preexec_fn=...)``: the child asks, between fork and exec."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
