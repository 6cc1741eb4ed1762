"""How a worker carries out its cell's phase: the launcher around :meth:`~fwbench.runner.phases.Phase.run`.

A phase says what a cell computes and checks; the launcher decides how its timed calls are carried out in this
process, so no phase branches on ``--procs`` or profiling:

- :class:`SingleProcess` (every cell of one process): adaptive warm-up, then the timed loop (or the manager's
  blocks, interleaved), every row of the batch.
- :class:`RankMember` (one process of a data-parallel cell, ``Case.procs``): this rank's rows of the global batch,
  a fixed warm-up (the ranks' collectives must stay in step), a framework barrier before the compile counters'
  window and before every block and epoch, and the bare all-reduces of a training step's gradients afterwards.
- :class:`Profiled` (``fwbench profile``): warm-up, then calls under the framework's profiler instead of samples.

:func:`launcher_for` picks one from the job; the worker runs ``cell.launcher.run(phase, cell)``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fwbench.details import DistributedDetails
from fwbench.measure import timer
from fwbench.messages import Job
from fwbench.models.base import ModelDescription
from fwbench.ranks import RankInfo, rank_rows

if TYPE_CHECKING:
    from fwbench.frameworks.base import Backend
    from fwbench.runner.cell import Cell
    from fwbench.runner.phases.base import Phase

ALLREDUCE_REPEATS = 10  # bare all-reduces timed after a distributed training cell's steps
Arrays = dict[str, np.ndarray]


class SingleProcess:
    """A cell in one process: all the rows, an adaptive warm-up, the timed loop (:meth:`Cell.timed_window`)."""

    writes_outputs = True  # fwbench verify: this process writes the cell's outputs

    def run(self, phase: Phase, cell: Cell) -> dict[str, Any]:
        """The cell's phase from start to ``done`` (:meth:`Phase.run`); returns its result."""
        return phase.run(cell)

    def rows(self, arrays: Arrays) -> Arrays:
        """This process's rows of a global batch (every array's first axis)."""
        return arrays

    def row_groups(self, global_batch: int) -> list[slice]:
        """The rows of a global batch each process of the cell computes on, in rank order."""
        return [slice(0, global_batch)]

    def warm_up(self, step: Callable[[], object], settings: Any, counters: Callable[[], dict[str, int]]) -> list[float]:
        """The warm-up calls' seconds: at least ``settings.warmup_calls``, more until the compile counters settle
        (within ``settings.max_time_s``)."""
        return timer.warm_up(step, settings.warmup_calls, settings.max_time_s, counters)

    def synchronise(self, backend: Backend) -> None:
        """Before the compile counters' window and before every timed block or epoch: nothing to wait for."""

    def together(self, backend: Backend) -> Callable[[], None] | None:
        """What the cell's processes call to start an epoch together (None: one process)."""
        return None

    def measure(self, cell: Cell, backend: Backend, step: Callable[[], object]) -> timer.TimingResult:
        """After warm-up: the timed window (samples, memory, compile health; status ``ok``)."""
        return cell.timed_window(backend, step)

    def after_steps(self, cell: Cell, backend: Backend, description: ModelDescription) -> None:
        """After a training cell's timed steps: nothing more for one process."""


class RankMember(SingleProcess):
    """One of ``procs`` processes of a data-parallel cell (``rank``: this process, from its environment)."""

    def __init__(self, procs: int, rank: RankInfo | None) -> None:
        self.procs = procs
        self.rank = rank
        self.writes_outputs = rank is None or rank.rank == 0  # the ranks hold the same parameters: rank 0 writes

    def run(self, phase: Phase, cell: Cell) -> dict[str, Any]:
        if not phase.distributed:
            raise NotImplementedError(f"phase {phase.name} does not run as several processes")
        return phase.run(cell)

    def rows(self, arrays: Arrays) -> Arrays:
        """Rows ``[r·b, (r+1)·b)`` of rank ``r``'s (fwbench.ranks); all of them in a cell's 1-process run."""
        if self.rank is None:
            return arrays
        rank, world = self.rank.rank, self.rank.world_size
        return {name: array[rank_rows(rank, world, array.shape[0])] for name, array in arrays.items()}

    def row_groups(self, global_batch: int) -> list[slice]:
        return [rank_rows(rank, self.procs, global_batch) for rank in range(self.procs)]

    def warm_up(self, step: Callable[[], object], settings: Any, counters: Callable[[], dict[str, int]]) -> list[float]:
        """Exactly ``settings.warmup_calls`` on every rank: an adaptive warm-up per rank could desynchronise their
        collectives."""
        return timer.warm_up(step, settings.warmup_calls)

    def synchronise(self, backend: Backend) -> None:
        """A framework barrier (untimed): every rank starts the block together; its first call may trace and
        compile (JAX), so it comes once before the compile counters' window too."""
        if self.procs > 1:
            backend.barrier()

    def together(self, backend: Backend) -> Callable[[], None] | None:
        return backend.barrier if self.procs > 1 else None

    def measure(self, cell: Cell, backend: Backend, step: Callable[[], object]) -> timer.TimingResult:
        if not cell.job.interleaved:
            raise RuntimeError("a distributed cell's ranks step together: the manager times its blocks (interleaved)")
        return super().measure(cell, backend, step)

    def after_steps(self, cell: Cell, backend: Backend, description: ModelDescription) -> None:
        """``result["distributed"]``: the processes, their batch rows, and ALLREDUCE_REPEATS bare all-reduces of
        the trained parameters' size (float32, the gradients one step communicates) — the communication a report
        sets against the step time. Untimed: after the timed steps, every rank in the same order."""
        case = cell.job.case
        elements = description.trained_element_count()
        seconds = backend.allreduce_seconds(elements, ALLREDUCE_REPEATS)
        cell.result["distributed"] = DistributedDetails(
            procs=case.procs,
            scaling=case.scaling,
            global_batch=case.global_batch,
            rank_batch=case.rank_batch,
            rank=None if self.rank is None else self.rank.rank,
            allreduce_elements=elements,
            allreduce_bytes=4 * elements,
            allreduce_s=tuple(seconds),
            allreduce_median_s=float(np.median(seconds)),
        ).to_dict()


class Profiled(SingleProcess):
    """``fwbench profile``: after warm-up, ``job.profile_calls`` calls unprofiled and as many under the framework's
    profiler (:meth:`Cell.profile_calls`), the trace kept in ``directory``; no benchmark samples."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def run(self, phase: Phase, cell: Cell) -> dict[str, Any]:
        if not phase.profilable:
            raise NotImplementedError(f"fwbench profile has no {phase.name} phase")
        return phase.run(cell)

    def measure(self, cell: Cell, backend: Backend, step: Callable[[], object]) -> timer.TimingResult:
        return cell.profile_calls(backend, step, self.directory)


def launcher_for(job: Job) -> SingleProcess:
    """The launcher of ``job``: profiled (``profile_to``), one rank of a data-parallel cell (``case.procs``), or a
    single process."""
    if job.profile_to is not None:
        if job.case.procs is not None:
            raise NotImplementedError("fwbench profile runs cells of one process, not --procs cells")
        return Profiled(Path(job.profile_to))
    if job.case.procs is not None:
        return RankMember(job.case.procs, RankInfo.current())
    return SingleProcess()
