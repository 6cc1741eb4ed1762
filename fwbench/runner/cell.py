"""The cell a worker runs (:class:`Cell`): its job, the result it builds, its stage reports, and the stages
every phase shares — import → build (:meth:`Cell.build_backend`), first call → warm-up → timed samples
(:meth:`Cell.time_calls`), the parity verdict (:func:`parity`, :meth:`Cell.fail_check`).

What a phase does with them is in its own file in :mod:`fwbench.runner.phases`.

Imported by the worker only after its CPU affinity and thread environment are in place, because
importing numpy starts BLAS threads that inherit whatever affinity the process has then (a worker started
beside others on other CPUs moves every thread, those included, with :meth:`Cell.pin_threads`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import timeit
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

import numpy as np

from fwbench.details import CompileHealth, PrecisionCheck
from fwbench.diskfull import disk_full_report
from fwbench.measure import environment, memory, noise, timer
from fwbench.messages import Job, message, stage_message
from fwbench.models.base import ModelDescription
from fwbench.models.weights_io import load_weights
from fwbench.precision import policy_mismatches
from fwbench.runner.tolerances import parity_tolerance, relative_errors

if TYPE_CHECKING:
    from fwbench.frameworks.base import Backend


def parity(outputs: dict[str, np.ndarray], reference: dict[str, np.ndarray], dtype: str, model: str) -> dict[str, Any]:
    """Relative L2 and max-abs error of each output against the reference; ``ok`` within ``model``'s tolerance in
    ``dtype`` (fwbench.runner.tolerances.parity_tolerance)."""
    tolerance = parity_tolerance(model, dtype)
    per_output: dict[str, dict[str, float]] = {}
    ok = set(outputs) == set(reference)
    for name, ref in reference.items():
        if name not in outputs:
            continue
        rel_l2, max_abs = relative_errors(outputs[name], ref)  # inf, inf when the shapes differ
        per_output[name] = {"rel_l2": rel_l2, "max_abs": max_abs}
        ok = ok and rel_l2 <= tolerance
    return {"ok": ok, "reference": "numpy-float64", "tolerance_rel_l2": tolerance, "outputs": per_output}


def compile_health(before: dict[str, int], after: dict[str, int]) -> dict[str, Any]:
    """``details.compile_health`` of the counters read around the timed loop (:meth:`CompileHealth.measured`)."""
    return CompileHealth.measured(before, after).to_dict()


def seeded_canonical_weights(description: ModelDescription, seed: int) -> dict[str, np.ndarray]:
    """The model's seeded canonical weights (what every phase but generate builds with)."""
    return description.canonical_weights(seed)


def recording(step: Callable[[], object], losses: list[object]) -> Callable[[], object]:
    """``step`` that also appends what it returned (a training step's loss, not read: no sync, no float
    conversion) to ``losses``; the timed window gains one call and one list append per step."""
    append = losses.append

    def recorded() -> object:
        loss = step()
        append(loss)
        return loss

    return recorded


