"""One worker process as the manager sees it: started pinned, fed a job (and, when interleaved, commands) on
its stdin, heard on its result pipe, watched for its deadline and memory limit, and killed whole.

A worker that dies, hangs past its deadline or exceeds ``--memory-limit`` raises :class:`WorkerFailure`
with the status (``error``, ``timeout``, ``oom``) and one line saying why; the caller turns that into the
cell's stored status. Workers get their own process group (killed whole) and die with the manager
(PR_SET_PDEATHSIG, in the worker).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from fwbench.measure.environment import cpus_one_per_core
from fwbench.measure.memory import peak_rss_bytes
from fwbench.measure.noise import process_cpu_seconds
from fwbench.messages import Job, thread_environment
from fwbench.runner.tempfolders import remove_external_folders

POLL_INTERVAL_S = 0.1  # the manager wakes rarely: it shares the worker's cores
STDERR_TAIL_BYTES = 64 * 1024


class WorkerFailure(Exception):
    """The worker ended without the message awaited: ``status`` (error | timeout | oom) and ``reason``."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def ended_early(result: dict[str, Any], stage: str) -> WorkerFailure:
    """The failure of a worker that sent its ``result`` (an exception it reported) while something else was due."""
    status = result.get("status") if result.get("status") in ("oom", "error", "mismatch") else "error"
    return WorkerFailure(str(status), str(result.get("reason") or f"the worker ended during {stage}"))


def worker_cpus(threads: int) -> tuple[int, ...]:
    """The CPUs a worker with ``threads`` threads is pinned to: one per physical core first."""
    return tuple(cpus_one_per_core()[: max(1, threads)])


