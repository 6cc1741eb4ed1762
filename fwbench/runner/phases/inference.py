"""Phase inference: the timed call is one forward pass (``backend.make_step``: ``infer`` then ``sync``) at the
cell's shape; after timing, with ``check_parity``, the outputs at the model's small parity shape against its
float64 reference."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fwbench.models.base import ModelDescription
from fwbench.runner.cell import Cell, parity
from fwbench.runner.phases.base import Phase
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
        cell.time_calls(backend, backend.make_step(inputs))
        if cell.job.check_parity:
            self.check_parity(cell, backend, description)
        cell.stage("done")

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
        check = parity(backend.to_numpy(backend.infer(inputs)), reference, cell.job.case.dtype, description.name)
        check["shape"] = list(description.parity_shape())
        cell.result["parity"] = check
        cell.record_precision(backend, inputs)
        if not check["ok"]:
            cell.fail_check(mismatch_reason(check))

    def verify(self, cell: Cell, backend: Backend, description: ModelDescription, output: Path) -> None:
        """One compiled call at the case's shape, its outputs saved to ``output`` by name."""
        case, settings = cell.job.case, cell.job.settings
        inputs = backend.make_inputs(description.make_inputs(case.batch_size, case.seq_len, settings.seed))
        cell.stage("compile")
        backend.compile(inputs)
        cell.stage("first_call")
        outputs: dict[str, Any] = backend.to_numpy(backend.infer(inputs))
        np.savez(output, **outputs)
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
