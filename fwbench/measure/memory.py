"""Resident-memory peaks read from /proc, the same way for every framework (Linux).

The worker resets the kernel's high-water mark (VmHWM) after warm-up by writing ``5`` to
``/proc/self/clear_refs``, so the peak it reads afterwards covers the timed phase only.
"""

from __future__ import annotations

from pathlib import Path


def _status_field_bytes(pid: int | str, field: str) -> int | None:
    """A ``kB`` field of /proc/PID/status in bytes, or None where it cannot be read."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return None


def reset_peak_rss() -> bool:
    """Reset this process's VmHWM to its current RSS; False where the kernel does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def peak_rss_bytes(pid: int | str = "self") -> int | None:
    """Resident high-water mark (VmHWM) of process ``pid``, bytes; None if it is gone."""
    return _status_field_bytes(pid, "VmHWM")


def rss_bytes(pid: int | str = "self") -> int | None:
    """Current resident set size (VmRSS) of process ``pid``, bytes; None if it is gone."""
    return _status_field_bytes(pid, "VmRSS")
