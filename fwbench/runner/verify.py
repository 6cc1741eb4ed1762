"""``fwbench verify``: build each model in each runtime with the same weights and inputs, compare outputs.

Each runtime runs in its own worker (this module imports no framework) and writes its outputs to an
.npz file. Every output is compared with the model's float64 numpy reference and, for information, with the
first runtime's: relative L2 error ‖a − b‖ / ‖b‖ and max absolute error. A runtime passes when every relative L2
error against the reference is within ``parity_tolerance(model, dtype)`` (1e-4 for fp32; bf16 per model, from the
reference policy's measured error, tolerances.BF16_PARITY_LIMIT; every framework applies the one
mixed-precision policy of fwbench.precision). The error against the first runtime is not judged (a defect in
the first runtime would otherwise fail every runtime after it): it is judged only for a model without a reference.

``--phase training`` (:func:`verify_training`) takes N optimizer steps in each runtime from the same weights
on the same fixed batch and compares the loss curve and the trained parameters with the first runtime's,
within ``TRAINING_TOLERANCE[dtype]`` (fwbench/runner/tolerances.py, where the values are justified). That
comparison is pairwise by necessity (there is no float64 reference for N optimizer steps), so a trusted runtime
goes first.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file

from fwbench.frameworks import get_runtime, missing_implementation, missing_requirement
from fwbench.models import get_model
from fwbench.models.base import ModelDescription
from fwbench.models.weights_io import load_weights
from fwbench.runner.manager import run_worker
from fwbench.runner.phases import get_phase
from fwbench.runner.phases.inference import divergence_note
from fwbench.runner.tolerances import TRAINING_TOLERANCE, TrainingTolerance, parity_tolerance, relative_errors
from fwbench.spec import Case, Dtype, Settings


@dataclass(frozen=True)
class OutputCheck:
    """One output of one runtime, against the float64 reference (the verdict) and the first runtime (information;
    the verdict only for a model without a reference)."""

    model: str
    runtime: str
    status: str
    reason: str | None = None
    output: str | None = None
    shape: tuple[int, ...] | None = None
    rel_l2_vs_first: float | None = None
    max_abs_vs_first: float | None = None
    rel_l2_vs_reference: float | None = None
    max_abs_vs_reference: float | None = None
    tolerance: float | None = None
    # Where the runtime's outputs start to differ from the reference, found by its worker when they do (one line,
    # fwbench.runner.phases.inference.divergence_note); None when they are within the tolerance.
    divergence: str | None = None

    @property
    def judged_rel_l2(self) -> float | None:
        """The error the verdict judges: against the float64 reference, so that a runtime's verdict does not depend
        on the order of the runtimes; against the first runtime only where the model has no reference."""
        return self.rel_l2_vs_first if self.rel_l2_vs_reference is None else self.rel_l2_vs_reference

    @property
    def passed(self) -> bool:
        if self.status == "skipped":
            return True
        if self.status != "ok" or self.tolerance is None:
            return False
        error = self.judged_rel_l2
        return error is None or error <= self.tolerance


@dataclass(frozen=True)
class WorkerArrays:
    """What one runtime's ``verify`` worker gave: its status (``skipped`` with the reason when it cannot run the
    case), every array it saved by name (outputs; with checkpoints also ``checkpoint/<name>``, ``tapped/<name>``),
    its result details and the .npz path (in the caller's scratch folder)."""

    status: str
    reason: str | None
    arrays: dict[str, np.ndarray]
    details: dict[str, Any]
    path: Path | None = None


def case_refusal(case: Case, settings: Settings) -> str | None:
    """Why ``case`` cannot run here (its runtime not installed or without the model's architecture, the phase's
    refusal of the runtime, the dtype or the model), None when it can; nothing is imported."""
    info, phase, description = get_runtime(case.runtime), get_phase(case.phase), get_model(case.model)
    return (
        missing_requirement(info)
        or missing_implementation(info, description.arch)
        or phase.runtime_refusal(info, case.dtype, settings)
        or phase.dtype_unsupported(case.dtype)
        or phase.unsupported(description, info, settings)
    )


def verify_shape(description: ModelDescription, batch_size: int | None, seq_len: int | None) -> tuple[int, int | None]:
    """(batch, seq) a verify or diff runs at: the given sizes, else the model's parity shape (seq None for a model
    without a sequence axis)."""
    default_batch, default_seq = description.parity_shape()
    return batch_size or default_batch, (seq_len or default_seq) if description.has_sequence else None


def verify_weights(description: ModelDescription, weights_path: Path | None, seed: int) -> dict[str, np.ndarray]:
    """The weights every runtime of a verify or diff loads: the file's, else the seeded canonical ones."""
    return load_weights(description, weights_path) if weights_path else description.canonical_weights(seed)


def verify_arrays(
    case: Case, settings: Settings, weights_path: Path | None, scratch: Path, *, checkpoints: bool = False
) -> WorkerArrays:
    """One verify worker of ``case`` (nothing timed) unless it is refused (``skipped``, :func:`case_refusal`), its
    .npz written under ``scratch``; ``checkpoints``: with the model's checkpoints (inference) or its first step's
    gradients (training) (fwbench diff)."""
    missing = case_refusal(case, settings)
    if missing:
        return WorkerArrays("skipped", missing, {}, {})
    return worker_arrays(case, settings, weights_path, scratch, checkpoints=checkpoints)


def worker_arrays(
    case: Case,
    settings: Settings,
    weights_path: Path | None,
    scratch: Path,
    *,
    checkpoints: bool = False,
    train_steps: int = 20,
) -> WorkerArrays:
    """One verify worker of ``case``, refusals already asked: its arrays from ``scratch/<phase>_<runtime>[_pN].npz``;
    a training case takes ``train_steps`` steps."""
    procs = "" if case.procs is None else f"_p{case.procs}"
    out_path = scratch / f"{case.phase}_{case.runtime.replace(':', '_')}{procs}.npz"
    external = bool(get_runtime(case.runtime).external)  # a worker in another language writes safetensors
    written = out_path.with_suffix(".safetensors") if external else out_path
    outcome = run_worker(
        case,
        settings,
        check_parity=False,
        verify_output=str(written),
        weights_path=str(weights_path) if weights_path else None,
        train_steps=train_steps,
        checkpoints=checkpoints,
    )
    if outcome.status != "ok":
        return WorkerArrays(outcome.status, outcome.reason, {}, outcome.details)
    if external:  # kept as .npz like every runtime's, for --dump
        arrays: dict[str, Any] = load_file(str(written))
        np.savez(out_path, **arrays)
        written.unlink()
    else:
        with np.load(out_path) as data:
            arrays = {name: data[name] for name in data.files}
    return WorkerArrays("ok", None, arrays, outcome.details, out_path)


def verify_model(
    model: str,
    runtimes: Sequence[str],
    settings: Settings,
    batch_size: int | None = None,
    seq_len: int | None = None,
    weights_path: Path | None = None,
    dump_dir: Path | None = None,
    *,
    dtype: Dtype = "fp32",
) -> list[OutputCheck]:
    """Checks of every output of ``model`` in each runtime, each computing in ``dtype``: against the float64
    reference (the verdict) and the first runtime (information, :attr:`OutputCheck.judged_rel_l2`)."""
    description = get_model(model)
    batch, seq = verify_shape(description, batch_size, seq_len)
    weights = verify_weights(description, weights_path, settings.seed)
    arrays = description.make_inputs(batch, seq, settings.seed)
    reference = description.reference_forward(weights, arrays)
    del weights
    if dump_dir is not None:
        (dump_dir / model).mkdir(parents=True, exist_ok=True)
        saved_inputs: dict[str, Any] = arrays
        np.savez(dump_dir / model / "inputs.npz", **saved_inputs)
    checks: list[OutputCheck] = []
    first: dict[str, np.ndarray] | None = None
    with tempfile.TemporaryDirectory(prefix="fwbench-verify-") as scratch:
        for runtime in runtimes:
            case = Case(model, runtime, batch_size=batch, seq_len=seq, dtype=dtype)
            got = verify_arrays(case, settings, weights_path, Path(scratch))
            if got.status != "ok" or got.path is None:
                checks.append(OutputCheck(model, runtime, got.status, got.reason))
                continue
            outputs = got.arrays
            divergence = divergence_note(got.details["divergence"]) if "divergence" in got.details else None
            if dump_dir is not None:
                shutil.copyfile(got.path, dump_dir / model / f"{runtime.replace(':', '_')}.npz")
            if first is None:
                first = outputs
            for name in description.output_names:
                if name not in outputs:
                    checks.append(OutputCheck(model, runtime, "mismatch", f"output {name} missing", name))
                    continue
                no_check: tuple[None, None] = (None, None)
                vs_first = relative_errors(outputs[name], first[name]) if name in first else no_check
                vs_reference = relative_errors(outputs[name], reference[name]) if reference is not None else no_check
                checks.append(
                    OutputCheck(
                        model,
                        runtime,
                        "ok",
                        None,
                        name,
                        tuple(outputs[name].shape),
                        vs_first[0],
                        vs_first[1],
                        vs_reference[0],
                        vs_reference[1],
                        parity_tolerance(model, dtype),
                        divergence,
                    )
                )
    return checks


@dataclass(frozen=True)
class TrainingCheck:
    """One runtime's ``steps`` training steps against the first runtime's (``fwbench verify --phase training``).

    ``loss_rel``: max over steps of |loss − first's loss| / |first's loss|; ``params_rel_l2``: ‖Δ‖ / ‖first‖
    over the concatenation of every trained parameter; ``worst_tensor``/``worst_tensor_rel_l2``: the single
    parameter with the largest relative L2 error. ``losses``: this runtime's loss per step."""

    model: str
    runtime: str
    status: str
    reason: str | None = None
    steps: int = 0
    losses: tuple[float, ...] = ()
    loss_rel: float | None = None
    params_rel_l2: float | None = None
    worst_tensor: str | None = None
    worst_tensor_rel_l2: float | None = None
    tolerance: TrainingTolerance | None = None
    procs: int | None = None  # verify --procs: the processes that took the steps (None: one, not distributed)
    against: str | None = None  # what it was compared with (None: the first runtime's run)

    @property
    def passed(self) -> bool:
        if self.status == "skipped":
            return True
        if self.status != "ok" or self.tolerance is None:
            return False
        limits = (
            (self.loss_rel, self.tolerance.loss_rel),
            (self.params_rel_l2, self.tolerance.params_rel_l2),
            (self.worst_tensor_rel_l2, self.tolerance.tensor_rel_l2),
        )
        return all(value is None or value <= limit for value, limit in limits)

    def failure(self) -> str | None:
        """Why the check failed, in one line (None when it passed)."""
        if self.passed:
            return None
        if self.status != "ok" or self.tolerance is None:
            return self.reason or self.status
        parts = []
        if self.loss_rel is not None and self.loss_rel > self.tolerance.loss_rel:
            parts.append(f"loss curve max relative error {self.loss_rel:.3g} > {self.tolerance.loss_rel:g}")
        if self.params_rel_l2 is not None and self.params_rel_l2 > self.tolerance.params_rel_l2:
            parts.append(f"trained parameters relative L2 {self.params_rel_l2:.3g} > {self.tolerance.params_rel_l2:g}")
        if self.worst_tensor_rel_l2 is not None and self.worst_tensor_rel_l2 > self.tolerance.tensor_rel_l2:
            parts.append(
                f"{self.worst_tensor} relative L2 {self.worst_tensor_rel_l2:.3g} > {self.tolerance.tensor_rel_l2:g}"
            )
        return "; ".join(parts)


def compare_training(
    losses: np.ndarray, params: dict[str, np.ndarray], first_losses: np.ndarray, first_params: dict[str, np.ndarray]
) -> tuple[float, float, str | None, float]:
    """(loss-curve max relative error, relative L2 of all parameters, worst tensor, its relative L2), float64."""
    if losses.shape != first_losses.shape or set(params) != set(first_params):
        return float("inf"), float("inf"), None, float("inf")
    with np.errstate(divide="ignore", invalid="ignore"):
        loss_rel = float(np.max(np.abs(losses - first_losses) / np.maximum(np.abs(first_losses), 1e-12), initial=0.0))
    names = sorted(first_params)
    got = np.concatenate([params[n].astype(np.float64).ravel() for n in names])
    expected = np.concatenate([first_params[n].astype(np.float64).ravel() for n in names])
    all_rel = relative_errors(got, expected)[0] if got.size else 0.0
    per_tensor = {n: relative_errors(params[n], first_params[n])[0] for n in names}
    worst = max(per_tensor, key=lambda n: per_tensor[n], default=None)
    loss_rel = loss_rel if np.isfinite(losses).all() else float("inf")
    return loss_rel, all_rel, worst, (per_tensor[worst] if worst is not None else 0.0)


TrainedRun = tuple[np.ndarray, dict[str, np.ndarray]]  # one training run's losses and trained parameters by name


def verify_training(
    model: str,
    runtimes: Sequence[str],
    settings: Settings,
    steps: int,
    batch_size: int | None = None,
    seq_len: int | None = None,
    weights_path: Path | None = None,
    dump_dir: Path | None = None,
    *,
    dtype: Dtype = "fp32",
    procs: int | None = None,
) -> list[TrainingCheck]:
    """``steps`` optimizer steps (``settings.optimizer``) of ``model`` in each runtime from the same weights
    on the same fixed batch; each runtime's loss curve and trained parameters against the first runtime's.

    With ``procs`` (data-parallel runtimes, ``verify --procs N``): each runtime takes the steps as 1 process on the
    global batch (compared with the first runtime's 1-process run) and as ``procs`` processes, each on its rows of
    the same global batch (strong scaling), compared with its own 1-process run: the distributed step must be the
    1-process step. Resnet is skipped there (batch norm's statistics are each process's own)."""
    description = get_model(model)
    unsupported = description.training_unsupported()
    if unsupported:
        return [TrainingCheck(model, runtime, "skipped", unsupported) for runtime in runtimes]
    batch, seq = verify_shape(description, batch_size, seq_len)
    tolerance = TRAINING_TOLERANCE[dtype]
    checks: list[TrainingCheck] = []
    first: TrainedRun | None = None
    single: dict[str, TrainedRun] = {}  # --procs: each runtime's 1-process run
    runs = [(runtime, count) for runtime in runtimes for count in ((None,) if procs is None else (1, procs))]
    with tempfile.TemporaryDirectory(prefix="fwbench-verify-") as scratch:
        for runtime, count in runs:
            case = Case(
                model, runtime, phase="training", batch_size=batch, seq_len=seq, dtype=dtype,
                procs=count, scaling=None if count is None else "strong",
            )  # fmt: skip
            missing = _training_refusal(case, settings, description, runtime in single)
            if missing:
                checks.append(TrainingCheck(model, runtime, "skipped", missing, procs=count))
                continue
            got = worker_arrays(case, settings, weights_path, Path(scratch), train_steps=steps)
            if got.status != "ok" or got.path is None:
                checks.append(TrainingCheck(model, runtime, got.status, got.reason, steps, procs=count))
                continue
            trained = _trained_run(got, dump_dir / model if dump_dir is not None else None)
            against = None
            if count is not None and count > 1:
                base, against = single[runtime], f"{runtime} in 1 process"
            else:
                first = trained if first is None else first
                base = first
                if count == 1:
                    single[runtime] = trained
            checks.append(_training_check(model, runtime, steps, tolerance, trained, base, count, against))
    return checks


def _training_refusal(case: Case, settings: Settings, description: ModelDescription, single_ok: bool) -> str | None:
    """Why the training ``case`` is skipped (None when it runs): :func:`case_refusal`; for a run of N > 1 processes
    also a model whose N-process step is not the 1-process step, or (not ``single_ok``) a runtime whose 1-process
    run did not end ok."""
    missing = case_refusal(case, settings)
    if missing is None and case.procs is not None and case.procs > 1:
        global_batch_norm = get_runtime(case.runtime).global_batch_norm
        missing = None if global_batch_norm else distributed_parity_unsupported(description)
        if missing is None and not single_ok:
            missing = "its 1-process run did not end ok"
    return missing


def _trained_run(got: WorkerArrays, dump_folder: Path | None) -> TrainedRun:
    """The losses and trained parameters (``param/<name>`` without the prefix) of a training worker that ended ok;
    its .npz copied into ``dump_folder`` (``verify --dump``) when given."""
    assert got.path is not None, "a training worker that ended ok wrote its arrays"
    params = {name[len("param/") :]: a for name, a in got.arrays.items() if name.startswith("param/")}
    if dump_folder is not None:
        dump_folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(got.path, dump_folder / got.path.name)  # training_<framework>_<mode>[_pN].npz
    return got.arrays["losses"], params


def _training_check(
    model: str,
    runtime: str,
    steps: int,
    tolerance: TrainingTolerance,
    trained: TrainedRun,
    base: TrainedRun,
    procs: int | None,
    against: str | None,
) -> TrainingCheck:
    """The ``ok`` check of one training run against ``base`` (the first runtime's run, or ``against``)."""
    losses, params = trained
    loss_rel, params_rel, worst, worst_rel = compare_training(losses, params, *base)
    return TrainingCheck(
        model,
        runtime,
        "ok",
        None,
        steps,
        tuple(float(x) for x in losses),
        loss_rel,
        params_rel,
        worst,
        worst_rel,
        tolerance,
        procs=procs,
        against=against,
    )


def distributed_parity_unsupported(description: ModelDescription) -> str | None:
    """Why N processes cannot take ``description``'s 1-process step exactly (None when they can): batch norm
    normalises with each process's own batch statistics (synchronised batch norm is GPU-only in torch)."""
    if description.running_statistics():
        return (
            f"{description.name}'s batch norm uses each process's batch statistics (torch's SyncBatchNorm runs on GPUs "
            "only), so N processes do not take the 1-process step; its distributed cells are timed, not checked"
        )
    return None
