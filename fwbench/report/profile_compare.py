"""Two profile runs side by side (``fwbench compare --profile``): per model × shape and runtime, each op
category's self time per profiled call in run A and run B and their ratio, then busy time, overhead, wall time
and the median without the profiler; the cells only one run has are listed.

Descriptive only: a profile holds a few calls of one worker, so no confidence interval or verdict is given; a
regression verdict comes from benchmark runs (``fwbench compare`` without ``--profile``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rich.markup import escape
from rich.table import Table

from fwbench.profile.categories import CATEGORIES
from fwbench.profile.cells import ProfiledCell
from fwbench.profile.summary import NEGLIGIBLE_S
from fwbench.report.profile_table import group_title
from fwbench.store import ProfileRecord
from fwbench.units import format_seconds

LEGEND = (
    "per profiled call: self time of the category's ops (busy: their union; overhead: wall − busy); B/A above 1: "
    "run B spent more. Descriptive: a profile is a few calls of one worker, no CI; verdicts come from benchmark "
    "runs (fwbench compare without --profile)."
)


@dataclass(frozen=True)
class ProfilePair:
    """One cell profiled in both runs: the group it belongs to (model, phase, dtype, device, shape), its runtime,
    and its profile in run A and in run B."""

    title: str
    runtime: str
    a: ProfiledCell
    b: ProfiledCell


@dataclass(frozen=True)
class ProfileComparison:
    """The cells both runs profiled ``ok``, and the cells (``title: runtime``) only one of them has, or that one
    of them did not profile (with its status)."""

    pairs: list[ProfilePair]
    only_a: list[str]
    only_b: list[str]

    def to_dict(self) -> dict[str, Any]:
        """Plain data (seconds per profiled call), for ``--format json``."""
        return {
            "cells": [{"group": p.title, "runtime": p.runtime, "seconds": _figures(p)} for p in self.pairs],
            "only_a": self.only_a,
            "only_b": self.only_b,
        }


_LINES: list[tuple[str, Callable[[ProfiledCell], float]]] = [
    *((category, lambda c, k=category: c.summary.categories_s[k]) for category in CATEGORIES),
    ("busy (union of ops)", lambda c: c.summary.busy_s),
    ("overhead (wall − busy)", lambda c: c.summary.overhead_s),
    ("wall", lambda c: c.summary.wall_s),
    ("median without profiler", lambda c: c.unprofiled_median_s),
]


def _figures(pair: ProfilePair) -> dict[str, dict[str, float]]:
    """Line → {"a": seconds, "b": seconds} of one pair."""
    return {label: {"a": value(pair.a), "b": value(pair.b)} for label, value in _LINES}


def _keyed(records: Sequence[ProfileRecord]) -> dict[tuple[str, str], ProfileRecord]:
    return {(group_title(r), r.runtime): r for r in records}


def compare_profiles(records_a: Sequence[ProfileRecord], records_b: Sequence[ProfileRecord]) -> ProfileComparison:
    """Match the profiled cells of two runs by model, phase, dtype, device, shape and runtime."""
    a, b = _keyed(records_a), _keyed(records_b)
    pairs, only_a, only_b = [], [], []
    for key, record in a.items():
        other = b.get(key)
        if record.cell is not None and other is not None and other.cell is not None:
            pairs.append(ProfilePair(key[0], key[1], record.cell, other.cell))
        else:
            only_a.append(f"{key[0]}: {key[1]}" + ("" if record.cell else f" ({record.status})"))
    for key, record in b.items():
        if not (key in a and a[key].cell is not None and record.cell is not None):
            only_b.append(f"{key[0]}: {key[1]}" + ("" if record.cell else f" ({record.status})"))
    return ProfileComparison(pairs, only_a, only_b)


def _change(a_s: float, b_s: float) -> str:
    """``12.3 ms → 10.1 ms (0.82×)``; ``—`` where neither run spent time there."""
    if a_s < NEGLIGIBLE_S and b_s < NEGLIGIBLE_S:
        return "—"
    ratio = f"{b_s / a_s:.2f}×" if a_s >= NEGLIGIBLE_S else "new"
    shown = (format_seconds(s) if s >= NEGLIGIBLE_S else "—" for s in (a_s, b_s))
    return f"{' → '.join(shown)} ({ratio})"


def comparison_rows(pairs: Sequence[ProfilePair]) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of one group's table: a line per category and total, a column per runtime."""
    headers = ["per profiled call, A → B (B/A)", *(p.runtime for p in pairs)]
    rows = [[label, *(_change(value(p.a), value(p.b)) for p in pairs)] for label, value in _LINES]
    return headers, rows


def profile_comparison_tables(comparison: ProfileComparison, label_a: str, label_b: str) -> list[Table | str]:
    """A table per model × shape with the runtimes both runs profiled, then the unmatched cells and the legend."""
    groups: dict[str, list[ProfilePair]] = {}
    for pair in comparison.pairs:
        groups.setdefault(pair.title, []).append(pair)
    out: list[Table | str] = []
    for title, pairs in groups.items():
        headers, rows = comparison_rows(pairs)
        table = Table(title=f"{escape(title)}: A {escape(label_a)}, B {escape(label_b)}", title_justify="left")
        table.add_column(headers[0])
        for header in headers[1:]:
            table.add_column(escape(header), justify="right")
        for index, row in enumerate(rows):
            if index == len(CATEGORIES):
                table.add_section()
            table.add_row(*(escape(value) for value in row))
        out.append(table)
    for label, cells in ((label_a, comparison.only_a), (label_b, comparison.only_b)):
        if cells:
            out.append(f"not compared, in {label}: {'; '.join(cells)}")
    out.append(LEGEND)
    return out
