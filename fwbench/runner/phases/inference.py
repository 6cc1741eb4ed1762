"""Phase inference: the timed call is one forward pass (``backend.make_step``: ``infer`` then ``sync``) at the
cell's shape; after timing, with ``check_parity``, the outputs at the model's small parity shape against its
float64 reference; a mismatch names its first diverging checkpoint (fwbench.runner.divergence), found in the same
worker from one more call of the program built with the checkpoints as extra outputs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fwbench.frameworks.kernel_reports import probe_failure
from fwbench.models.base import ModelDescription
from fwbench.runner.cell import Cell, parity
from fwbench.runner.divergence import CHECKPOINT_KEY, TAPPED_KEY, first_divergence, layer_errors
from fwbench.runner.phases.base import Phase
from fwbench.runner.tolerances import parity_tolerance
from fwbench.spec import DTYPES

if TYPE_CHECKING:
    from fwbench.frameworks.base import Backend


def mismatch_reason(check: dict[str, Any]) -> str:
    """Why a failed parity check (:func:`fwbench.runner.cell.parity`) failed: its worst output and error."""
    per_output: dict[str, dict[str, float]] = check["outputs"]
    worst, errors = max(per_output.items(), key=lambda item: item[1]["rel_l2"], default=("?", {}))
    return (
        f"outputs differ from the reference: {worst} relative L2 error "
        f"{errors.get('rel_l2', float('nan')):.3g} > {check['tolerance_rel_l2']:g}"
    )


def divergence_note(divergence: dict[str, Any]) -> str:
    """What a mismatch's reason adds about where it starts (:meth:`Inference.divergence`'s record)."""
    if divergence.get("unavailable"):
        return f"; no checkpoints to locate it: {divergence['unavailable']}"
    first = divergence.get("first")
    if first is None:
        return "; every checkpoint within its share of the tolerance: it starts after the last one"
    error = "not finite" if first["rel_l2"] is None else f"{first['rel_l2']:.2g}"
    return f"; first divergence: {first['name']}, rel. error {error} > its share {first['limit']:.2g}"


def verdict(check: dict[str, Any], locate: Callable[[], dict[str, Any]]) -> str | None:
    """The verdict of a parity check (:func:`fwbench.runner.cell.parity`): None when it passed; else the mismatch's
    reason, with where it starts (``check["divergence"]``, set from ``locate()``: :meth:`Inference.divergence`'s
    record)."""
    if check["ok"]:
        return None
    check["divergence"] = locate()
    return mismatch_reason(check) + divergence_note(check["divergence"])


def located(
    description: ModelDescription,
    dtype: str,
    weights: dict[str, np.ndarray],
    arrays: dict[str, np.ndarray],
    compared: tuple[dict[str, np.ndarray], dict[str, np.ndarray]],
    captured: dict[str, np.ndarray],
) -> dict[str, Any]:
    """Where outputs that fail parity start to differ: ``compared`` = (a runtime's outputs on ``arrays``, the
    float64 reference's), ``captured`` the runtime's checkpoints in the same call; the record of
    :meth:`Inference.divergence` (``layers``, ``first``)."""
    outputs, reference_outputs = compared
    errors = layer_errors(
        outputs,
        captured,
        reference_outputs,
        description.reference_checkpoints(weights, arrays) or {},
        parity_tolerance(description.name, dtype),
    )
    first = first_divergence(errors)
    return {"layers": [e.to_dict() for e in errors], "first": None if first is None else first.to_dict()}


class Inference(Phase):
    """build → compile → first call → warm-up → timed samples → parity."""

    name = "inference"
    starts_together = True
    dtypes = DTYPES  # int8: the deployment engines that quantise (the registry says which runtime computes in what)
    verifiable = True
    profilable = True

    def measure(self, cell: Cell, backend: Backend, description: ModelDescription) -> None:
        case, settings = cell.job.case, cell.job.settings
        inputs = backend.make_inputs(description.make_inputs(case.batch_size, case.seq_len, settings.seed))
        cell.stage("compile")
        backend.compile(inputs)
        cell.record_compile_report(backend)
        step = backend.make_step(inputs)
        cell.time_calls(backend, step)
        if cell.job.record_kernels:  # the first round: once per cell, before parity compiles another shape
            self.record_kernels(cell, backend, step, inputs)
        if cell.job.check_parity:
            self.check_parity(cell, backend, description)
        cell.stage("done")

    @staticmethod
    def record_kernels(cell: Cell, backend: Backend, step: Callable[[], object], inputs: Any) -> None:
        """Stage kernels, after the timed calls: ``details.kernels``, the kernel libraries and ISAs the timed call
        ran on as the libraries report them (:meth:`Backend.kernel_libraries`: one more untimed call of ``step``
        with their verbose modes on); a probe that fails says why in its one entry, the cell is kept."""
        cell.stage("kernels")
        try:
            cell.result["kernels"] = backend.kernel_libraries(step, inputs)
        except Exception as exc:  # noqa: BLE001 (a diagnostic: the measurement stands)
            cell.result["kernels"] = probe_failure(exc)

    def check_parity(self, cell: Cell, backend: Backend, description: ModelDescription) -> None:
        """After timing (so first call and samples are untouched): outputs at the description's small
        parity shape against its float64 reference; a failure turns the cell into ``mismatch``."""
        arrays = description.make_inputs(*description.parity_shape(), cell.job.settings.seed)
        reference = description.reference_forward(cell.weights(description), arrays)
        if reference is None:
            return
        cell.stage("parity")
        inputs = backend.make_inputs(arrays)
        backend.compile(inputs)
        cell.record_compile_report(backend)
        outputs = backend.to_numpy(backend.infer(inputs))
        check = parity(outputs, reference, cell.job.case.dtype, description.name)
        check["shape"] = list(description.parity_shape())
        cell.result["parity"] = check
        cell.record_precision(backend, inputs)
        reason = verdict(
            check, lambda: self.divergence(cell, backend, description, (inputs, arrays), (outputs, reference))
        )
        if reason is not None:
            cell.fail_check(reason)

    def divergence(
        self,
        cell: Cell,
        backend: Backend,
        description: ModelDescription,
        given: tuple[Any, dict[str, np.ndarray]],
        compared: tuple[dict[str, np.ndarray], dict[str, np.ndarray]],
    ) -> dict[str, Any]:
        """Where the outputs of ``backend``'s timed program on ``given`` (backend inputs it is compiled for, the
        arrays they were made from) start to differ from the float64 reference, ``compared`` = (those outputs, the
        reference's): ``layers`` (every checkpoint's and output's error and share, in forward order; the checkpoints
        from one call of the program that returns them), ``first`` (the first over its share, or None), or
        ``unavailable`` (why there are no checkpoints, or why capturing them failed: locating a mismatch never
        changes the cell's verdict)."""
        inputs, arrays = given
        try:
            _, captured = self.capture(backend, description, inputs)
        except NotImplementedError as exc:
            return {"unavailable": str(exc)}
        except Exception as exc:  # noqa: BLE001 (recorded: the diagnostic failed, the mismatch stands)
            return {"unavailable": f"capturing the checkpoints failed: {type(exc).__name__}: {exc}"}
        return located(description, cell.job.case.dtype, cell.weights(description), arrays, compared, captured)

    @staticmethod
    def capture(
        backend: Backend, description: ModelDescription, inputs: Any
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """``backend.checkpoints(inputs)``; NotImplementedError for a model without checkpoints (its outputs are
        what is compared)."""
        if not description.checkpoint_names():
            raise NotImplementedError(f"{description.name} has no checkpoints: its outputs are compared")
        return backend.checkpoints(inputs)

    def verify(self, cell: Cell, backend: Backend, description: ModelDescription, output: Path) -> None:
        """One compiled call at the case's shape, its outputs saved to ``output`` by name. With the job's
        ``checkpoints`` (fwbench diff), also one call of the program with the checkpoints as extra outputs: each
        saved as ``checkpoint/<name>`` and that program's outputs as ``tapped/<name>``
        (``details.checkpoints_unavailable`` says why a runtime has none); without,
        outputs out of the reference's tolerance are located in the worker (``details.divergence``)."""
        case, settings = cell.job.case, cell.job.settings
        arrays = description.make_inputs(case.batch_size, case.seq_len, settings.seed)
        inputs = backend.make_inputs(arrays)
        cell.stage("compile")
        backend.compile(inputs)
        cell.stage("first_call")
        outputs: dict[str, Any] = backend.to_numpy(backend.infer(inputs))
        saved = dict(outputs)
        if cell.job.checkpoints:
            try:
                tapped, captured = self.capture(backend, description, inputs)
                saved.update({CHECKPOINT_KEY + name: array for name, array in captured.items()})
                saved.update({TAPPED_KEY + name: array for name, array in tapped.items()})
            except NotImplementedError as exc:
                cell.result["checkpoints_unavailable"] = str(exc)
        else:
            reference = description.reference_forward(cell.weights(description), arrays)
            if reference is not None and not parity(outputs, reference, case.dtype, description.name)["ok"]:
                compared = (outputs, reference)
                cell.result["divergence"] = self.divergence(cell, backend, description, (inputs, arrays), compared)
        np.savez(output, **saved)
        cell.result["status"] = "ok"
        cell.record_precision(backend, inputs)  # a graph off the policy makes it mismatch
        cell.stage("done")

    def export(self, cell: Cell, backend: Backend, description: ModelDescription, destination: Path) -> None:
        """The artefact for the case's shape written to ``destination`` and loaded back from there by the engine
        (``compile_report``: what the export cost); the reloaded artefact's outputs at that shape against the
        float64 reference (``parity``; a failure makes the result ``mismatch``)."""
        case, settings = cell.job.case, cell.job.settings
        arrays = description.make_inputs(case.batch_size, case.seq_len, settings.seed)
        inputs = backend.make_inputs(arrays)
        cell.stage("compile")
        cell.result["compile_report"] = backend.save_artefact(inputs, str(destination))
        cell.stage("first_call")
        outputs = backend.to_numpy(backend.infer(inputs))
        reference = description.reference_forward(cell.weights(description), arrays)
        cell.result["status"] = "ok"
        if reference is not None:
            check = parity(outputs, reference, case.dtype, description.name)
            check["shape"] = [case.batch_size, case.seq_len]
            cell.result["parity"] = check
            if not check["ok"]:
                cell.fail_check(f"the reloaded artefact's {mismatch_reason(check)}")
        cell.stage("done")
