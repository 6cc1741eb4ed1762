"""The :class:`Phase` interface: what one phase (inference, training, fit, ...) runs in a worker.

A phase's one entry point is :meth:`Phase.run`, given the :class:`~fwbench.runner.cell.Cell` (the job, the
result being built, the shared stages). It checks the case (before any framework is imported), creates and
builds the backend — which gets the phase at creation — and then either measures (:meth:`Phase.measure`)
or, for ``fwbench verify``, writes the job's outputs (:meth:`Phase.verify`).

A phase also owns its facts, which the planner, the estimate, the registry's checks and the CLI ask it for
(they do not branch on its name): the dtypes it computes in (:attr:`Phase.dtypes`), whether its cells
have a model, run as several processes (``--procs``), can be verified or profiled, what it refuses of a model, a
runtime or a grid (:meth:`Phase.unsupported`, :meth:`Phase.runtime_unsupported`, :meth:`Phase.check_grid`,
:meth:`Phase.check_cell`), how its FLOPs are counted (:meth:`Phase.flops_per_call`) and what a cell costs
(:meth:`Phase.estimate_cell_s`). Importing a phase imports no framework.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from fwbench.frameworks import RuntimeInfo, get_runtime
from fwbench.frameworks import dtype_unsupported as runtime_dtype_unsupported
from fwbench.measure import settle
from fwbench.models import get_model
from fwbench.models.base import ModelDescription
from fwbench.runner import estimate
from fwbench.runner.cell import Cell
from fwbench.spec import Case, Settings

if TYPE_CHECKING:
    from fwbench.frameworks.base import Backend

# Forward + backward ≈ 3 forwards: the backward pass runs two matmuls (input and weight gradients) per forward one.
TRAINING_FLOPS_FACTOR = 3


class Phase(ABC):
    """One phase: its name (a spec.Phase), the dtypes it runs, and how a cell of it is run."""

    name: ClassVar[str]
    dtypes: ClassVar[tuple[str, ...]]  # the case dtypes (spec.Dtype) this phase runs
    interleavable: ClassVar[bool] = True  # its timed calls can be served in blocks on command (Cell.serve_blocks)
    # Its cells' model is a zoo model; a phase without one is a loader's (phase data): its cells' model is a
    # dataset's name, each cell has a loader worker count (Case.workers, --workers), and there are no FLOPs.
    uses_model: ClassVar[bool] = True
    distributed: ClassVar[bool] = False  # its cells may run as several processes (--procs)
    verifiable: ClassVar[bool] = False  # fwbench verify --phase takes it
    profilable: ClassVar[bool] = False  # fwbench profile --phase takes it (its steps are timed by Cell.time_calls)
    # Interleaved rounds after the first may start its workers side by side (importing on every CPU, then moved to
    # the cell's before the framework is configured: fwbench.runner.scheduler): it builds through Cell.build_backend.
    starts_together: ClassVar[bool] = False
    # What the reports show of its cells (fwbench.report.phases asks, as the planner asks the other facts): whether
    # runtimes are compared by their time per call (the summary of speed-ups over a baseline, the heat maps, the
    # latency plots, the "vs baseline" column), and the report sections of its own, by name (each one a table and,
    # on the HTML page, a section: "serving", "fit").
    compared_by_speedup: ClassVar[bool] = True
    report_sections: ClassVar[tuple[str, ...]] = ()

    def default_threads(self, cores: int) -> int:
        """The thread budget of this phase's cells when neither a flag nor a suite sets one, on ``cores`` physical
        cores: all of them."""
        return cores

    def dtype_unsupported(self, dtype: str) -> str | None:
        """None when this phase computes in ``dtype``, else why not."""
        if dtype in self.dtypes:
            return None
        return f"phase {self.name} computes in {', '.join(self.dtypes)} only, not {dtype}"

    def check_grid(self, batch_sizes: list[int], settings: Settings) -> None:
        """SpecError for a grid this phase cannot run under ``settings`` (before any cell is made)."""
        return None

    def check_cell(self, case: Case, settings: Settings) -> None:
        """SpecError for a cell this phase cannot run under ``settings`` beyond what every phase checks
        (:func:`fwbench.runner.phases.check_case`)."""
        return None

    def runtime_unsupported(self, info: RuntimeInfo, settings: Settings) -> str | None:
        """Why ``info``'s runtime cannot run this phase under ``settings`` (None when it can); nothing imported."""
        if self.name in info.phases:
            return None
        why = info.no_generate if self.name == "generate" else ""
        return f"{info.name} has no {self.name} phase" + (f": {why}" if why else " yet")

    def runtime_refusal(self, info: RuntimeInfo, dtype: str, settings: Settings) -> str | None:
        """Why ``info``'s runtime cannot run this phase's cells in ``dtype``: the phase's refusal of the runtime,
        then the runtime's dtypes (its record's); None when it can."""
        return self.runtime_unsupported(info, settings) or runtime_dtype_unsupported(info, dtype)

    def interleaves(self, settings: Settings) -> bool:
        """Whether this phase's cells may run interleaved under ``settings`` (the setting decides beyond that)."""
        return self.interleavable

    def blocks_per_round(self, settings: Settings) -> int | None:
        """Interleaved: the blocks each worker times in a round when the phase fixes them (None: as many as the
        round's share of ``max_time_s`` holds)."""
        return None

    def unsupported(self, description: ModelDescription, info: RuntimeInfo, settings: Settings) -> str | None:
        """Why ``description``'s model cannot run this phase in ``info``'s runtime under ``settings`` (None when it
        can), asked after the runtime's own refusals (:meth:`runtime_unsupported`, its dtypes); nothing is
        imported."""
        return None

    def flops_per_call(self, description: ModelDescription, case: Case, settings: Settings) -> int | None:
        """FLOPs of one timed call (the ``flops`` stored with a result): one forward of the global batch; None
        when it cannot be known."""
        return description.forward_flops(case.global_batch, case.seq_len)

    def step_flops(self, description: ModelDescription, case: Case) -> int:
        """FLOPs of one optimizer step on the global batch: forward + backward (TRAINING_FLOPS_FACTOR forwards) of
        the training graph, the loss's own matmuls included (BERT's tied vocabulary projection)."""
        return TRAINING_FLOPS_FACTOR * description.training_forward_flops(case.global_batch, case.seq_len)

    def estimate_cell_s(self, case: Case, settings: Settings) -> float:
        """Seconds one cell may take, worker start-up to stored result, over its rounds (an order of magnitude):
        a fresh worker's start-up, build, compile (twice: once more at the parity shape) and warm-up per round, and
        the timing budget (shared by the rounds; interleaved, the pauses between workers' blocks add to it)."""
        call = estimate.call_s(self.flops_per_call(get_model(case.model), case, settings), settings, case.runtime)
        timing = estimate.timing_s(call, settings)
        fixed = estimate.setup_s(case) + (1 + max(2, settings.warmup_calls)) * call
        if settings.interleave:
            timing *= 1 + settle.expected_pause_s(settings.settle_s) / max(settings.min_block_s, call)
        return settings.rounds * fixed + timing

    def seeded_weights(self, description: ModelDescription, seed: int) -> dict[str, np.ndarray]:
        """The weights this phase's cells build with when the job names no weights file: the seeded canonical set."""
        return description.canonical_weights(seed)

    def merged_details(self, rounds: list[dict[str, Any]]) -> dict[str, Any]:
        """What the stored cell keeps of its rounds' details beyond the first round's (each round's result details,
        in round order): nothing by default; a phase whose rounds each measure more than samples keeps them here."""
        return {}

    def run(self, cell: Cell) -> dict[str, Any]:
        """The cell from its start to ``done``: stage start (these checks) → import → build (shared, on ``cell``)
        → :meth:`measure`, or :meth:`verify` when the job has a ``verify_output``, or :meth:`export` when it has an
        ``export_to``. Returns ``cell.result``.

        NotImplementedError (the cell's status becomes ``error``) when the phase cannot run the case."""
        case = cell.job.case
        refused = self.dtype_unsupported(case.dtype)
        if refused:
            raise NotImplementedError(refused)
        description = get_model(case.model)
        unsupported = self.unsupported(description, get_runtime(case.runtime), cell.job.settings)
        if unsupported:
            raise NotImplementedError(unsupported)
        cell.seeded_weights = self.seeded_weights
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
