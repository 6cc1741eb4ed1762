"""Phase training: the timed call is ``backend.make_train_step`` — one optimizer step on a fixed batch (forward,
loss, backward, update) — through the same first call, warm-up and timed loop as inference; its parity check is
the first step's loss against the float64 reference loss at the cell's shape."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fwbench.frameworks import RuntimeInfo, get_runtime
from fwbench.models.base import ModelDescription
from fwbench.models.training import optimizer_spec
from fwbench.runner.cell import Cell, recording
from fwbench.runner.divergence import GRADIENT_KEY
from fwbench.runner.phases.base import Phase
from fwbench.runner.tolerances import PARITY_REL_L2_TOLERANCE, relative_errors
from fwbench.spec import Case, Settings

if TYPE_CHECKING:
    from fwbench.frameworks.base import Backend


def reference_loss(
    cell: Cell, description: ModelDescription, arrays: dict[str, np.ndarray], targets: dict[str, np.ndarray]
) -> float | None:
    """The float64 loss of the first step on the global batch. A distributed cell of a model with batch norm
    normalises each process's rows with their own statistics, so its reference is the processes' losses on their
    rows, weighted by their weight sums (exactly what N processes compute before any update)."""
    case = cell.job.case
    weights = cell.weights(description)
    groups = cell.launcher.row_groups(case.global_batch)
    if len(groups) == 1 or not description.running_statistics() or get_runtime(case.runtime).global_batch_norm:
        return description.reference_loss(weights, arrays, targets)
    total = count = 0.0
    for rows in groups:
        part = {name: array[rows] for name, array in targets.items()}
        loss = description.reference_loss(weights, {name: array[rows] for name, array in arrays.items()}, part)
        if loss is None:
            return None
        weight = float(part["label_weights"].sum())
        total, count = total + loss * weight, count + weight
    return total / count


class Training(Phase):
    """build → compile (the train step) → first call → warm-up → timed samples → loss parity."""

    name = "training"
    starts_together = True
    dtypes = ("fp32", "bf16")  # bf16: fwbench.precision's policy, float32 master weights and update
    distributed = True
    verifiable = True
    profilable = True

    def unsupported(self, description: ModelDescription, info: RuntimeInfo, settings: Settings) -> str | None:
        return description.training_unsupported()

    def flops_per_call(self, description: ModelDescription, case: Case, settings: Settings) -> int | None:
        """One optimizer step on the global batch (:meth:`Phase.step_flops`)."""
        return self.step_flops(description, case)

    def measure(self, cell: Cell, backend: Backend, description: ModelDescription) -> None:
        case, settings = cell.job.case, cell.job.settings
        arrays = description.make_inputs(case.global_batch, case.seq_len, settings.seed)
        targets = description.make_targets(case.global_batch, case.seq_len, settings.seed)
        inputs = backend.make_inputs(cell.launcher.rows(arrays))
        cell.stage("compile")
        untimed_step = backend.make_train_step(
            inputs, backend.make_targets(cell.launcher.rows(targets))
        )  # +loss_after's
        losses: list[object] = []  # every step's returned loss object, read after timing
        warmup_steps, timing = cell.time_calls(backend, recording(untimed_step, losses))
        step_losses = [backend.loss_value(loss) for loss in losses]
        del losses[:]  # the loss objects are not needed any more
        cell.launcher.after_steps(cell, backend, description)
        self.record(
            cell,
            description,
            arrays,
            targets,
            step_losses,
            warmup_steps,
            timing.total_calls,
            backend.loss_after(untimed_step),
        )
        cell.stage("done")

    def record(
        self,
        cell: Cell,
        description: ModelDescription,
        arrays: dict[str, np.ndarray],
        targets: dict[str, np.ndarray],
        step_losses: list[float],
        warmup_steps: int,
        timed_steps: int,
        final_loss: float,
    ) -> None:
        """Training details; with ``check_parity``, the first step's loss (computed before any update)
        against the float64 reference loss at the cell's shape, relative error within the dtype's tolerance.
        A failed check, or a final loss that is not finite, makes the cell ``mismatch``.

        ``step_losses``: the loss of every step the loop ran, in order (first call, warm-up, the adaptive
        timer's calibration calls, timed calls), each computed before that step's update."""
        case, settings = cell.job.case, cell.job.settings
        tokens = case.global_batch * case.seq_len if case.seq_len is not None else None
        first_loss = step_losses[0]
        steps_between = warmup_steps + timed_steps
        cell.result["training"] = {
            "optimizer": dataclasses.asdict(optimizer_spec(settings.optimizer)),
            "loss": "softmax cross-entropy, mean over the counted positions (fwbench.models.training)",
            "counted_positions": float(targets["label_weights"].sum()),
            "samples_per_step": case.global_batch,
            "tokens_per_step": tokens,
            "first_loss": first_loss,
            "final_loss": final_loss,  # the loss of one more step after the timed loop
            # first call + warm-up + timed samples; the adaptive timer's calibration calls come on top
            "counted_steps_before_final": 1 + steps_between,
            # one loss per step run before the final one, in order; the parts say which step was which
            "step_losses": step_losses,
            "step_loss_parts": {
                "first_call": 1,
                "warmup": warmup_steps,
                "calibration": len(step_losses) - 1 - steps_between,
                "timed": timed_steps,
            },
        }
        if cell.job.check_parity:
            cell.stage("parity")
            reference = reference_loss(cell, description, arrays, targets)
            if reference is not None:
                tolerance = PARITY_REL_L2_TOLERANCE[case.dtype]
                rel, max_abs = relative_errors(first_loss, reference)
                cell.result["parity"] = {
                    "ok": rel <= tolerance,
                    "reference": "numpy-float64",
                    "tolerance_rel_l2": tolerance,
                    "checked": "loss of the first step, before any update",
                    "outputs": {"loss": {"rel_l2": rel, "max_abs": max_abs}},
                    "reference_loss": reference,
                    "shape": [case.global_batch, case.seq_len],
                }
                parity_arrays = description.make_inputs(*description.parity_shape(), cell.job.settings.seed)
                assert cell.backend is not None
                cell.record_precision(cell.backend, cell.backend.make_inputs(parity_arrays))
                if rel > tolerance:
                    cell.fail_check(
                        f"first-step loss {first_loss:.7g} differs from the reference {reference:.7g}: "
                        f"relative error {rel:.3g} > {tolerance:g}"
                    )
                    return
        if not math.isfinite(final_loss):
            cell.fail_check(f"the loss after more than {1 + steps_between} steps is {final_loss}")

    def verify(self, cell: Cell, backend: Backend, description: ModelDescription, output: Path) -> None:
        """``job.train_steps`` optimizer steps on the case's fixed batch, nothing timed; saves to ``output``
        ``losses`` (steps,) float64, each step's loss before its update, and every trained parameter as
        ``param/<canonical name>`` (canonical layout, float32). With the job's ``checkpoints`` (``fwbench diff
        --phase training``) instead: the first step's loss and the gradient of every trained tensor as
        ``gradient/<canonical name>`` (``details.gradients_unavailable`` says why a runtime has none)."""
        case, settings = cell.job.case, cell.job.settings
        inputs = backend.make_inputs(
            cell.launcher.rows(description.make_inputs(case.global_batch, case.seq_len, settings.seed))
        )
        cell.stage("compile")
        targets = description.make_targets(case.global_batch, case.seq_len, settings.seed)
        if cell.job.checkpoints:
            batch = (inputs, backend.make_targets(cell.launcher.rows(targets)))
            self.save_gradients(cell, backend, description, batch, output)
            return
        step = backend.make_train_step(inputs, backend.make_targets(cell.launcher.rows(targets)))
        cell.stage("first_call")
        losses = np.array([backend.loss_value(step()) for _ in range(cell.job.train_steps)], dtype=np.float64)
        arrays: dict[str, Any] = {"losses": losses}
        arrays.update((f"param/{name}", value) for name, value in backend.trained_parameters().items())
        if cell.launcher.writes_outputs:  # every rank holds the same parameters; one of them writes them
            np.savez(output, **arrays)
        cell.result["status"] = "ok"
        cell.stage("done")

    def save_gradients(
        self, cell: Cell, backend: Backend, description: ModelDescription, batch: tuple[Any, Any], output: Path
    ) -> None:
        """The loss and the gradients of the first training step on ``batch`` (backend inputs, targets), computed by
        the runtime's training program, saved to ``output``: ``losses`` (1,) and ``gradient/<name>`` for every
        tensor an optimizer updates (frozen tensors and running statistics have none)."""
        cell.stage("first_call")
        saved: dict[str, Any] = {}
        try:
            loss, gradients = backend.gradients(*batch)
        except NotImplementedError as exc:
            cell.result["gradients_unavailable"] = str(exc)
        else:
            untrained = {*description.frozen_in_training(), *description.running_statistics()}
            saved["losses"] = np.array([loss], dtype=np.float64)
            saved.update((f"{GRADIENT_KEY}{n}", g) for n, g in gradients.items() if n not in untrained)
        np.savez(output, **saved)
        cell.result["status"] = "ok"
        cell.stage("done")
