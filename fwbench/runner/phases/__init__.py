"""The phases a cell can run, one file each, found by name (:func:`get_phase`).

Each phase is a :class:`~fwbench.runner.phases.base.Phase`: its facts (dtypes, whether its cells have a model or
run as several processes, what it refuses, its FLOPs and estimate), which the planner, the estimate, verify and
profile ask, and its one entry point ``run(cell)``, which the worker's launcher (:mod:`fwbench.runner.launchers`:
one process, one rank of a ``--procs`` cell, profiled) carries out. To add a phase: write ``phases/<name>.py``
with a ``Phase`` subclass, register it below and add its name to ``spec.Phase`` (docs/architecture.md's
checklist).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from fwbench.runner.phases.base import Phase
from fwbench.runner.phases.data import Data
from fwbench.runner.phases.fit import Fit
from fwbench.runner.phases.generate import Generate
from fwbench.runner.phases.inference import Inference
from fwbench.runner.phases.serving import Serving
from fwbench.runner.phases.training import Training
from fwbench.spec import Case, Settings, SpecError

PHASES: dict[str, Phase] = {
    phase.name: phase for phase in (Inference(), Training(), Fit(), Data(), Serving(), Generate())
}


class UnknownPhase(NotImplementedError):
    """No phase of that name is implemented (a cell with it is stored as ``error``)."""


def get_phase(name: str) -> Phase:
    """The phase called ``name``; :class:`UnknownPhase` naming the implemented ones otherwise."""
    if name not in PHASES:
        raise UnknownPhase(f"phase {name!r} is not implemented; implemented phases: {', '.join(PHASES)}")
    return PHASES[name]


def phase_names(predicate: Callable[[Phase], bool] = lambda phase: True) -> tuple[str, ...]:
    """The names of the phases for which ``predicate`` holds, in registration order."""
    return tuple(name for name, phase in PHASES.items() if predicate(phase))


def estimate_s(cases: Iterable[Case], settings: Settings) -> float:
    """Seconds ``cases`` may take in all, each as its phase estimates it (an order of magnitude: runner/estimate.py)."""
    return sum(get_phase(case.phase).estimate_cell_s(case, settings) for case in cases)


def check_case(case: Case, settings: Settings) -> None:
    """SpecError for a cell its phase cannot run: several processes in a phase of one, a worker count in a phase
    with a model (or none in a loader's), then the phase's own checks (:meth:`Phase.check_cell`)."""
    phase = get_phase(case.phase)
    if case.procs is not None and not phase.distributed:
        several = " and ".join(phase_names(lambda p: p.distributed))
        raise SpecError(f"--procs runs phases {several} as several processes, not phase {case.phase}")
    if (case.workers is not None) == phase.uses_model:
        loaders = " and ".join(phase_names(lambda p: not p.uses_model))
        raise SpecError(f"a worker count belongs to phase {loaders} cells, and every one of them has one")
    phase.check_cell(case, settings)


__all__ = ["PHASES", "Phase", "UnknownPhase", "check_case", "estimate_s", "get_phase", "phase_names"]
