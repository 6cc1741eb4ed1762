"""The tables ``fwbench list`` prints: models, runtimes (installed or not), what one timed training call is,
the fit loops, and the suites with their cell counts and rough time estimates."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from rich.table import Table

from fwbench.frameworks import RuntimeInfo, missing_requirement
from fwbench.models.base import ModelDescription
from fwbench.models.decoder import CausalDecoder


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


def _phase_table(
    title: str, runtimes: Mapping[str, RuntimeInfo], phase: str, columns: Mapping[str, Callable[[RuntimeInfo], str]]
) -> Table:
    """The runtimes with ``phase``, one column per ``columns`` entry (header → what it shows of a runtime)."""
    table = Table(title=title)
    for column in ("runtime", *columns):
        table.add_column(column)
    for name, info in runtimes.items():
        if phase in info.phases:
            table.add_row(name, *(show(info) for show in columns.values()))
    return table


def training_table(models: Mapping[str, ModelDescription], runtimes: Mapping[str, RuntimeInfo]) -> Table:
    """The runtimes with phase training and what one timed call of each is."""
    trained = ", ".join(n for n, m in models.items() if m.training_unsupported() is None)
    title = f"--phase training: one timed call is one optimizer step (models: {trained})"
    return _phase_table(title, runtimes, "training", {"what one timed training call is": lambda i: i.training})


def generate_table(models: Mapping[str, ModelDescription], runtimes: Mapping[str, RuntimeInfo]) -> Table:
    """The runtimes with phase generate, and the inference runtimes without it, each with why."""
    decoders = ", ".join(n for n, m in models.items() if isinstance(m, CausalDecoder))
    title = (
        "--phase generate: greedy decoding with a key/value cache, one prefill call then one decode call per token "
        f"(models: {decoders})"
    )
    table = Table(title=title)
    for column in ("runtime", "generate"):
        table.add_column(column)
    for name, info in runtimes.items():
        if "generate" in info.phases:
            table.add_row(name, "yes")
        elif "inference" in info.phases and not info.unavailable:
            table.add_row(name, f"no: {info.no_generate or 'not built yet'}")
    return table


def fit_table(models: Mapping[str, ModelDescription], runtimes: Mapping[str, RuntimeInfo]) -> Table:
    """The runtimes with phase fit, the training loop each runs and the loader it reads --input images with."""
    fitted = ", ".join(n for n, m in models.items() if m.fit_unsupported() is None)
    title = f"--phase fit: --epochs over a seeded in-memory dataset, one sample per epoch (models: {fitted})"
    columns = {"the training loop": lambda i: i.fit, "--input images through": lambda i: i.fit_loader or "—"}
    return _phase_table(title, runtimes, "fit", columns)


def data_table(runtimes: Mapping[str, RuntimeInfo]) -> Table:
    """The loader runtimes (phase data) and the pipeline each times."""
    title = (
        "--phase data: one timed call is one batch of decoded, cropped, flipped and normalised float32 images "
        "(models: the dataset's name, e.g. images-256; --workers is a grid axis)"
    )
    return _phase_table(title, runtimes, "data", {"the input pipeline": lambda i: i.data})


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
