"""``fwbench list``: show models, runtimes (installed or not), the training, fit and generate runtimes, and suites with
their cell counts and rough time estimates."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from fwbench.frameworks import runtimes
from fwbench.measure import environment
from fwbench.models import all_models
from fwbench.report.listing import (
    SuiteRow,
    data_table,
    fit_table,
    generate_table,
    models_table,
    runtimes_table,
    suites_table,
    training_table,
)
from fwbench.report.table import make_console
from fwbench.runner.estimate import NOMINAL_FLOPS_PER_S_PER_THREAD, format_estimate
from fwbench.runner.phases import estimate_s
from fwbench.runner.planner import suite_plan
from fwbench.spec import SpecError
from fwbench.suites import builtin_suites, load_suite


def add_parser(commands: Any) -> None:
    """Register ``list`` on the subcommand parsers ``commands``."""
    commands.add_parser(
        "list",
        help="show models, runtimes (installed or not) and suites",
        description="Show models, runtimes (installed or not) and suites.",
    )


def suite_rows(threads: int) -> list[SuiteRow]:
    """Each built-in suite planned with its own settings at ``threads`` threads (no flags)."""
    rows = []
    for name in builtin_suites():
        suite = load_suite(name)
        try:
            plan = suite_plan(suite, threads)
        except SpecError as exc:  # e.g. a runtime registered by a plugin that is not loaded here
            rows.append(SuiteRow(name, suite.size, suite.description, problem=str(exc)))
            continue
        estimate = format_estimate(estimate_s(plan.cases, plan.settings))
        rows.append(SuiteRow(name, plan.size, suite.description, len(plan.cases), estimate))
    return rows


def command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    console = make_console()
    registered = runtimes()
    models = all_models()  # plugin models too
    console.print(models_table(models))
    console.print(runtimes_table(registered))
    console.print(training_table(models, registered))
    console.print(fit_table(models, registered))
    console.print(generate_table(models, registered))
    console.print(data_table(registered))
    threads = environment.physical_core_count()
    console.print(suites_table(suite_rows(threads), threads, NOMINAL_FLOPS_PER_S_PER_THREAD))
    return 0
