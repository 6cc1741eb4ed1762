"""What the reports show of each phase's cells, as the phase says (:mod:`fwbench.runner.phases`, the facts
``compared_by_speedup`` and ``report_sections``): which rows are compared runtime against runtime by their time per
call (the summary of speed-ups, heat maps, latency plots, the "vs baseline" column), and which rows each of a phase's
own report sections gets. The tables and the HTML page ask here instead of testing phase names, so a new phase brings
its sections by naming them. A row of a phase this installation does not know (a plugin's, not loaded) is compared by
speed-up, as a phase is by default."""

from __future__ import annotations

from collections.abc import Sequence

from fwbench.runner import phases
from fwbench.runner.phases import Phase
from fwbench.store import ResultRecord


def _phase(name: str) -> Phase | None:
    return phases.PHASES.get(name)


def compared_by_speedup(phase: str) -> bool:
    """Whether the cells of ``phase`` are compared by their time per call (True for an unknown phase)."""
    known = _phase(phase)
    return known is None or known.compared_by_speedup


def compared_rows(results: Sequence[ResultRecord]) -> list[ResultRecord]:
    """The rows whose phase compares runtimes by their time per call, in stored order."""
    return [row for row in results if compared_by_speedup(row.phase)]


def section_rows(results: Sequence[ResultRecord], section: str) -> list[ResultRecord]:
    """The rows whose phase has the report section ``section``, in stored order."""
    return [row for row in results if (known := _phase(row.phase)) is not None and section in known.report_sections]


def sections_of(results: Sequence[ResultRecord]) -> list[str]:
    """The phases' own report sections these rows call for, in the order the phases name them."""
    names: dict[str, None] = {}
    for phase in dict.fromkeys(row.phase for row in results):
        known = _phase(phase)
        names.update(dict.fromkeys(known.report_sections if known is not None else ()))
    return list(names)