def oom_kill_count() -> int | None:
    """The kernel's OOM-kill counter: this cgroup's (cgroup v2), else the machine's (/proc/vmstat)."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                events = Path("/sys/fs/cgroup") / line[3:].lstrip("/") / "memory.events"
                for event in events.read_text().splitlines():
                    if event.startswith("oom_kill "):
                        return int(event.split()[1])
    except (OSError, ValueError):
        pass
    try:
        for line in Path("/proc/vmstat").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _last_line(log: IO[bytes]) -> str:
    """The last non-empty line of a worker's captured output."""
    log.seek(0, os.SEEK_END)
    log.seek(max(0, log.tell() - STDERR_TAIL_BYTES))
    lines = [line.strip() for line in log.read().decode(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else ""


class WorkerProcess:
    """A started ``python -m fwbench.runner.worker`` running ``job``; use as a context manager (killed on exit).

    With ``job.interleaved`` its stdin stays open for commands (:meth:`command`); otherwise it is closed after
    the job. :attr:`stage` is the last stage the worker reported."""

    def __init__(
        self,
        job: Job,
        cpus: Sequence[int] | None = None,
        env: Mapping[str, str] | None = None,
        start_cpus: Sequence[int] | None = None,
    ) -> None:
        """Start ``job``'s worker pinned to ``cpus`` (default: :func:`worker_cpus` of its threads) with ``env``
        added to its environment (a rank's identity); with ``start_cpus``, it imports on those and moves to
        ``cpus`` once its framework is imported (a worker started beside others: fwbench.runner.worker)."""
        self.job = job
        self.stage = "start"
        self.garbled = ""
        self._closed = False
        self._buffer = b""
        self._pipe_open = True
        self._log = tempfile.TemporaryFile(prefix="fwbench-worker-")  # nameless: nothing left behind
        self._oom_kills_before = oom_kill_count()
        settings = job.settings
        pinned = worker_cpus(settings.threads) if cpus is None else tuple(cpus)
        cpus_text = ",".join(str(cpu) for cpu in pinned)
        env = {
            **os.environ,
            **thread_environment(settings.threads, settings.interop_threads),
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        self._read_fd, write_fd = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "fwbench.runner.worker",
                    "--result-fd",
                    str(write_fd),
                    "--cpus",
                    cpus_text,
                    "--manager-pid",
                    str(os.getpid()),
                    *(["--start-cpus", ",".join(str(cpu) for cpu in start_cpus)] if start_cpus else []),
                ],
                stdin=subprocess.PIPE,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                pass_fds=(write_fd,),
                start_new_session=True,
                env=env,
            )
        except OSError as exc:
            os.close(self._read_fd)
            self._log.close()
            raise WorkerFailure("error", f"cannot start a worker: {exc}") from None
        finally:
            os.close(write_fd)
        self._write_line(job.to_json(), close=not job.interleaved)

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def pids(self) -> tuple[int, ...]:
        """The worker's process id (a rank set has one per rank)."""
        return (self.proc.pid,)

    def fileno(self) -> int | None:
        """The result pipe's descriptor while it is open (to wait on with select); None after end of file."""
        return self._read_fd if self._pipe_open and not self._closed else None

    def peak_rss_bytes(self) -> int | None:
        """The worker's resident high-water mark so far, bytes (None once it is gone)."""
        return peak_rss_bytes(self.proc.pid)

    def _write_line(self, text: str, close: bool = False) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(text.encode() + b"\n")
            self.proc.stdin.flush()
            if close:
                self.proc.stdin.close()
        except (BrokenPipeError, ValueError):
            pass  # the worker is gone: awaiting its next message says how it ended

    def command(self, name: str, **fields: Any) -> None:
        """Send an interleaved worker one command (``block``, ``finish``)."""
        self._write_line(json.dumps({"command": name, **fields}))

    def cpu_seconds(self) -> float | None:
        """CPU time (user + system, all threads) the worker has used so far."""
        return process_cpu_seconds(self.proc.pid)

    def await_message(self, kinds: set[str], timeout_s: float) -> dict[str, Any]:
        """The worker's next message of one of ``kinds`` (stage messages update :attr:`stage`), within
        ``timeout_s`` seconds; WorkerFailure when it dies, hangs past that or exceeds the memory limit."""
        limit = self.job.settings.memory_limit_bytes
        deadline = time.monotonic() + timeout_s
        while True:
            message = self.poll(kinds)
            if message is not None:
                message.pop("type")
                return message
            if time.monotonic() > deadline:
                self.kill()
                raise WorkerFailure(
                    "timeout", f"exceeded --timeout {self.job.settings.timeout_s:g} s during {self.stage}"
                )
            if limit is not None:
                # The high-water mark, not the current size: a spike between two polls still counts.
                peak = peak_rss_bytes(self.proc.pid)
                if peak is not None and peak > limit:
                    self.kill()
                    raise WorkerFailure(
                        "oom", f"resident memory {peak} B exceeded --memory-limit {limit} B during {self.stage}"
                    )

    def poll(self, kinds: set[str], wait_s: float = POLL_INTERVAL_S) -> dict[str, Any] | None:
        """The worker's next message of one of ``kinds`` (its ``type`` kept) if one is buffered or arrives within
        ``wait_s`` seconds, stage messages on the way updating :attr:`stage`; else None. WorkerFailure when the
        worker has died, or reported its end (a result) while something else was due."""
        message = self._next_message(wait_s)
        while message is not None:
            kind = message["type"]
            if kind in kinds:
                return message
            if kind == "stage":
                self.stage = message["stage"]
            elif kind == "result":  # the cell ended (an exception it reported) while something else was due
                raise ended_early(message, self.stage)
            message = self._next_message(0.0)
        if not self._pipe_open and self.proc.poll() is not None:
            raise self._death()
        return None

    def check_alive(self) -> None:
        """WorkerFailure (how it ended) if the worker has exited."""
        if self.proc.poll() is not None:
            raise self._death()

    def _next_message(self, wait_s: float = POLL_INTERVAL_S) -> dict[str, Any] | None:
        """One parsed message if a whole line is buffered or arrives within ``wait_s`` seconds, else None."""
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            try:
                message = json.loads(line)
                if isinstance(message, dict) and "type" in message:
                    return message
            except ValueError:
                pass
            self.garbled = line[:200].decode(errors="replace")
        if not self._pipe_open:
            time.sleep(wait_s)
            return None
        ready, _, _ = select.select([self._read_fd], [], [], wait_s)
        if ready:
            chunk = os.read(self._read_fd, 1 << 16)
            self._pipe_open = bool(chunk)
            self._buffer += chunk
            if b"\n" in self._buffer:
                return self._next_message(0.0)
        return None

    def _death(self) -> WorkerFailure:
        """Classify a worker that exited without the awaited message."""
        returncode = self.proc.returncode
        last_line = _last_line(self._log) or (
            f"unreadable message from the worker: {self.garbled}" if self.garbled else ""
        )
        if returncode < 0:
            name = signal.Signals(-returncode).name
            after = oom_kill_count()
            if self._oom_kills_before is not None and after is not None and after > self._oom_kills_before:
                return WorkerFailure("oom", f"killed by the kernel OOM killer ({name}) during {self.stage}")
            reason = f"worker killed by {name} during {self.stage}"
        else:
            reason = f"worker exited with status {returncode} during {self.stage} without a result"
        return WorkerFailure("error", f"{reason}: {last_line}" if last_line else reason)

    def wait_exit(self, timeout_s: float = 10.0) -> None:
        """Give a worker that has sent its result ``timeout_s`` to exit, then kill it."""
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL the worker's whole process group (its compile helpers too), then reap the worker."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def close(self) -> None:
        """Kill what is left of the worker (also helpers a finished worker left behind) and free its pipes; a second
        call does nothing."""
        if self._closed:
            return
        self._closed = True
        self.kill()
        remove_external_folders(self.proc.pid)  # a worker in another language killed before it removed its own
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        os.close(self._read_fd)
        self._log.close()