class Launcher(Protocol):
    """How a process carries out a cell's phase, as the cell and the phases ask it (the implementations, one process,
    a rank of a --procs cell and profiled, are :mod:`fwbench.runner.launchers`')."""

    writes_outputs: bool  # fwbench verify: this process writes the cell's outputs

    def rows(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """This process's rows of a global batch (every array's first axis)."""
        ...

    def row_groups(self, global_batch: int) -> list[slice]:
        """The rows of a global batch each process of the cell computes on, in rank order."""
        ...

    def warm_up(self, step: Callable[[], object], settings: Any, counters: Callable[[], dict[str, int]]) -> list[float]:
        """The warm-up calls' seconds."""
        ...

    def synchronise(self, backend: Backend) -> None:
        """Before the compile counters' window and before every timed block or epoch."""
        ...

    def together(self, backend: Backend) -> Callable[[], None] | None:
        """What the cell's processes call to start an epoch together (None: one process)."""
        ...

    def measure(self, cell: Cell, backend: Backend, step: Callable[[], object]) -> timer.TimingResult:
        """After warm-up: the timed window, or the profiler's calls."""
        ...

    def after_steps(self, cell: Cell, backend: Backend, description: ModelDescription) -> None:
        """After a training cell's timed steps."""
        ...


class Cell:
    """The job's cell in this worker: reports each stage on ``channel`` as it enters it and builds ``result``
    (the worker's result message: stored fields, the rest ``details``; ``stage_seconds`` by stage). An
    interleaved job's commands arrive on ``commands`` (the worker's stdin)."""

    def __init__(
        self, job: Job, channel: IO[str], commands: IO[str] | None = None, pin_to: Sequence[int] | None = None
    ) -> None:
        """``pin_to``: the cell's CPUs, for a worker that started on others (:meth:`pin_threads`)."""
        self.job = job
        self.channel = channel
        self.commands = commands
        self._pin_to = None if pin_to is None else tuple(pin_to)
        self.backend: Backend | None = None  # once created: failure() asks it whether an error is an OOM
        self.result: dict[str, Any] = {"stage_seconds": {}}
        self._stage_started = time.perf_counter()
        self._stage = "start"
        self._launcher: Launcher | None = None
        # a phase whose one call is a block (phase generate: one whole generation): the interleaved calibration
        # answers from the last warm-up call instead of calling again (time_calls' ``one_call_per_block``)
        self._one_call_per_block = False
        # The weights a job without a weights file builds with, by (model, seed): the phase's (Phase.seeded_weights).
        self.seeded_weights: Callable[[ModelDescription, int], dict[str, np.ndarray]] = seeded_canonical_weights

    @property
    def launcher(self) -> Launcher:
        """How this process carries out the phase (one process, a rank of a --procs cell, profiled;
        :func:`fwbench.runner.launchers.launcher_for`): set by the worker inside its guard, so a malformed rank
        environment is this cell's error."""
        if self._launcher is None:
            raise RuntimeError("the cell has no launcher yet (the worker sets one: fwbench.runner.launchers)")
        return self._launcher

    @launcher.setter
    def launcher(self, launcher: Launcher) -> None:
        self._launcher = launcher

    def pin_threads(self) -> None:
        """A worker started beside others: move every thread to the cell's CPUs (once). Called right after the
        framework's import, before it is configured or makes its thread pools; entering any stage after
        ``import`` calls it too, so no phase can build or time anything off the cell's CPUs."""
        if self._pin_to is not None:
            environment.pin_every_thread(self._pin_to)
            self._pin_to = None

    def stage(self, name: str) -> None:
        """Enter stage ``name`` (messages.STAGES): the one left gets its seconds, the manager hears of it."""
        if name not in ("start", "import"):
            self.pin_threads()
        now = time.perf_counter()
        self.result["stage_seconds"][self._stage] = now - self._stage_started
        self._stage, self._stage_started = name, now
        self.channel.write(stage_message(name))
        self.channel.flush()

    def send(self, kind: str, **fields: object) -> None:
        """Write one message of ``kind`` (ready, block) to the manager."""
        self.channel.write(message(kind, **fields))
        self.channel.flush()

    def await_command(self) -> dict[str, Any]:
        """The manager's next command (interleaved jobs), blocking on ``commands``; raises when the stream ends."""
        assert self.commands is not None, "an interleaved job needs its command stream"
        line = self.commands.readline()
        if not line:
            raise RuntimeError("the manager's command stream ended before finish")
        command: dict[str, Any] = json.loads(line)
        return command

    # -- shared stages ------------------------------------------------------------------------------
    def build_backend(self, description: ModelDescription) -> Backend:
        """Stages import and build: the case's backend, created for its dtype and phase, with the thread budget
        and matmul precision applied, the model built from the job's weights."""
        case = self.job.case
        self.stage("import")
        from fwbench.frameworks import import_runtime

        import_runtime(case.runtime)
        self.pin_threads()
        self.backend, threads, precision = self._configured_backend()
        backend = self.backend
        self.result["threads_effective"], self.result["matmul_precision"] = threads, precision
        if case.dtype == "bf16" and case.device == "cpu":  # what bf16 speed means on this machine
            self.result["cpu_bf16_units"] = environment.cpu_bf16_units()
        if case.dtype == "int8" and case.device == "cpu":  # and int8's
            self.result["cpu_int8_units"] = environment.cpu_int8_units()
        self.result["versions"] = backend.versions()

        self.stage("build")
        weights = self.weights(description)
        backend.build(description, weights)
        del weights  # the framework holds its own copy; the canonical arrays must not sit in the peak
        if backend.layout is not None:
            self.result["layout"] = backend.layout
        return backend

    def _configured_backend(self) -> tuple[Backend, dict[str, Any], dict[str, object]]:
        """A new backend of the case (its framework imported) with the thread budget and matmul precision applied,
        and the framework's reports of both."""
        from fwbench.frameworks import create_backend

        case, settings = self.job.case, self.job.settings
        backend = create_backend(case.runtime, case.device, settings, dtype=case.dtype, phase=case.phase)
        return (
            backend,
            backend.configure_threads(settings.threads, settings.interop_threads),
            backend.configure_precision(),
        )

    def another_backend(self, description: ModelDescription) -> Backend:
        """One more backend of the case, configured and built like :meth:`build_backend`'s (after it, in its
        process; no stage, nothing recorded): phase serving's backend for another compiled batch size."""
        backend, _, _ = self._configured_backend()
        backend.build(description, self.weights(description))
        return backend

    def record_precision(self, backend: Backend, inputs: Sequence[Any]) -> None:
        """``result["precision"]``: the case's policy and what the framework's graph of the forward on ``inputs``
        shows (backend.observe_precision; ``observed`` None where the runtime cannot be looked into, ``error`` when
        looking failed), with the op classes that break the policy (fwbench.precision). A runtime whose graph
        breaks the policy computes something else than the others: the cell becomes ``mismatch``."""
        dtype = self.job.case.dtype
        check = PrecisionCheck(policy=dtype)
        self.result["precision"] = check.to_dict()
        try:
            observed = backend.observe_precision(inputs)
        except Exception as exc:  # looking is a check, not the measurement: say why it failed, keep the cell
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            self.result["precision"] = dataclasses.replace(check, error=f"{type(exc).__name__}: {first}").to_dict()
            return
        if observed is None:
            return
        mismatches = tuple(policy_mismatches(dtype, observed))
        seen = {op: tuple(dtypes) for op, dtypes in observed.items()}
        check = dataclasses.replace(check, observable=True, observed=seen, mismatches=mismatches)
        self.result["precision"] = check.to_dict()
        if mismatches and self.result.get("status") != "mismatch":
            self.fail_check(f"computes off the {dtype} policy: " + "; ".join(mismatches))

    def time_calls(
        self,
        backend: Backend,
        step: Callable[[], object],
        first_call_s: float | None = None,
        *,
        one_call_per_block: bool = False,
    ) -> tuple[int, timer.TimingResult]:
        """Stages first_call, warmup and timing of ``step`` (one synchronised call) as the job's launcher carries
        them out (:mod:`fwbench.runner.launchers`: the timed window of :meth:`timed_window`, or the profiler's
        calls), recorded in ``result``; returns the number of warm-up calls and the timing (seconds per call).
        ``first_call_s``: the seconds of a first call the phase made itself (phase generate's kept generation),
        recorded instead of calling ``step`` once more. ``one_call_per_block``: a call is a block whatever it lasts
        (phase generate: one whole generation, seconds long), so the interleaved calibration does not call ``step``:
        it reports one call per block and the last warm-up call's seconds."""
        self._one_call_per_block = one_call_per_block
        settings = self.job.settings
        if first_call_s is None:
            self.stage("first_call")
            first_call_s = timer.time_first_call(step)
        self.result["first_call_s"] = first_call_s

        self.stage("warmup")
        warmup_s = self.launcher.warm_up(step, settings, backend.compile_counters)
        self.result["warmup_calls"] = len(warmup_s)
        self.result["warmup_call_s"] = warmup_s
        return len(warmup_s), self.launcher.measure(self, backend, step)

    def timed_window(self, backend: Backend, step: Callable[[], object]) -> timer.TimingResult:
        """Stage timing after warm-up: the timed samples of ``step`` (the manager's blocks when interleaved, else
        the job's protocol), recorded in ``result`` with the memory peaks and compile health around them and status
        ``ok``; returns the timing."""
        settings = self.job.settings
        self.launcher.synchronise(backend)  # before the counters' window: a barrier's first call may compile
        counters_before = backend.compile_counters()

        self.stage("timing")
        self.result["loadavg_before_timing"] = os.getloadavg()  # other work on the machine skews timings
        self.result["rss_before_timing_bytes"] = memory.rss_bytes()
        self.result["peak_memory_before_timing_bytes"] = memory.peak_rss_bytes()
        self.result["peak_memory_scope"] = "timed" if memory.reset_peak_rss() else "process"
        backend.reset_peak_memory()
        if self.job.interleaved:
            timing = self.serve_blocks(step, backend)  # the manager reads the machine's counters around the round
        else:
            totals = noise.NoiseTotals()
            wall_origin = time.time()
            before = noise.read(time.perf_counter())
            if settings.protocol == "hf2019":
                timing = timer.run_hf2019(step)
            else:
                timing = timer.run_adaptive(step, settings.max_time_s, settings.target_rel_ci, settings.min_block_s)
            totals.add(before, noise.read(time.perf_counter()))
            self.result["block_starts_unix_s"] = [wall_origin + start for start in timing.starts_s]
            self.result["noise"] = totals.to_dict()
        self.result["peak_memory_bytes"] = memory.peak_rss_bytes()
        self.result["compile_health"] = compile_health(counters_before, backend.compile_counters())
        self.result.update(backend.memory_stats())
        self.result.update(
            status="ok",
            samples_s=timing.samples_s,
            calls_per_sample=timing.calls_per_sample,
            stop_reason=timing.stop_reason,
            timing_elapsed_s=timing.elapsed_s,
        )
        return timing

    def profile_calls(self, backend: Backend, step: Callable[[], object], directory: Path) -> timer.TimingResult:
        """``fwbench profile``, after warm-up: ``job.profile_calls`` calls timed one by one without the profiler,
        then as many under the framework's profiler (Backend.profile), its raw trace kept in ``directory``.
        ``result["profile"]``: what the profiler reported and both sets of call times (seconds), whose medians
        give the profiler's own overhead. The result has no benchmark samples; the returned timing counts the
        calls made (training's step accounting)."""
        calls = self.job.profile_calls
        self.stage("timing")
        started = time.perf_counter()
        unprofiled_s = [timer.time_first_call(step) for _ in range(calls)]
        profiled_s: list[float] = []

        def timed_step() -> object:
            start = time.perf_counter()
            value = step()
            profiled_s.append(time.perf_counter() - start)
            return value

        self.stage("profile")
        directory.mkdir(parents=True, exist_ok=True)
        report = backend.profile(timed_step, calls, directory)
        self.result["profile"] = {
            **report,
            "calls": calls,
            "unprofiled_call_s": unprofiled_s,
            "profiled_call_s": profiled_s,
        }
        self.result.update(status="ok", samples_s=[], stop_reason="profiled")
        return timer.TimingResult(
            samples_s=unprofiled_s + profiled_s,
            calls_per_sample=1,
            stop_reason="profiled",
            elapsed_s=time.perf_counter() - started,
        )

    def serve_blocks(self, step: Callable[[], object], backend: Backend) -> timer.TimingResult:
        """Interleaved timing: say ``ready``, then serve the manager's commands until ``finish``: ``calibrate`` →
        the calls per block (``hf2019``: 3) → ``calibrated``; ``block`` → one timed block → ``block``."""
        settings = self.job.settings
        timed = timeit.Timer(step)
        number = timer.HF2019_NUMBER
        self.send("ready", peak_memory_bytes=memory.peak_rss_bytes())
        assert self.commands is not None, "an interleaved job needs its command stream"
        started: float | None = None  # from the calibration, else (a later round: no calibration) the first block
        samples: list[float] = []
        for line in self.commands:
            command = json.loads(line)
            if command["command"] == "finish":
                break
            if command["command"] == "calibrate":  # alone on the machine: the others wait for their turn
                if settings.protocol == "hf2019":
                    block_s = timed.timeit(number)
                elif self._one_call_per_block and self.result.get("warmup_call_s"):
                    number, block_s = 1, float(self.result["warmup_call_s"][-1])
                else:
                    budget = self.job.budget_s or settings.max_time_s
                    number, block_s = timer.calibrate_block(timed, settings.min_block_s, budget)
                self.send("calibrated", calls_per_block=number, block_s=block_s)
                started = time.perf_counter()
                continue
            calls = int(command.get("calls") or number)
            if started is None:
                started = time.perf_counter()
            self.launcher.synchronise(backend)  # a rank set's ranks start the block together (untimed)
            start_unix = time.time()
            seconds = timed.timeit(calls)
            if not command.get("calibration"):  # a rank set's calibration blocks are not samples
                samples.append(seconds / calls)
                number = calls  # a rank set chose the calls per block itself (the calibration above is not run)
            self.send("block", seconds=seconds, calls=calls, start_unix_s=start_unix)
        return timer.TimingResult(
            samples_s=samples,
            calls_per_sample=number,
            stop_reason="interleaved",
            elapsed_s=0.0 if started is None else time.perf_counter() - started,
        )

    def record_compile_report(self, backend: Backend) -> None:
        """Store the backend's account of its ahead-of-time compile (``compile_report``), if it has one."""
        report = backend.compile_report()
        if report:
            self.result["compile_report"] = report

    def fail_check(self, reason: str) -> None:
        """Turn the cell into ``mismatch``: a runtime that computes something else is never timed."""
        self.result.update(status="mismatch", reason=reason, samples_s=[])

    def weights(self, description: ModelDescription) -> dict[str, np.ndarray]:
        """The job's weights: the file it names, else the seeded canonical set."""
        if self.job.weights_path is not None:
            return load_weights(description, Path(self.job.weights_path))
        return self.seeded_weights(description, self.job.settings.seed)

    def failure(self, exc: BaseException) -> dict[str, Any]:
        """The result for a cell that raised: ``oom`` for allocation failures, else ``error``; a write that found
        no room (an export, a trace, a cache) also reports ``disk_full`` (its cause and path), so the manager stops
        and says so instead of failing every cell after it."""
        is_oom = isinstance(exc, MemoryError) or (self.backend is not None and self.backend.is_oom(exc))
        lines = [line for line in str(exc).strip().splitlines() if line.strip()]
        detail = lines[-1] if lines else ""
        self.result.update(
            status="oom" if is_oom else "error",
            reason=f"{type(exc).__name__} during {self._stage}: {detail}".rstrip(": "),
            traceback="".join(traceback.format_exception(exc)),
        )
        full = disk_full_report(exc)
        if full is not None:
            self.result["disk_full"] = full
        return self.result
