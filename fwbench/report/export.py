"""Machine-readable exports of stored runs and results: JSON, long-format CSV, and the 2019 study's
spreadsheet layout (one CSV per model × runtime: rows batch size, columns sequence length)."""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fwbench.measure.moderate import VariancePrior
from fwbench.report.flags import compile_flags
from fwbench.report.peak import Peak, achieved_gflops, peak_fraction
from fwbench.report.throughput import throughput
from fwbench.report.walltime import wall_time
from fwbench.store import ResultRecord, RunRecord
from fwbench.store.records import COLUMN_NAMES
from fwbench.units import short_id

# The stored columns the CSV leaves out: the row's own id, its case key (the case's columns are there) and creation
# time, and its comparison group (the case's columns say it).
CSV_LEFT_OUT = frozenset({"id", "case_key", "created", "group_key"})
# What the CSV adds, computed from a row, each after the stored column it follows (the raw samples come last).
CSV_DERIVED_AFTER = {
    "first_call_s": ("time_to_first_result_s",),
    "flops": ("achieved_gflops", "peak_fraction", "samples_per_s", "tokens_per_s"),
    "wall_s": ("compile_flags",),
    "rounds": ("rounds_stop",),
}
# The CSV's header: the stored columns in their order (store.records.COLUMN_NAMES), less those left out, with the
# derived ones in place, then ``samples``. Values are the records' (``ci_low_s``/``ci_high_s``: the interval
# moderated over the run, fwbench.store.moderation; the JSON export's ``interval`` holds each cell's own).
CSV_COLUMNS: tuple[str, ...] = (
    *(
        name
        for column in COLUMN_NAMES
        if column not in CSV_LEFT_OUT
        for name in (column, *CSV_DERIVED_AFTER.get(column, ()))
    ),
    "samples",
)


def with_rates(row: ResultRecord, peak: Peak | None) -> dict[str, Any]:
    """``row`` as a dict (:meth:`ResultRecord.to_dict`) plus ``time_to_first_result_s``
    (:attr:`ResultRecord.time_to_first_result_s`), ``achieved_gflops`` (flops / median_s / 1e9, None when not ok), ``samples_per_s`` and
    ``tokens_per_s`` (training and data cells: batch, × seq_len for a sequence model, over median_s; generate cells:
    batch × new tokens over median_s; else None) and,
    with a peak, ``peak_fraction`` (achieved over the peak's GFLOP/s; None for another dtype or device)."""
    samples_s, tokens_s = throughput(row)
    rated = {
        **row.to_dict(),
        "time_to_first_result_s": row.time_to_first_result_s,
        "achieved_gflops": achieved_gflops(row),
        "samples_per_s": samples_s,
        "tokens_per_s": tokens_s,
    }
    if peak is not None:
        rated["peak_fraction"] = peak_fraction(row, peak)
    return rated


def prior_dict(prior: VariancePrior | None) -> dict[str, Any] | None:
    """A fitted prior as JSON: d₀ (``dof``; null when infinite: the variances alike within sampling noise), the
    trend log s₀² = intercept + slope · log seconds per call, the runtimes' upward shifts, the cells it was fitted on
    and their pooled degrees of freedom; None when too few cells were there to fit one."""
    if prior is None:
        return None
    return {
        "dof": prior.dof if math.isfinite(prior.dof) else None,
        "intercept": prior.intercept,
        "slope": prior.slope,
        "shifts": dict(prior.shifts),
        "cells": prior.cells,
        "pooled_dof": prior.pooled_dof,
    }


def variance_priors(rows: Sequence[ResultRecord]) -> list[dict[str, Any]]:
    """The priors one run's intervals were moderated with (:mod:`fwbench.store.moderation`), one entry per machine
    it ran on: of cell times and of paired log ratios."""
    found: dict[tuple[str | None, str | None], dict[str, Any]] = {}
    for row in rows:
        if row.priors is not None and (row.hardware_id, row.hostname) not in found:
            found[(row.hardware_id, row.hostname)] = {
                "hardware_id": row.hardware_id,
                "hostname": row.hostname,
                "times": prior_dict(row.priors.times),
                "pairs": prior_dict(row.priors.pairs),
            }
    return list(found.values())


def to_json(runs: Sequence[RunRecord], results: Sequence[ResultRecord], peak: Peak | None = None) -> str:
    """``{"runs": [...], "results": [...]}`` (and ``"peak"`` when the database holds one); each result
    carries every raw sample (seconds per call) and its achieved GFLOP/s, each run its ``wall_time``
    (:mod:`fwbench.report.walltime`: how much of it the timed blocks measured) and its ``variance_priors``."""
    runs_out = [
        {
            **r.to_dict(),
            "wall_time": wall_time([row for row in results if row.run_id == r.id]).to_dict(),
            "variance_priors": variance_priors([row for row in results if row.run_id == r.id]),
        }
        for r in runs
    ]
    data: dict[str, Any] = {"runs": runs_out, "results": [with_rates(r, peak) for r in results]}
    if peak is not None:
        data["peak"] = peak.to_dict()
    return json.dumps(data, indent=2, sort_keys=True)


