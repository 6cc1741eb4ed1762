"""From op events to a profile: self time per op and per category, busy time (the union of the op intervals),
overlap and framework overhead, all per profiled call. Times are seconds."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from fwbench.profile.categories import CATEGORIES, Category, Vocabulary, categorize

NEGLIGIBLE_S = 1e-9  # below a nanosecond per call: none (float sums of op times leave residues such as 7e-18 s)


@dataclass(frozen=True)
class OpEvent:
    """One op as a profiler recorded it: its name, its interval (start and duration, seconds), its lane (the
    thread it ran on) and the vocabulary its name is in. Ops on one lane nest (a parent op's interval contains
    its children's)."""

    name: str
    start_s: float
    duration_s: float
    lane: str = "0"
    vocabulary: Vocabulary = "torch"  # whose names these are (fwbench.profile.categories)

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


def union_s(intervals: Iterable[tuple[float, float]]) -> float:
    """The length of the union of ``(start, end)`` intervals: time covered by at least one of them."""
    total, current_start, current_end = 0.0, None, None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None and current_start is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None and current_start is not None:
        total += current_end - current_start
    return total


def self_times_s(events: Sequence[OpEvent]) -> list[float]:
    """Each event's self time: its duration minus its direct children's, the children being the events of its
    lane whose interval lies inside its own (nested calls, e.g. aten::linear around aten::addmm)."""
    self_s = [event.duration_s for event in events]
    by_lane: dict[str, list[int]] = defaultdict(list)
    for index, event in enumerate(events):
        by_lane[event.lane].append(index)
    for indices in by_lane.values():
        indices.sort(key=lambda i: (events[i].start_s, -events[i].duration_s))
        stack: list[int] = []
        for index in indices:
            event = events[index]
            while stack and events[stack[-1]].end_s <= event.start_s:
                stack.pop()
            if stack and event.end_s <= events[stack[-1]].end_s:
                self_s[stack[-1]] -= event.duration_s
                stack.append(index)
            else:  # not inside the open interval (or a partial overlap): a new top-level op on this lane
                stack = [index]
    return [max(0.0, value) for value in self_s]


@dataclass(frozen=True)
class OpRow:
    """One op name of a profile: its category, calls and self time, both per profiled call."""

    name: str
    category: Category
    calls_per_call: float
    self_s_per_call: float


@dataclass(frozen=True)
class ProfileSummary:
    """A profile reduced to one profiled call: ``wall_s`` (the worker's clock around the profiled calls, per
    call), ``busy_s`` (the union of the op intervals), ``overlap_s`` (op self time beyond that union: ops that ran
    at the same time on different lanes), ``overhead_s`` (wall − busy: time in no op: dispatch, Python, the
    framework), self time per category and per op (``ops``, largest first), and the op names that fell into
    ``other`` (``uncategorized``)."""

    calls: int
    wall_s: float
    busy_s: float
    overlap_s: float
    overhead_s: float
    categories_s: dict[Category, float]
    ops: list[OpRow] = field(default_factory=list)
    uncategorized: list[str] = field(default_factory=list)

    def top(self, n: int = 10) -> list[OpRow]:
        """The ``n`` ops with the most self time."""
        return self.ops[:n]


def summarize(events: Sequence[OpEvent], calls: int, wall_s: float) -> ProfileSummary:
    """The profile of ``calls`` profiled calls that took ``wall_s`` seconds in all (the worker's clock), from their
    op ``events``; every figure per call."""
    if calls < 1:
        raise ValueError(f"a profile needs at least one profiled call, got {calls}")
    self_s = self_times_s(events)
    per_op_s: dict[tuple[str, Vocabulary], float] = defaultdict(float)
    per_op_calls: dict[tuple[str, Vocabulary], int] = defaultdict(int)
    for event, seconds in zip(events, self_s, strict=True):
        per_op_s[event.name, event.vocabulary] += seconds
        per_op_calls[event.name, event.vocabulary] += 1
    categories_s: dict[Category, float] = dict.fromkeys(CATEGORIES, 0.0)
    ops = []
    for (name, vocabulary), seconds in per_op_s.items():
        category = categorize(vocabulary, name)
        categories_s[category] += seconds / calls
        ops.append(OpRow(name, category, per_op_calls[name, vocabulary] / calls, seconds / calls))
    ops.sort(key=lambda row: (-row.self_s_per_call, row.name))
    busy_s = union_s((event.start_s, event.end_s) for event in events) / calls
    return ProfileSummary(
        calls=calls,
        wall_s=wall_s / calls,
        busy_s=busy_s,
        overlap_s=max(0.0, sum(self_s) / calls - busy_s),
        overhead_s=max(0.0, wall_s / calls - busy_s),
        categories_s=categories_s,
        ops=ops,
        uncategorized=sorted(row.name for row in ops if row.category == "other"),
    )
