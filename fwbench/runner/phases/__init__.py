"""The phases a cell can run, one file each, found by name (:func:`get_phase`).

Each phase is a :class:`~fwbench.runner.phases.base.Phase` whose one entry point ``run(cell)`` takes the
:class:`~fwbench.runner.cell.Cell` (the job; the backend is created for the phase and built there) and returns
the cell's result. To add a phase: add it to ``spec.Phase``, write
``phases/<name>.py`` with a ``Phase`` subclass (name, dtypes, ``measure``; ``unsupported``/``verify`` if it
has them) and register it below. Profiling and multi-process runs are strategies around ``Phase.run``, not
phases (see :mod:`fwbench.runner.phases.base`).
"""

from __future__ import annotations

from fwbench.runner.phases.base import Phase
from fwbench.runner.phases.data import Data
from fwbench.runner.phases.fit import Fit
from fwbench.runner.phases.inference import Inference
from fwbench.runner.phases.training import Training

PHASES: dict[str, Phase] = {phase.name: phase for phase in (Inference(), Training(), Fit(), Data())}


class UnknownPhase(NotImplementedError):
    """No phase of that name is implemented (a cell with it is stored as ``error``)."""


def get_phase(name: str) -> Phase:
    """The phase called ``name``; :class:`UnknownPhase` naming the implemented ones otherwise."""
    if name not in PHASES:
        raise UnknownPhase(f"phase {name!r} is not implemented; implemented phases: {', '.join(PHASES)}")
    return PHASES[name]


__all__ = ["PHASES", "Phase", "UnknownPhase", "get_phase"]
