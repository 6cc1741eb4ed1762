"""``fwbench report --by machine``: the same cell side by side on each machine type (hardware fingerprint) — the
hardware-evaluation view. Times only: no speed-up is computed across two machines (a ratio of times measured on
different hardware in different runs has no paired evidence behind it; within one machine, the normal report and
``compare`` give ratios with their CIs)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.markup import escape

from fwbench.report.table import RIGHT_COLUMNS, TableData, median_cell
from fwbench.report.throughput import format_rate, rates
from fwbench.spec import CASE_FIELDS
from fwbench.speedups import cell_key, machine_labels
from fwbench.store import ResultRecord
from fwbench.units import second_axis_text, short_id

CELL_FIELDS = CASE_FIELDS  # one cell across machines: the same case (model first: tables are per model)


def _order(cell: tuple[Any, ...], runtimes: dict[str, int]) -> tuple[Any, ...]:
    """Rows by phase, dtype, device, batch, sequence, workers, then runtime (first appearance)."""
    values = dict(zip(CELL_FIELDS, cell))
    return (
        values["phase"],
        values["dtype"],
        values["device"],
        values["batch_size"],
        -1 if values["seq_len"] is None else values["seq_len"],
        -1 if values["workers"] is None else values["workers"],
        values["scaling"] or "",
        -1 if values["procs"] is None else values["procs"],
        runtimes[values["runtime"]],
    )


def latest_by_machine(results: Sequence[ResultRecord]) -> dict[tuple[Any, ...], dict[str | None, ResultRecord]]:
    """Each cell (model, runtime, phase, shape, dtype, device) → its row on each machine; where several runs
    measured one cell on one machine, the newest row (by the time it was stored). Cells and machines in order of first appearance."""
    table: dict[tuple[Any, ...], dict[str | None, ResultRecord]] = {}
    for row in results:
        machines = table.setdefault(cell_key(row, CELL_FIELDS), {})
        kept = machines.get(row.hardware_id)
        if kept is None or (row.created, row.run_id) >= (kept.created, kept.run_id):  # ids follow merge order
            machines[row.hardware_id] = row
    return table


def machine_names(results: Sequence[ResultRecord]) -> dict[str | None, str]:
    """Hardware id → ``<cpu>, <N> CPUs, <M> GiB (hosts h1, h2)``, in order of first appearance."""
    hosts: dict[str | None, dict[str, None]] = {}
    for row in results:
        hosts.setdefault(row.hardware_id, {})[row.hostname or "?"] = None
    return {key: f"{label} (hosts {', '.join(hosts[key])})" for key, label in machine_labels(results).items()}


def machine_tables(results: Sequence[ResultRecord]) -> tuple[list[TableData], list[str]]:
    """One table per model: rows are cells, columns each machine's median ±95% CI (N/A with the status where it did
    not end ok) and its throughput; and the legend naming each machine."""
    names = machine_names(results)
    machines = list(names)
    by_cell = latest_by_machine(results)
    headers = ["runtime", "phase", "batch", "seq", "dtype", "device"]
    for key in machines:
        headers += [f"{short_id(key)} median", f"{short_id(key)} samples/s"]
    right = RIGHT_COLUMNS | {h for h in headers if h.endswith((" median", " samples/s"))}
    tables: list[TableData] = []
    runtimes = {name: i for i, name in enumerate(dict.fromkeys(row.runtime for row in results))}
    for model in dict.fromkeys(row.model for row in results):
        data = TableData(escape(f"{model}: by machine"), headers, frozenset(right))
        for cell, rows in sorted(by_cell.items(), key=lambda item: _order(item[0], runtimes)):
            if cell[0] != model:
                continue
            first = next(iter(rows.values()))
            line = [
                escape(first.runtime),
                escape(first.phase),
                str(first.batch_size),
                second_axis_text(first.seq_len, first.workers, first.procs, first.scaling),
                escape(first.dtype),
                escape(first.device),
            ]
            for key in machines:
                row = rows.get(key)
                if row is None:
                    line += ["—", "—"]
                    continue
                rate = rates(row, row.median_s)[0] if row.status == "ok" and row.median_s else None
                line += [median_cell(row), format_rate(rate)]
            data.rows.append(line)
        tables.append(data)
    legend = [f"machine {short_id(key)}: {name}" for key, name in names.items()]
    legend.append(
        "Times per call (median ±95% CI) and samples/s of each machine's newest run of the cell; no speed-up is "
        "computed across machines. Compare runtimes within one machine with `fwbench report` (ratios with CIs)."
    )
    return tables, legend
