"""One cell, run inside a worker: build → compile → first call → parity → warm-up → timed samples.

Phase training times ``backend.make_train_step`` (one optimizer step per call) through the same first
call, warm-up and timed loop; its parity check is the first step's loss against the float64 reference.

Imported by the worker only after its CPU affinity and thread environment are in place, because
importing numpy starts BLAS threads that inherit whatever affinity the process has then.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
import traceback
from pathlib import Path
from typing import IO, Any, Callable

import numpy as np

from fwbench.measure import memory, timer
from fwbench.models import get_model
from fwbench.models.weights_io import load_weights
from fwbench.runner.protocol import PARITY_REL_L2_TOLERANCE, Job, stage_message
from fwbench.spec import FIT_DTYPES, RUNNABLE_DTYPES, RUNNABLE_PHASES, TRAINING_DTYPES


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


def compile_health(before: dict[str, int], after: dict[str, int]) -> dict[str, Any]:
    """Compile-health counters around the timed loop (read just before and just after it) and the
    flags a report shows: any counter that grew during the loop means it recompiled or retraced."""
    during = {key: after[key] - before.get(key, 0) for key in after}
    flags = [f"{key.replace('_', ' ')} +{n} in timed loop" for key, n in during.items() if n > 0]
    flags += [f"{key.replace('_', ' ')} {after[key]}" for key in ("graph_breaks", "eager_fallbacks")
              if after.get(key, 0) > 0 and during.get(key, 0) == 0]
    return {"after_warmup": before, "after_timing": after, "during_timing": during,
            "recompiled_in_timed_loop": any(n > 0 for n in during.values()), "flags": flags}


def recording(step: Callable[[], object], losses: list[object]) -> Callable[[], object]:
    """``step`` that also appends what it returned (a training step's loss, not read: no sync, no float
    conversion) to ``losses``; the timed window gains one call and one list append per step."""
    append = losses.append

    def recorded() -> object:
        loss = step()
        append(loss)
        return loss

    return recorded


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
        training = case.phase == "training"
        dtypes = {"training": TRAINING_DTYPES, "fit": FIT_DTYPES}.get(case.phase, RUNNABLE_DTYPES)
        if case.phase not in RUNNABLE_PHASES or case.dtype not in dtypes:
            raise NotImplementedError(f"phase {case.phase} with dtype {case.dtype} is not implemented yet")
        description = get_model(case.model)
        if training and description.training_unsupported():
            raise NotImplementedError(description.training_unsupported())
        if case.phase == "fit" and description.fit_unsupported():
            raise NotImplementedError(description.fit_unsupported())
        self.stage("import")
        from fwbench.frameworks import create_backend

        self.backend = backend = create_backend(case.runtime, case.device, settings, dtype=case.dtype)
        backend.phase = case.phase  # before build: bf16 training keeps float32 master weights
        self.result["threads_effective"] = backend.configure_threads(settings.threads, settings.interop_threads)
        self.result["matmul_precision"] = backend.configure_precision()
        self.result["versions"] = backend.versions()

        self.stage("build")
        weights = self.weights(description)
        arrays = description.make_inputs(case.batch_size, case.seq_len, settings.seed)
        backend.build(description, weights)
        del weights  # the framework holds its own copy; the canonical arrays must not sit in the peak
        if backend.layout is not None:
            self.result["layout"] = backend.layout
        if case.phase == "fit":
            return self.run_fit(description)
        inputs = backend.make_inputs(arrays)

        if self.job.verify_output is not None:
            return self.write_training(description, inputs) if training else self.write_outputs(inputs)

        self.stage("compile")
        if training:
            targets = description.make_targets(case.batch_size, case.seq_len, settings.seed)
            step = backend.make_train_step(inputs, backend.make_targets(targets))
        else:
            backend.compile(inputs)
            self.record_compile_report()
            step = backend.make_step(inputs)

        self.stage("first_call")
        losses: list[object] = []  # training: every step's returned loss object, read after timing
        untimed_step = step  # loss_after's extra step is not recorded
        if training:
            step = recording(step, losses)
        self.result["first_call_s"] = timer.time_first_call(step)

        self.stage("warmup")
        warmup_s = timer.warm_up(step, settings.warmup_calls, settings.max_time_s, backend.compile_counters)
        self.result["warmup_calls"] = len(warmup_s)
        self.result["warmup_call_s"] = warmup_s
        counters_before = backend.compile_counters()

        self.stage("timing")
        self.result["loadavg_before_timing"] = os.getloadavg()  # other work on the machine skews timings
        self.result["rss_before_timing_bytes"] = memory.rss_bytes()
        self.result["peak_memory_before_timing_bytes"] = memory.peak_rss_bytes()
        self.result["peak_memory_scope"] = "timed" if memory.reset_peak_rss() else "process"
        backend.reset_peak_memory()
        if settings.protocol == "hf2019":
            timing = timer.run_hf2019(step)
        else:
            timing = timer.run_adaptive(step, settings.max_time_s, settings.target_rel_ci, settings.min_block_s)
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
        if training:
            step_losses = [backend.loss_value(loss) for loss in losses]
            del losses[:]  # the loss objects are not needed any more
            self.record_training(description, arrays, targets, step_losses, len(warmup_s), timing.total_calls,
                                 backend.loss_after(untimed_step))
        elif self.job.check_parity:
            self.check_parity(description)
        self.stage("done")
        return self.result

    def record_training(self, description: Any, arrays: dict[str, np.ndarray], targets: dict[str, np.ndarray],
                        step_losses: list[float], warmup_steps: int, timed_steps: int, final_loss: float) -> None:
        """Training details; with ``check_parity``, the first step's loss (computed before any update)
        against the float64 reference loss at the cell's shape, relative error within the fp32 tolerance.
        A failed check, or a final loss that is not finite, makes the cell ``mismatch``.

        ``step_losses``: the loss of every step the loop ran, in order (first call, warm-up, the adaptive
        timer's calibration calls, timed calls), each computed before that step's update."""
        case, settings = self.job.case, self.job.settings
        from fwbench.models.training import optimizer_spec

        tokens = case.batch_size * case.seq_len if case.seq_len is not None else None
        first_loss = step_losses[0]
        steps_between = warmup_steps + timed_steps
        self.result["training"] = {
            "optimizer": dataclasses.asdict(optimizer_spec(settings.optimizer)),
            "loss": "softmax cross-entropy, mean over the counted positions (fwbench.models.training)",
            "counted_positions": float(targets["label_weights"].sum()),
            "samples_per_step": case.batch_size, "tokens_per_step": tokens,
            "first_loss": first_loss,
            "final_loss": final_loss,  # the loss of one more step after the timed loop
            # first call + warm-up + timed samples; the adaptive timer's calibration calls come on top
            "counted_steps_before_final": 1 + steps_between,
            # one loss per step run before the final one, in order; the parts say which step was which
            "step_losses": step_losses,
            "step_loss_parts": {"first_call": 1, "warmup": warmup_steps,
                                "calibration": len(step_losses) - 1 - steps_between, "timed": timed_steps},
        }
        if self.job.check_parity:
            self.stage("parity")
            reference = description.reference_loss(self.weights(description), arrays, targets)
            if reference is not None:
                tolerance = PARITY_REL_L2_TOLERANCE[case.dtype]
                rel = abs(first_loss - reference) / abs(reference)
                self.result["parity"] = {
                    "ok": rel <= tolerance, "reference": "numpy-float64", "tolerance_rel_l2": tolerance,
                    "checked": "loss of the first step, before any update",
                    "outputs": {"loss": {"rel_l2": rel, "max_abs": abs(first_loss - reference)}},
                    "reference_loss": reference, "shape": [case.batch_size, case.seq_len],
                }
                if rel > tolerance:
                    self.fail_check(f"first-step loss {first_loss:.7g} differs from the reference {reference:.7g}: "
                                    f"relative error {rel:.3g} > {tolerance:g}")
                    return
        if not math.isfinite(final_loss):
            self.fail_check(f"the loss after more than {1 + steps_between} steps is {final_loss}")

    def run_fit(self, description: Any) -> dict[str, Any]:
        """Phase fit: the framework's ``fit.py`` trains ``settings.epochs`` epochs of the seeded dataset
        (fwbench.models.fit). Epoch 1 (tracing and compilation included) is stored as ``first_call_s``,
        epochs 2.. are the samples (one epoch each); ``details.fit`` holds every epoch's seconds and mean
        loss and the final full-dataset loss and accuracy. Agreement across runtimes is checked in reports.
        A final loss that is not finite makes the cell ``mismatch``."""
        import importlib

        from fwbench.models.fit import evaluate, make_fit_dataset

        case, settings = self.job.case, self.job.settings
        dataset = make_fit_dataset(description, settings.fit_samples, settings.seed)
        fit = importlib.import_module(f"fwbench.frameworks.{case.framework}.fit").fit
        self.stage("fit")
        self.result["peak_memory_scope"] = "timed" if memory.reset_peak_rss() else "process"
        self.result["loadavg_before_timing"] = os.getloadavg()
        outcome = fit(self.backend, dataset, settings.epochs, case.batch_size)
        self.result["peak_memory_bytes"] = memory.peak_rss_bytes()
        self.stage("evaluate")
        final = evaluate(outcome.logits, dataset.labels)
        if len(outcome.epoch_s) != settings.epochs or len(outcome.epoch_loss) != settings.epochs:
            raise RuntimeError(f"{case.runtime} fit reported {len(outcome.epoch_s)} epoch times and "
                               f"{len(outcome.epoch_loss)} epoch losses for {settings.epochs} epochs")
        from fwbench.models.training import optimizer_spec

        self.result["fit"] = {
            "loop": outcome.loop, "epochs": settings.epochs, "samples": dataset.size, "batch_size": case.batch_size,
            "steps_per_epoch": dataset.size // case.batch_size, "epoch_s": outcome.epoch_s,
            "epoch_loss": outcome.epoch_loss, "total_s": outcome.total_s, "final_loss": final["loss"],
            "final_accuracy": final["accuracy"], "optimizer": dataclasses.asdict(optimizer_spec(settings.optimizer)),
            "samples_are": "wall seconds of epochs 2.. (epoch 1, compilation included, is first_call_s)",
            **outcome.extra,
        }
        self.result.update(status="ok", first_call_s=outcome.epoch_s[0], samples_s=outcome.epoch_s[1:],
                           calls_per_sample=1, stop_reason="epochs", timing_elapsed_s=sum(outcome.epoch_s[1:]))
        if not math.isfinite(final["loss"]):
            self.fail_check(f"the final loss after {settings.epochs} epochs is {final['loss']}")
        self.stage("done")
        return self.result

    def fail_check(self, reason: str) -> None:
        """Turn the cell into ``mismatch``: a runtime that computes something else is never timed."""
        self.result.update(status="mismatch", reason=reason, samples_s=[])

    def weights(self, description: Any) -> dict[str, np.ndarray]:
        """The job's weights: the file it names, else the seeded canonical set."""
        if self.job.weights_path is not None:
            return load_weights(description, Path(self.job.weights_path))
        return description.canonical_weights(self.job.settings.seed)

    def record_compile_report(self) -> None:
        """Store the backend's account of its ahead-of-time compile (``compile_report``), if it has one."""
        report = self.backend.compile_report()
        if report:
            self.result["compile_report"] = report

    def write_outputs(self, inputs: Any) -> dict[str, Any]:
        """``fwbench verify``: one compiled call at the case's shape, outputs saved by name, nothing timed."""
        self.stage("compile")
        self.backend.compile(inputs)
        self.stage("first_call")
        outputs = self.backend.to_numpy(self.backend.infer(inputs))
        assert self.job.verify_output is not None
        np.savez(self.job.verify_output, **outputs)
        self.result["status"] = "ok"
        self.stage("done")
        return self.result

    def write_training(self, description: Any, inputs: Any) -> dict[str, Any]:
        """``fwbench verify --phase training``: ``job.train_steps`` optimizer steps on the case's fixed batch,
        nothing timed; saves ``losses`` (steps,) float64, each step's loss before its update, and every
        trained parameter as ``param/<canonical name>`` (canonical layout, float32)."""
        case, settings = self.job.case, self.job.settings
        self.stage("compile")
        targets = description.make_targets(case.batch_size, case.seq_len, settings.seed)
        step = self.backend.make_train_step(inputs, self.backend.make_targets(targets))
        self.stage("first_call")
        losses = np.array([self.backend.loss_value(step()) for _ in range(self.job.train_steps)], dtype=np.float64)
        parameters = self.backend.trained_parameters()
        assert self.job.verify_output is not None
        np.savez(self.job.verify_output, losses=losses, **{f"param/{k}": v for k, v in parameters.items()})
        self.result["status"] = "ok"
        self.stage("done")
        return self.result

    def check_parity(self, description: Any) -> None:
        """After timing (so first call and samples are untouched): outputs at the description's small
        parity shape against its float64 reference; a failure turns the cell into ``mismatch``."""
        case, settings = self.job.case, self.job.settings
        arrays = description.make_inputs(*description.parity_shape(), settings.seed)
        reference = description.reference_forward(self.weights(description), arrays)
        if reference is None:
            return
        self.stage("parity")
        inputs = self.backend.make_inputs(arrays)
        self.backend.compile(inputs)
        self.record_compile_report()
        check = parity(self.backend.to_numpy(self.backend.infer(inputs)), reference, case.dtype)
        check["shape"] = list(description.parity_shape())
        self.result["parity"] = check
        if not check["ok"]:
            worst = max(check["outputs"].items(), key=lambda item: item[1]["rel_l2"], default=("?", {}))
            self.result["status"] = "mismatch"
            self.result["reason"] = (
                f"outputs differ from the reference: {worst[0]} relative L2 error "
                f"{worst[1].get('rel_l2', float('nan')):.3g} > {check['tolerance_rel_l2']:g}"
            )
            self.result["samples_s"] = []  # a runtime that computes something else is never timed

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
