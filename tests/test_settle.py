"""The pause between two workers' blocks ends when the last worker's threads have gone quiet, never before, and
never later than ``settle_s``."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from fwbench.measure.settle import QUIET_S, readable, settle

MAX_S = 0.5

pytestmark = pytest.mark.skipif(not readable(), reason="needs /proc/PID/task/*/schedstat")


@contextmanager
def child(code: str) -> Iterator[subprocess.Popen[bytes]]:
    """A Python child running ``code``, killed at the end."""
    process = subprocess.Popen([sys.executable, "-c", f"print(flush=True)\n{code}"], stdout=subprocess.PIPE)
    try:
        assert process.stdout is not None and process.stdout.readline() == b"\n"  # started
        yield process
    finally:
        process.kill()
        process.wait()


def test_a_sleeping_process_ends_the_pause_after_the_quiet_stretch() -> None:
    with child("import time\ntime.sleep(60)") as process:
        waited = settle([process.pid], MAX_S)
    assert QUIET_S <= waited < MAX_S


def test_a_spinning_process_is_waited_for_the_whole_settle_time() -> None:
    with child("while True: pass") as process:
        waited = settle([process.pid], MAX_S)
    assert waited >= MAX_S


def test_an_ended_process_is_quiet_and_no_settle_time_is_no_pause() -> None:
    with child("pass") as process:
        process.wait()
        assert settle([process.pid], MAX_S) < MAX_S
        assert settle([process.pid], 0.0) < QUIET_S
