"""The manager: runs each cell of a plan in its own worker process and stores every outcome.

It never imports a framework. A worker that crashes, is killed, exceeds ``--timeout`` or
``--memory-limit`` costs one cell, whose status and last error line are stored; the sweep goes on.
Workers get their own process group (killed whole) and die with the manager (PR_SET_PDEATHSIG).
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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from fwbench.frameworks import get_runtime, missing_implementation, missing_requirement
from fwbench.measure.environment import cpus_one_per_core
from fwbench.measure.memory import peak_rss_bytes
from fwbench.measure.stats import summarize
from fwbench.models import get_model
from fwbench.runner.messages import Job, thread_environment
from fwbench.runner.phases import get_phase
from fwbench.spec import Case, Plan, Settings
from fwbench.store import Store

POLL_INTERVAL_S = 0.1  # the manager wakes rarely: it shares the worker's cores
STDERR_TAIL_BYTES = 64 * 1024


@dataclass
class CellOutcome:
    """What one cell produced: a terminal status and the fields the store keeps."""

    case: Case
    status: str
    reason: str | None = None
    samples: list[float] = field(default_factory=list)
    fields: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)


Listener = Callable[[CellOutcome], None]


def worker_cpus(threads: int) -> tuple[int, ...]:
    """The CPUs a worker with ``threads`` threads is pinned to: one per physical core first."""
    return tuple(cpus_one_per_core()[: max(1, threads)])


def _oom_kill_count() -> int | None:
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


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the worker's whole process group (its compile helpers too), then reap the worker."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_worker(
    case: Case,
    settings: Settings,
    check_parity: bool = True,
    *,
    verify_output: str | None = None,
    weights_path: str | None = None,
    train_steps: int = 20,
) -> CellOutcome:
    """Run ``case`` in a fresh ``python -m fwbench.runner.worker`` and classify how it ended."""
    job = Job(
        case=case,
        settings=settings,
        check_parity=check_parity,
        verify_output=verify_output,
        weights_path=weights_path,
        train_steps=train_steps,
    )
    cpus = ",".join(str(cpu) for cpu in worker_cpus(settings.threads))
    env = {**os.environ, **thread_environment(settings.threads, settings.interop_threads), "PYTHONUNBUFFERED": "1"}
    oom_kills_before = _oom_kill_count()
    # The log has no name, so nothing is left behind whatever happens to the manager.
    with tempfile.TemporaryFile(prefix="fwbench-worker-") as log:
        read_fd, write_fd = os.pipe()
        try:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "fwbench.runner.worker",
                    "--result-fd",
                    str(write_fd),
                    "--cpus",
                    cpus,
                    "--manager-pid",
                    str(os.getpid()),
                ],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(write_fd,),
                start_new_session=True,
                env=env,
            )
        except OSError as exc:
            os.close(read_fd)
            return CellOutcome(case, "error", f"cannot start a worker: {exc}")
        finally:
            os.close(write_fd)
        try:
            return _supervise(proc, job, read_fd, log, oom_kills_before)
        finally:
            _kill_group(proc)  # also reaps helpers a finished worker left behind
            os.close(read_fd)


def _supervise(
    proc: subprocess.Popen[bytes], job: Job, read_fd: int, log: IO[bytes], oom_kills_before: int | None
) -> CellOutcome:
    settings, case = job.settings, job.case
    assert proc.stdin is not None
    try:
        proc.stdin.write(job.to_json().encode())
        proc.stdin.close()
    except BrokenPipeError:
        pass
    started = time.monotonic()
    buffer, stage, result, garbled = b"", "start", None, ""
    pipe_open = True
    limit = settings.memory_limit_bytes
    while True:
        if pipe_open:
            ready, _, _ = select.select([read_fd], [], [], POLL_INTERVAL_S)
            if ready:
                chunk = os.read(read_fd, 1 << 16)
                pipe_open = bool(chunk)
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    try:
                        message = json.loads(line)
                        kind = message.pop("type")
                    except (ValueError, AttributeError, KeyError):
                        garbled = line[:200].decode(errors="replace")
                        continue
                    if kind == "stage":
                        stage = message["stage"]
                    else:
                        result = message
        else:
            time.sleep(POLL_INTERVAL_S)
        if result is not None or (not pipe_open and proc.poll() is not None):
            break
        if time.monotonic() - started > settings.timeout_s:
            _kill_group(proc)
            return CellOutcome(case, "timeout", f"exceeded --timeout {settings.timeout_s:g} s during {stage}")
        if limit is not None:
            # The high-water mark, not the current size: a spike between two polls still counts.
            peak = peak_rss_bytes(proc.pid)
            if peak is not None and peak > limit:
                _kill_group(proc)
                return CellOutcome(
                    case, "oom", f"resident memory {peak} B exceeded --memory-limit {limit} B during {stage}"
                )
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
    if result is not None:
        outcome = _outcome_from_result(case, result)
        peaks = [outcome.details.get("peak_memory_before_timing_bytes"), outcome.fields.get("peak_memory_bytes")]
        peak = max((p for p in peaks if p is not None), default=None)
        if limit is not None and peak is not None and peak > limit:
            return CellOutcome(
                case, "oom", f"resident memory {peak} B exceeded --memory-limit {limit} B", details=outcome.details
            )
        return outcome
    last_line = _last_line(log) or (f"unreadable message from the worker: {garbled}" if garbled else "")
    return _outcome_from_death(case, proc.returncode, stage, last_line, oom_kills_before)


def _outcome_from_death(
    case: Case, returncode: int, stage: str, last_line: str, oom_kills_before: int | None
) -> CellOutcome:
    """Classify a worker that exited without a result."""
    if returncode < 0:
        name = signal.Signals(-returncode).name
        oom_kills_after = _oom_kill_count()
        if oom_kills_before is not None and oom_kills_after is not None and oom_kills_after > oom_kills_before:
            return CellOutcome(case, "oom", f"killed by the kernel OOM killer ({name}) during {stage}")
        reason = f"worker killed by {name} during {stage}"
    else:
        reason = f"worker exited with status {returncode} during {stage} without a result"
    return CellOutcome(case, "error", f"{reason}: {last_line}" if last_line else reason)


def _outcome_from_result(case: Case, result: dict[str, Any]) -> CellOutcome:
    """Turn the worker's result message into stored fields, with statistics computed here."""
    samples = [float(s) for s in result.pop("samples_s", [])]
    status = result.pop("status")
    reason = result.pop("reason", None)
    fields: dict[str, Any] = {
        "first_call_s": result.pop("first_call_s", None),
        "peak_memory_bytes": result.pop("peak_memory_bytes", None),
        "allocator_peak_bytes": result.pop("allocator_peak_bytes", None),
        "calls_per_sample": result.pop("calls_per_sample", None),
    }
    if samples:
        summary = summarize(samples)
        fields.update(
            median_s=summary.median_s,
            ci_low_s=summary.ci_low_s,
            ci_high_s=summary.ci_high_s,
            mean_s=summary.mean_s,
            stdev_s=summary.stdev_s,
            min_s=summary.min_s,
        )
    return CellOutcome(case, status, reason, samples, fields, result)


