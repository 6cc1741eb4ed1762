"""The tables ``fwbench list`` prints: models, runtimes (installed or not), what one timed training call is,
the fit loops, and the suites with their cell counts and rough time estimates."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rich.table import Table

from fwbench.frameworks import RuntimeInfo, missing_requirement
from fwbench.models.base import ModelDescription


@dataclass(frozen=True)
class SuiteRow:
    """One suite as ``fwbench list`` shows it; ``runnable``/``time`` are None when it could not be planned here
    (``problem`` says why, e.g. a runtime registered by a plugin that is not loaded)."""

    name: str
    cells: int
    description: str
    runnable: int | None = None
    time: str | None = None
    problem: str | None = None


def models_table(models: Mapping[str, ModelDescription]) -> Table:
    table = Table(title="models")
    for column in ("name", "sequence axis", "max seq len", "parameters"):
        table.add_column(column)
    for name, model in models.items():
        table.add_row(
            name, "yes" if model.has_sequence else "no", str(model.max_seq_len or "—"), f"{model.parameter_count():,}"
        )
    return table


def runtimes_table(runtimes: Mapping[str, RuntimeInfo]) -> Table:
    table = Table(title="runtimes")
    for column in ("runtime", "installed", "what is timed"):
        table.add_column(column)
    for name, info in runtimes.items():
        missing = missing_requirement(info)
        table.add_row(
            name,
            "yes" if missing is None else f"no: {missing}",
            info.description + (f" ({info.note})" if info.note else ""),
        )
    return table


def training_table(models: Mapping[str, ModelDescription], runtimes: Mapping[str, RuntimeInfo]) -> Table:
    """The runtimes with phase training and what one timed call of each is."""
    table = Table(
        title="--phase training: one timed call is one optimizer step (models: "
        + ", ".join(n for n, m in models.items() if m.training_unsupported() is None)
        + ")"
    )
    for column in ("runtime", "what one timed training call is"):
        table.add_column(column)
    for name, info in runtimes.items():
        if "training" in info.phases:
            table.add_row(name, info.training)
    return table


def fit_table(models: Mapping[str, ModelDescription], runtimes: Mapping[str, RuntimeInfo]) -> Table:
    """The runtimes with phase fit and the training loop each runs."""
    table = Table(
        title="--phase fit: --epochs over a seeded in-memory dataset, one sample per epoch (models: "
        + ", ".join(n for n, m in models.items() if m.fit_unsupported() is None)
        + ")"
    )
    for column in ("runtime", "the training loop"):
        table.add_column(column)
    for name, info in runtimes.items():
        if "fit" in info.phases:
            table.add_row(name, info.fit)
    return table


def suites_table(rows: Sequence[SuiteRow], threads: int, nominal_flops_per_s_per_thread: float) -> Table:
    """The suites; times are the rough estimates of :mod:`fwbench.runner.estimate` at ``threads`` threads."""
    table = Table(
        title=f"suites (time: a rough estimate at {threads} threads, from FLOPs at a nominal "
        f"{nominal_flops_per_s_per_thread / 1e9:.0f} GFLOP/s per thread plus start-up and compile times)"
    )
    for column in ("suite", "cells", "runnable", "time", "description"):
        table.add_column(column, justify="right" if column in ("cells", "runnable", "time") else "left")
    for row in rows:
        description = row.description if row.problem is None else f"{row.description} ({row.problem})"
        table.add_row(
            row.name, str(row.cells), "—" if row.runnable is None else str(row.runnable), row.time or "—", description
        )
    return table