def to_csv(results: Sequence[ResultRecord], peak: Peak | None = None) -> str:
    """One row per cell; ``samples`` is a space-separated list of seconds per call; ``peak_fraction``
    is empty unless the database holds a peak; ``compile_flags`` lists the compile-health flags; ``rounds_stop`` says
    why the cell's comparison group ran no more rounds (:class:`fwbench.details.RoundsStop`; empty when unknown)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in results:
        writer.writerow(
            {
                **with_rates(row, peak),
                "compile_flags": "; ".join(compile_flags(row)),
                "rounds_stop": row.interleaving.stop.reason if row.interleaving.stop else "",
                "samples": " ".join(repr(s) for s in row.samples),
            }
        )
    return out.getvalue()


# named in a sheet's file name when they vary (a distributed cell's processes and scaling: one sheet each)
SPLIT_FIELDS = ("run_id", "hardware_id", "phase", "dtype", "device", "procs", "scaling")
SPLIT_PREFIXES = {"run_id": "run", "hardware_id": "machine", "procs": "p"}
NOT_AVAILABLE = "N/A"
LONG_CSV_NAME = "results.csv"


def _file_part(value: object) -> str:
    """A store value made safe as part of a file name (``torch:eager`` → ``torch_eager``)."""
    return re.sub(r"[^A-Za-z0-9.-]+", "_", str(value)).strip("._") or "_"


def spreadsheet_tables(results: Sequence[ResultRecord]) -> dict[str, list[list[str]]]:
    """The 2019 spreadsheet layout: one table per model × runtime (× run, machine, phase, dtype, device where the
    results hold several), keyed by file name (``bert-base_torch_eager.csv``, ``..._run2_bf16.csv``,
    ``..._machine3fa2c1d0.csv``).
    Rows are batch sizes, columns sequence lengths (phase data: loader workers; one ``median_s`` column for a model
    without a sequence axis); a cell is the median in seconds per call, or ``N/A`` where the cell did not run ok or was not
    run. Every table of a model (within a run, phase, dtype and device) has the same grid: the union of
    its batch sizes and sequence lengths over all runtimes."""
    varying = [name for name in SPLIT_FIELDS if len({getattr(row, name) for row in results}) > 1]
    groups: dict[tuple[Any, ...], list[ResultRecord]] = {}
    for row in results:
        groups.setdefault((row.model, *(getattr(row, name) for name in SPLIT_FIELDS)), []).append(row)
    tables: dict[str, list[list[str]]] = {}
    for (model, *split), rows in groups.items():
        batches = sorted({row.batch_size for row in rows})
        second = "workers" if any(row.workers is not None for row in rows) else "seq_len"  # phase data: workers
        seqs = sorted({getattr(row, second) for row in rows if getattr(row, second) is not None})
        has_seq = bool(seqs)
        values = dict(zip(SPLIT_FIELDS, split))
        suffix = "".join(
            f"_{SPLIT_PREFIXES.get(name, '')}{_file_part(short_id(values[name]) if name == 'hardware_id' else values[name])}"
            for name in varying
            if values[name] is not None  # a cell of one process among distributed ones: no process suffix
        )
        for runtime in dict.fromkeys(row.runtime for row in rows):
            cells = {(row.batch_size, getattr(row, second)): row for row in rows if row.runtime == runtime}

            def value(batch: int, seq: int | None, cells: dict[tuple[int, int | None], ResultRecord] = cells) -> str:
                row = cells.get((batch, seq))
                if row is None or row.status != "ok" or row.median_s is None:
                    return NOT_AVAILABLE
                return repr(float(row.median_s))

            header = [f"batch_size\\{second}", *map(str, seqs)] if has_seq else ["batch_size", "median_s"]
            body = [[str(b), *(value(b, s) for s in (seqs if has_seq else [None]))] for b in batches]
            name = f"{_file_part(model)}_{_file_part(runtime)}{suffix}"
            while f"{name}.csv" in tables:  # two store names that sanitise alike keep a file each
                name += "_"
            tables[f"{name}.csv"] = [header, *body]
    return tables


def write_csv_dir(results: Sequence[ResultRecord], folder: Path, peak: Peak | None = None) -> list[Path]:
    """Write :func:`spreadsheet_tables` and the long-format :func:`to_csv` (``results.csv``) into ``folder``
    (created if missing); returns the paths written. OSError when the folder cannot be written."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, table in spreadsheet_tables(results).items():
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows(table)
        (folder / name).write_text(out.getvalue())
        written.append(folder / name)
    (folder / LONG_CSV_NAME).write_text(to_csv(results, peak))
    written.append(folder / LONG_CSV_NAME)
    return written