def _skipped(case: Case, reason: str) -> CellOutcome:
    return CellOutcome(case, "skipped", reason)


def store_outcome(store: Store, run_id: int, outcome: CellOutcome, settings: Settings, wall_s: float) -> bool:
    """Commit one cell's outcome (its own transaction); False if the run already had it."""
    case = outcome.case
    fields = dict(outcome.fields)
    fields.update(
        status=outcome.status,
        reason=outcome.reason,
        protocol=settings.protocol,
        threads=settings.threads,
        interop_threads=settings.interop_threads,
        wall_s=wall_s,
        flops=get_phase(case.phase).flops_per_call(get_model(case.model), case, settings),
    )
    return store.add_result(run_id, case, fields, outcome.samples, outcome.details)


def parity_pair(case: Case) -> tuple[str, str, str, str]:
    """Cells that share one parity check: same model, runtime, dtype and device."""
    return case.model, case.runtime, case.dtype, case.device


def _stored_parity(store: Store, run_id: int) -> dict[tuple[str, str, str, str], str]:
    """Parity already settled in this run, by pair: the key of the cell that checked it, or 'mismatch'."""
    settled: dict[tuple[str, str, str, str], str] = {}
    for row in store.results([run_id]):
        pair = (row.model, row.runtime, row.dtype, row.device)
        if row.status == "mismatch":
            settled[pair] = "mismatch"
        elif row.status == "ok" and row.parity is not None and row.parity.passed:
            settled.setdefault(pair, row.case_key)
    return settled


def execute(store: Store, run_id: int, plan: Plan, listener: Listener | None = None) -> list[CellOutcome]:
    """Run every cell of ``plan`` that run ``run_id`` has no status for yet, storing each at once.

    Parity is checked once per (model, runtime, dtype, device) in a run, by the first cell of the
    pair that completes; once a pair has failed it, its other cells are stored as ``mismatch``
    without running.
    """
    done = store.done_keys(run_id)
    parity = _stored_parity(store, run_id)
    outcomes: list[CellOutcome] = []

    def record(outcome: CellOutcome, wall_s: float) -> None:
        store_outcome(store, run_id, outcome, plan.settings, wall_s)
        outcomes.append(outcome)
        if listener is not None:
            listener(outcome)

    for skipped in plan.skipped:
        if skipped.case.key not in done:
            record(_skipped(skipped.case, skipped.reason), 0.0)
    for case in plan.cases:
        if case.key in done:
            continue
        started = time.monotonic()
        pair = parity_pair(case)
        info = get_runtime(case.runtime)
        missing = missing_requirement(info) or missing_implementation(info, get_model(case.model).arch)
        if missing:
            outcome = _skipped(case, missing)
        elif parity.get(pair) == "mismatch":
            outcome = CellOutcome(case, "mismatch", "not run: this runtime failed the parity check earlier in the run")
        else:
            outcome = run_worker(
                case, plan.settings, check_parity=pair not in parity, weights_path=plan.settings.weights_path
            )
            if pair in parity:
                outcome.details["parity_checked_by"] = parity[pair]
            elif outcome.status == "mismatch":
                parity[pair] = "mismatch"
            elif outcome.status == "ok":
                parity[pair] = case.key
        record(outcome, time.monotonic() - started)
    return outcomes
