"""``fwbench compare``: compare two runs cell by cell; exit 1 on a significant regression."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from rich.table import Table
from rich.text import Text

from fwbench.cli.common import fraction, resolve_run, run_id
from fwbench.report.compare import DEFAULT_THRESHOLD, compare_runs, comparison_legend, comparison_tables, verdict_line
from fwbench.report.profile_compare import compare_profiles, profile_comparison_tables
from fwbench.report.table import make_console, to_rich
from fwbench.spec import SpecError
from fwbench.store import DEFAULT_DB, RunRecord, Store

COMPARE_FORMATS = ("table", "json")
T = TypeVar("T")


def add_parser(commands: Any) -> None:
    """Register ``compare`` on the subcommand parsers ``commands``."""
    compare = commands.add_parser(
        "compare",
        help="compare two runs cell by cell; exit 1 on a significant regression",
        description="Match the cells of two runs by model, runtime, phase, shape, dtype and device; print each "
        "cell's time ratio B/A with its 95% CI and significance (Mann–Whitney U, Holm-adjusted), the geometric "
        "mean of B/A, the cells only one run has, and the environment differences. Exit 0 when no cell regressed "
        "significantly beyond --threshold, 1 when one did (or broke: ok in A, not ok in B), 2 on bad input. "
        "--profile: two profile runs, per cell and op category, descriptive (exit 0).",
    )
    compare.add_argument("run_a", type=run_id, metavar="RUN_A", help="run id (or 'latest') in --db")
    compare.add_argument("run_b", type=run_id, metavar="RUN_B", help="run id (or 'latest') in --db-b")
    compare.add_argument("--db", default=DEFAULT_DB, help=f"database of RUN_A (default {DEFAULT_DB})")
    compare.add_argument("--db-b", metavar="PATH", help="database of RUN_B (default: --db)")
    compare.add_argument(
        "--threshold",
        type=fraction,
        default=DEFAULT_THRESHOLD,
        metavar="FRACTION",
        help=f"slow-down a significant cell may have before it counts as a regression "
        f"(default {DEFAULT_THRESHOLD:g}, i.e. {DEFAULT_THRESHOLD * 100:g}%%)",
    )
    compare.add_argument("--format", choices=COMPARE_FORMATS, default="table", help="default: table")
    compare.add_argument(
        "--profile",
        action="store_true",
        help="compare two profile runs (fwbench profile): per cell and op category the time per profiled call "
        "in A and B; descriptive, always exit 0 ('latest': the newest profile run)",
    )


def _two_runs(
    args: argparse.Namespace, kind: str, read: Callable[[Store, RunRecord], T]
) -> tuple[RunRecord, T, RunRecord, T, str]:
    """RUN_A of ``--db`` and RUN_B of ``--db-b`` (default: the same database, opened once), both of ``kind``, and
    what ``read`` takes of each; with the path RUN_B came from."""
    db_b = args.db_b or args.db
    with Store.open(args.db, readonly=True) as store_a:
        run_a = resolve_run(store_a, args.run_a, args.db, "RUN_A", kind=kind)
        read_a = read(store_a, run_a)
        if db_b == args.db:
            run_b = resolve_run(store_a, args.run_b, db_b, "RUN_B", kind=kind)
            return run_a, read_a, run_b, read(store_a, run_b), db_b
    with Store.open(db_b, readonly=True) as store_b:
        run_b = resolve_run(store_b, args.run_b, db_b, "RUN_B", kind=kind)
        return run_a, read_a, run_b, read(store_b, run_b), db_b


def _compare_profiles(args: argparse.Namespace) -> int:
    """``compare --profile``: the two profile runs' category tables, A → B."""
    run_a, records_a, run_b, records_b, db_b = _two_runs(args, "profile", lambda store, run: store.profiles([run.id]))
    comparison = compare_profiles(records_a, records_b)
    if not comparison.pairs:
        raise SpecError(
            f"profile run {run_a.id} of {args.db} and profile run {run_b.id} of {db_b} have no cell profiled in "
            "both (same model, runtime, phase, shape, dtype and device); nothing to compare"
        )
    if args.format == "json":
        print(json.dumps(comparison.to_dict(), indent=2, sort_keys=True))
        return 0
    console = make_console()
    for item in profile_comparison_tables(comparison, f"run {run_a.id} of {args.db}", f"run {run_b.id} of {db_b}"):
        if isinstance(item, Table):
            console.print(item)
        else:  # one line however long (it names the databases): rich would break it at the console's width
            console.print(Text(item, style="dim"), soft_wrap=True)
    return 0


def command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Exit 0: no significant regression beyond --threshold; 1: at least one (or a cell that broke). With
    --profile: 0 (descriptive)."""
    if args.profile:
        return _compare_profiles(args)
    run_a, results_a, run_b, results_b, db_b = _two_runs(args, "benchmark", lambda store, run: store.results([run.id]))
    comparison = compare_runs(run_a, results_a, run_b, results_b, args.threshold)
    if not comparison.cells:
        raise SpecError(
            f"run {run_a.id} of {args.db} and run {run_b.id} of {db_b} have no cell in common "
            "(same model, runtime, phase, shape, dtype and device); nothing to compare"
        )
    for warning in (comparison.machine_warning, comparison.shift_warning):
        if warning is not None:
            print(f"fwbench: {warning}", file=sys.stderr)
    if args.format == "json":
        print(json.dumps(comparison.to_dict(), indent=2, sort_keys=True))
    else:
        console = make_console()
        label_a, label_b = f"run {run_a.id} of {args.db}", f"run {run_b.id} of {db_b}"
        for data in comparison_tables(comparison, label_a, label_b):
            console.print(to_rich(data))
        for line in comparison_legend(comparison):
            console.print(Text(line, style="dim"))
        print(verdict_line(comparison))
    return 1 if comparison.failed else 0
