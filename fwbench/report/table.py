"""Terminal tables of results with rich: median ± CI half-width, first call, peak memory, status.

Columns whose value is the same in every row (run, phase, dtype, device) move into the title.
"""

from __future__ import annotations

import sys
from typing import Any, Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fwbench.report.units import format_bytes, format_seconds

NOISY_REL_CI = 0.05
PIPE_WIDTH = 160  # rich would wrap at 80 columns when stdout is not a terminal
OPTIONAL_COLUMNS = (("run_id", "run"), ("phase", "phase"), ("dtype", "dtype"), ("device", "device"))


def make_console() -> Console:
    """A console for stdout, wide enough for the tables when output goes to a pipe or file."""
    return Console() if sys.stdout.isatty() else Console(width=PIPE_WIDTH)


def _median_cell(row: dict[str, Any]) -> str:
    if row["median_s"] is None:
        return "—"
    text = format_seconds(row["median_s"])
    if row["ci_low_s"] is not None and row["median_s"] > 0:
        half = (row["ci_high_s"] - row["ci_low_s"]) / 2 / row["median_s"]
        text += f" ±{half:.1%}" + (" [yellow]noisy[/]" if half > NOISY_REL_CI else "")
    return text


def results_table(results: Sequence[dict[str, Any]], title: str | None = None) -> Table:
    """One row per cell, in stored order; constant columns are stated once in the title."""
    varying = [(key, label) for key, label in OPTIONAL_COLUMNS if len({r[key] for r in results}) > 1]
    constant = [f"{label} {results[0][key]}" for key, label in OPTIONAL_COLUMNS if (key, label) not in varying]
    caption = ", ".join(constant)
    table = Table(title=f"{title} ({caption})" if title and caption else title or caption)
    headers = [label for _, label in varying] + [
        "model", "runtime", "batch", "seq", "status", "median ±95% CI", "first call", "peak RSS", "samples", "note"]
    for header in headers:
        right = header in ("run", "batch", "seq", "median ±95% CI", "first call", "peak RSS", "samples")
        table.add_column(header, justify="right" if right else "left", overflow="fold")
    for row in results:
        ok = row["status"] == "ok"
        table.add_row(
            *(escape(str(row[key])) for key, _ in varying),
            escape(row["model"]), escape(row["runtime"]), str(row["batch_size"]),
            "—" if row["seq_len"] is None else str(row["seq_len"]),
            row["status"] if ok else f"[red]{row['status']}[/]",
            _median_cell(row), format_seconds(row["first_call_s"]), format_bytes(row["peak_memory_bytes"]),
            f"{row['n_samples']}×{row['calls_per_sample']}" if row["n_samples"] else "—",
            "" if ok else escape(row["reason"] or ""),
        )
    return table


def print_results(results: Sequence[dict[str, Any]], console: Console, title: str | None = None) -> None:
    if not results:
        console.print("no results")
        return
    console.print(results_table(results, title))
