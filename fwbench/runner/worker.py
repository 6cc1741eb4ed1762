"""The worker: runs one cell in a fresh interpreter (``python -m fwbench.runner.worker``).

It reads a :class:`~fwbench.runner.protocol.Job` on stdin, pins itself to its cores and sets the
thread budget *before* the framework is imported, then: build with the canonical weights →
compile → first call (timed apart) → parity check against the model's reference → warm-up →
reset the resident peak → timed samples → read the peak. It reports stages and one result as
JSON lines on the file descriptor given by ``--result-fd``. It dies with its manager.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import time
import traceback
from typing import IO, Any

import numpy as np

from fwbench.measure import memory, timer
from fwbench.models import get_model
from fwbench.runner.protocol import (
    PARITY_REL_L2_TOLERANCE,
    Job,
    result_message,
    stage_message,
    thread_environment,
)

PR_SET_PDEATHSIG = 1


def die_with_manager(manager_pid: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies; exit now if it already has."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: fall back to the parent check alone
        pass
    if os.getppid() != manager_pid:
        os._exit(3)


def parity(outputs: dict[str, np.ndarray], reference: dict[str, np.ndarray], dtype: str) -> dict[str, Any]:
    """Relative L2 and max-abs error of each output against the reference; ``ok`` within tolerance."""
    tolerance = PARITY_REL_L2_TOLERANCE[dtype]
    per_output: dict[str, dict[str, float]] = {}
    ok = set(outputs) == set(reference)
    for name, ref in reference.items():
        if name not in outputs:
            continue
        got = outputs[name].astype(np.float64)
        if got.shape != ref.shape:
            per_output[name] = {"rel_l2": float("inf"), "max_abs": float("inf")}
            ok = False
            continue
        denominator = float(np.linalg.norm(ref)) or 1.0
        rel_l2 = float(np.linalg.norm(got - ref)) / denominator
        per_output[name] = {"rel_l2": rel_l2, "max_abs": float(np.max(np.abs(got - ref), initial=0.0))}
        ok = ok and rel_l2 <= tolerance
    return {"ok": ok, "reference": "numpy-float64", "tolerance_rel_l2": tolerance, "outputs": per_output}


class CellRunner:
    """Runs the job's cell, reporting each stage on ``channel``."""

    def __init__(self, job: Job, channel: IO[str]) -> None:
        self.job = job
        self.channel = channel
        self.backend: Any = None
        self.result: dict[str, Any] = {"stage_seconds": {}}
        self._stage_started = time.perf_counter()
        self._stage = "start"

    def stage(self, name: str) -> None:
        now = time.perf_counter()
        self.result["stage_seconds"][self._stage] = now - self._stage_started
        self._stage, self._stage_started = name, now
        self.channel.write(stage_message(name))
        self.channel.flush()

    def run(self) -> dict[str, Any]:
        case, settings = self.job.case, self.job.settings
        description = get_model(case.model)
        self.stage("import")
        from fwbench.frameworks import create_backend

        self.backend = backend = create_backend(case.runtime, case.device, settings)
        self.result["threads_effective"] = backend.configure_threads(settings.threads, settings.interop_threads)
        self.result["versions"] = backend.versions()

        self.stage("build")
        weights = description.canonical_weights(settings.seed)
        arrays = description.make_inputs(case.batch_size, case.seq_len, settings.seed)
        backend.build(description, weights)
        inputs = backend.make_inputs(arrays)

        self.stage("compile")
        backend.compile(inputs)
        step = backend.make_step(inputs)

        self.stage("first_call")
        self.result["first_call_s"] = timer.time_first_call(step)

        reference = description.reference_forward(weights, arrays)
        if reference is not None:
            self.stage("parity")
            check = parity(backend.to_numpy(backend.infer(inputs)), reference, case.dtype)
            self.result["parity"] = check
            if not check["ok"]:
                worst = max(check["outputs"].items(), key=lambda item: item[1]["rel_l2"], default=("?", {}))
                self.result["status"] = "mismatch"
                self.result["reason"] = (
                    f"outputs differ from the reference: {worst[0]} relative L2 error "
                    f"{worst[1].get('rel_l2', float('nan')):.3g} > {check['tolerance_rel_l2']:g}"
                )
                return self.result

        self.stage("warmup")
        timer.warm_up(step, settings.warmup_calls)
        self.result["warmup_calls"] = max(2, settings.warmup_calls)

        self.stage("timing")
        self.result["rss_before_timing_bytes"] = memory.rss_bytes()
        self.result["peak_memory_scope"] = "timed" if memory.reset_peak_rss() else "process"
        backend.reset_peak_memory()
        if settings.protocol == "hf2019":
            timing = timer.run_hf2019(step)
        else:
            timing = timer.run_adaptive(step, settings.max_time_s, settings.target_rel_ci, settings.min_block_s)
        self.result["peak_memory_bytes"] = memory.peak_rss_bytes()
        self.result.update(backend.memory_stats())
        self.result.update(
            status="ok",
            samples_s=timing.samples_s,
            calls_per_sample=timing.calls_per_sample,
            stop_reason=timing.stop_reason,
            timing_elapsed_s=timing.elapsed_s,
        )
        self.stage("done")
        return self.result

    def failure(self, exc: BaseException) -> dict[str, Any]:
        """The result for a cell that raised: ``oom`` for allocation failures, else ``error``."""
        is_oom = isinstance(exc, MemoryError) or (self.backend is not None and self.backend.is_oom(exc))
        lines = [line for line in str(exc).strip().splitlines() if line.strip()]
        detail = lines[-1] if lines else ""
        self.result.update(
            status="oom" if is_oom else "error",
            reason=f"{type(exc).__name__} during {self._stage}: {detail}".rstrip(": "),
            traceback="".join(traceback.format_exception(exc)),
        )
        return self.result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="fwbench worker: runs one cell (started by the manager).")
    parser.add_argument("--result-fd", type=int, required=True, help="file descriptor for JSON result lines")
    args = parser.parse_args(argv)
    job = Job.from_json(sys.stdin.read())
    die_with_manager(job.manager_pid)
    if job.cpus:
        os.sched_setaffinity(0, job.cpus)
    os.environ.update(thread_environment(job.settings.threads, job.settings.interop_threads))
    with os.fdopen(args.result_fd, "w") as channel:
        runner = CellRunner(job, channel)
        try:
            result = runner.run()
        except BaseException as exc:  # every failure becomes this cell's status, never a lost sweep
            result = runner.failure(exc)
        result["cpus"] = sorted(os.sched_getaffinity(0))
        channel.write(result_message(result))
        channel.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
