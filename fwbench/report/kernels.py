"""The kernel libraries each runtime's cells ran (``details.kernels``, recorded by the worker from the libraries' own
reports: :mod:`fwbench.frameworks.kernel_reports`): one row per runtime and library entry, with the version, the
instruction set the library said it dispatched to ("not reported" and why where it cannot say), the ops it ran and
where the facts came from, and the models and shapes that reported it. Reads stored details only."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fwbench.store import ResultRecord

TITLE = "Kernel libraries (as each library reported them in the cell's first round)"
HEADERS = ["runtime", "library", "version", "ISA", "ops", "reported by", "cells"]
RIGHT: frozenset[str] = frozenset()
LEGEND = (
    "Kernel libraries: one untimed call after the timed ones, with the libraries' own reports switched on (oneDNN's "
    "and oneMKL's verbose modes, the compiled HLO, OpenVINO's runtime model, TF.js's kernels); ISA is what the "
    "library said it dispatched to, never read from the CPU's flags; 'not reported' gives the reason. "
    "fwbench explain splits a difference between two runtimes by op category beside these."
)
NOT_REPORTED = "not reported"
MAX_OPS = 6  # op names shown per entry before "+N more"
MAX_REASON = 160  # characters of a failed probe's reason on its one line


def kernel_entries(details: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A cell's ``details.kernels`` entries (dicts only); [] when the cell recorded none."""
    entries = details.get("kernels")
    return [entry for entry in entries if isinstance(entry, dict)] if isinstance(entries, list) else []


def ops_text(ops: Sequence[str]) -> str:
    """The op names, at most MAX_OPS of them, then how many more."""
    shown = ", ".join(ops[:MAX_OPS])
    return shown + (f" +{len(ops) - MAX_OPS} more" if len(ops) > MAX_OPS else "")


def isa_text(entry: Mapping[str, Any]) -> str:
    """The ISA the library reported, or ``not reported: <why>``."""
    if entry.get("isa"):
        return str(entry["isa"])
    reason = entry.get("not_reported")
    return f"{NOT_REPORTED}: {reason}" if reason else NOT_REPORTED


def entry_summary(entry: Mapping[str, Any]) -> str:
    """One entry on one line: ``oneMKL 2024.0 (ISA Intel(R) Architecture processors; SGEMM)``; an entry that names
    no library (a probe that failed) says why, shortened."""
    if not entry.get("library"):
        reason = str(entry.get("not_reported") or "no reason given")
        return f"{NOT_REPORTED}: " + (reason if len(reason) <= MAX_REASON else reason[: MAX_REASON - 1] + "…")
    name = " ".join(str(part) for part in (entry.get("library") or "unknown library", entry.get("version")) if part)
    isa = f"ISA {entry['isa']}" if entry.get("isa") else f"ISA {NOT_REPORTED}"
    ops = list(entry.get("ops") or ())
    return f"{name} ({isa}" + (f"; {ops_text(ops)})" if ops else ")")


def _cell_label(row: ResultRecord) -> str:
    return f"{row.model} b{row.batch_size}" + (f" s{row.seq_len}" if row.seq_len is not None else "")


def kernel_rows(results: Sequence[ResultRecord]) -> list[list[str]]:
    """Per runtime (in stored order), one row per distinct library entry its cells recorded: library, version, ISA
    (or why not reported), ops (the union over the cells), the source, and the cells that reported it."""
    grouped: dict[tuple[str, str, str, str, str], tuple[list[str], list[str]]] = {}
    for row in results:
        for entry in kernel_entries(row.details):
            key = (
                row.runtime,
                str(entry.get("library") or "—"),
                str(entry.get("version") or "—"),
                isa_text(entry),
                str(entry.get("source") or "—"),
            )
            ops, cells = grouped.setdefault(key, ([], []))
            ops.extend(op for op in entry.get("ops") or () if op not in ops)
            label = _cell_label(row)
            if label not in cells:
                cells.append(label)
    return [
        [runtime, library, version, isa, ops_text(ops) or "—", source, ", ".join(cells)]
        for (runtime, library, version, isa, source), (ops, cells) in grouped.items()
    ]
