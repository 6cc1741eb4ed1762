"""A profiled cell as the manager keeps it: the worker's profile report (``details["profile"]``) read back into a
:class:`ProfileSummary`, with the profiler's own overhead and whether the profiler could split the time by op."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fwbench.profile.summary import ProfileSummary, summarize
from fwbench.profile.trace import OP_RULES, op_events, read_chrome_trace

# A profile whose largest op holds at least this share of the busy time, and is compiled code, is one compiled
# program to the profiler: its split by category says nothing about the ops inside.
ONE_PROGRAM_SHARE = 0.9


@dataclass(frozen=True)
class ProfiledCell:
    """One cell's profile: ``summary`` (per profiled call), the raw ``trace`` path, the ``profiler``, the medians
    of the call times without and with the profiler (seconds), and ``attribution``: ``by op``, or why the
    split cannot be trusted."""

    summary: ProfileSummary
    trace: str
    profiler: str
    unprofiled_median_s: float
    profiled_median_s: float
    attribution: str

    @property
    def profiler_overhead(self) -> float:
        """How much slower a call ran under the profiler (0.05 = 5% slower), medians of the same worker's calls."""
        return self.profiled_median_s / self.unprofiled_median_s - 1


def attribution(summary: ProfileSummary) -> str:
    """``by op``; ``no ops recorded``; or ``one compiled program`` when a single compiled op holds nearly all the
    busy time (the profiler does not see inside it, e.g. XLA on a CPU)."""
    if not summary.ops or summary.busy_s <= 0:
        return "no ops recorded"
    top = summary.ops[0]
    if top.category == "compiled fusion" and top.self_s_per_call >= ONE_PROGRAM_SHARE * summary.busy_s:
        return f"one compiled program ({top.name}): the profiler does not split it by op"
    return "by op"


def profiled_cell(report: dict[str, Any]) -> ProfiledCell:
    """The :class:`ProfiledCell` of a worker's profile report (``details["profile"]``); ValueError when the
    report or its trace cannot be read."""
    rule = report.get("rule")
    if rule not in OP_RULES:
        raise ValueError(f"profile report with unknown rule {rule!r}; known: {', '.join(OP_RULES)}")
    calls = int(report["calls"])
    events = op_events(read_chrome_trace(Path(report["trace"])), OP_RULES[rule])
    summary = summarize(events, calls, float(report["wall_s"]))
    return ProfiledCell(
        summary=summary,
        trace=str(report["trace"]),
        profiler=str(report.get("profiler", "")),
        unprofiled_median_s=statistics.median(report["unprofiled_call_s"]),
        profiled_median_s=statistics.median(report["profiled_call_s"]),
        attribution=attribution(summary),
    )
