"""The :class:`Phase` interface: what one phase (inference, training, fit, ...) runs in a worker.

A phase's one entry point is :meth:`Phase.run`, given the :class:`~fwbench.runner.cell.Cell` (the job, the
result being built, the shared stages). It checks the case (before any framework is imported), creates and
builds the backend — which gets the phase at creation — and then either measures (:meth:`Phase.measure`)
or, for ``fwbench verify``, writes the job's outputs (:meth:`Phase.verify`).

Profiling (``fwbench profile``) and multi-process runs (``--procs``) are strategies, not phases: a strategy
will take the phase and the cell and decide how ``phase.run(cell)`` is carried out (under a profiler, as one of
N ranks, ...), so every phase gets every strategy and no phase knows which one runs it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from fwbench.models import get_model
from fwbench.models.base import ModelDescription
from fwbench.runner.cell import Cell
from fwbench.spec import Case, Settings

if TYPE_CHECKING:
    from fwbench.frameworks.base import Backend


class Phase(ABC):
    """One phase: its name (a spec.Phase), the dtypes it runs, and how a cell of it is run."""

    name: ClassVar[str]
    dtypes: ClassVar[tuple[str, ...]]  # the case dtypes (spec.Dtype) this phase runs
    interleavable: ClassVar[bool] = True  # its timed calls can be served in blocks on command (Cell.serve_blocks)
    uses_model: ClassVar[bool] = True  # its cells' model is a zoo model (phase data: a dataset's name, no FLOPs)

    def interleaves(self, settings: Settings) -> bool:
        """Whether this phase's cells may run interleaved under ``settings`` (the setting decides beyond that)."""
        return self.interleavable

    def blocks_per_round(self, settings: Settings) -> int | None:
        """Interleaved: the blocks each worker times in a round when the phase fixes them (None: as many as the
        round's share of ``max_time_s`` holds)."""
        return None

    def unsupported(self, description: ModelDescription) -> str | None:
        """Why ``description``'s model cannot run this phase (None when it can); nothing is imported."""
        return None

    def flops_per_call(self, description: ModelDescription, case: Case, settings: Settings) -> int | None:
        """FLOPs of one timed call (the ``flops`` stored with a result): one forward, or one optimizer step; None
        when it cannot be known."""
        return description.flops(case.global_batch, case.seq_len, case.phase)

    def run(self, cell: Cell) -> dict[str, Any]:
        """The cell from its start to ``done``: stage start (these checks) → import → build (shared, on ``cell``)
        → :meth:`measure`, or :meth:`verify` when the job has a ``verify_output``, or :meth:`export` when it has an
        ``export_to``. Returns ``cell.result``.

        NotImplementedError (the cell's status becomes ``error``) when the phase cannot run the case."""
        case = cell.job.case
        if case.dtype not in self.dtypes:
            raise NotImplementedError(f"phase {case.phase} with dtype {case.dtype} is not implemented yet")
        description = get_model(case.model)
        unsupported = self.unsupported(description)
        if unsupported:
            raise NotImplementedError(unsupported)
        backend = cell.build_backend(description)
        if cell.job.verify_output is not None:
            self.verify(cell, backend, description, Path(cell.job.verify_output))
        elif cell.job.export_to is not None:
            self.export(cell, backend, description, Path(cell.job.export_to))
        else:
            self.measure(cell, backend, description)
        return cell.result

    @abstractmethod
    def measure(self, cell: Cell, backend: Backend, description: ModelDescription) -> None:
        """From the built ``backend`` to stage ``done``: the phase's timed stages, its checks, ``result``."""

    def verify(self, cell: Cell, backend: Backend, description: ModelDescription, output: Path) -> None:
        """``fwbench verify``: write ``output`` (the job's ``verify_output``, .npz) from the built ``backend``,
        nothing timed."""
        raise NotImplementedError(f"fwbench verify has no {self.name} phase")

    def export(self, cell: Cell, backend: Backend, description: ModelDescription, destination: Path) -> None:
        """``fwbench export``: write the runtime's artefact to ``destination`` from the built ``backend``, load it
        back and check it, nothing timed."""
        raise NotImplementedError(f"fwbench export has no {self.name} phase")
