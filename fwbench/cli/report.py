"""``fwbench report``: print stored results (table, JSON, CSV, Markdown), and write the spreadsheet CSVs, the
HTML page and TensorBoard runs."""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from fwbench.cli.common import (
    DB_HELP,
    TENSORBOARD_HELP,
    check_output_file,
    check_tensorboard_dir,
    given,
    resolve_run,
    run_id,
)
from fwbench.report.export import to_csv, to_json, write_csv_dir
from fwbench.report.machines import machine_tables
from fwbench.report.peak import Peak, latest_peak
from fwbench.report.profile_table import profile_groups, profile_tables
from fwbench.report.table import (
    PIPE_WIDTH,
    make_console,
    markdown_report,
    markdown_text,
    print_results,
    to_markdown,
    to_rich,
)
from fwbench.report.tensorboard import write_results
from fwbench.spec import SpecError
from fwbench.speedups import DEFAULT_BASELINE, resolve_baseline
from fwbench.store import DEFAULT_DB, ResultRecord, RunRecord, Store

REPORT_FORMATS = ("table", "json", "csv", "markdown")


def add_parser(commands: Any) -> None:
    """Register ``report`` on the subcommand parsers ``commands``."""
    report = commands.add_parser("report", help="print stored results", description="Print stored results.")
    report.add_argument("--db", default=DEFAULT_DB, help=DB_HELP)
    report.add_argument("--run", type=run_id, metavar="ID", help="only this run, or 'latest' (default: all runs)")
    report.add_argument(
        "--format",
        choices=REPORT_FORMATS,
        help="default: table (with --html or --tensorboard: none, unless --format or --out is given)",
    )
    report.add_argument("--out", type=Path, metavar="FILE", help="write the report to FILE instead of stdout")
    report.add_argument(
        "--baseline",
        metavar="RUNTIME",
        help=f"runtime the speed-ups and the pair summary are "
        f"relative to (default {DEFAULT_BASELINE}, or the first runtime when it is absent)",
    )
    report.add_argument(
        "--by",
        choices=("machine",),
        help="machine: the same cell side by side on each machine type (hardware fingerprint; the newest run of a "
        "cell on each), times and samples/s only, no speed-up across machines (table or markdown)",
    )
    report.add_argument(
        "--csv",
        type=Path,
        metavar="DIR",
        help="also write the 2019 spreadsheet layout into DIR "
        "(one CSV per model × runtime: rows batch size, columns sequence length, the median in "
        "seconds or N/A) and results.csv, every result in long format",
    )
    report.add_argument(
        "--html",
        type=Path,
        metavar="FILE",
        help="write one self-contained HTML report to FILE "
        "(works offline: summary, flags, heat maps of speed-up, latency and memory plots, parity, "
        "environment, every result)",
    )
    report.add_argument(
        "--tensorboard", type=Path, metavar="DIR", help=TENSORBOARD_HELP + " (several runs: under DIR/run<ID>/)"
    )
    report.add_argument(
        "--profile",
        action="store_true",
        help="a profile run's tables (fwbench profile) instead of benchmark results: --run ID, default the latest "
        "profile run; printed, or written to --out FILE and/or as a page to --html FILE",
    )


def _write_text(flag: str, path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"{flag} {path}: cannot write it: {exc.strerror or exc}") from None


def profile_report(args: argparse.Namespace) -> int:
    """``report --profile``: the tables of one profile run, as ``fwbench profile`` printed them."""
    others = given(args, ("format", "baseline", "csv", "tensorboard", "by"))
    if others:
        raise SpecError(f"--profile prints tables (--out, --html); it does not take {', '.join(others)}")
    with Store.open(args.db, readonly=True) as store:
        run = resolve_run(store, args.run or "latest", args.db, "--run", kind="profile")
        groups = profile_groups(store.profiles([run.id]), latest_peak(store), run.plan.settings.threads)
    if args.html is not None:
        from fwbench.report.profile_html import profile_page  # matplotlib (html.py): only when a page is written

        page = profile_page(run, groups, str(args.db))
        _write_text("--html", args.html, page)
        print(f"wrote {args.html} ({len(page.encode()) / 2**20:.2f} MiB)", file=sys.stderr)
        if args.out is None:
            return 0
    console = Console(record=True, width=PIPE_WIDTH, file=io.StringIO()) if args.out else make_console()
    console.print(escape(f"profile run {run.id} in {args.db} ({run.created}): {run.command}"))
    for item in profile_tables(groups):
        console.print(item)
    if args.out is not None:
        _write_text("--out", args.out, console.export_text())
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


def machines_report(results: Sequence[ResultRecord], report_format: str, console_out: bool) -> str:
    """``--by machine`` as a table (printed now unless ``console_out``; the text to write otherwise) or Markdown."""
    if report_format not in ("table", "markdown"):
        raise SpecError(
            f"--by machine is a table layout (--format table or markdown); --format {report_format} already has "
            "each result's hardware_id and hostname"
        )
    if not results:
        return "no results\n"
    tables, lines = machine_tables(results)
    if report_format == "markdown":
        return "\n".join([*(to_markdown(t) for t in tables), *(f"- {markdown_text(line)}" for line in lines)]) + "\n"
    console = Console(record=True, width=PIPE_WIDTH, file=io.StringIO()) if console_out else make_console()
    for table in tables:
        console.print(to_rich(table))
    for line in lines:
        console.print(Text(line, style="dim"))
    return console.export_text() if console_out else ""


def command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``fwbench report``: ``--profile``'s tables, or the stored results: the files asked for (``--csv``, ``--html``,
    ``--tensorboard``), then the report printed or written to ``--out`` (none with only files asked for)."""
    check_output_file("--out", args.out)
    check_output_file("--html", args.html)
    if args.profile:
        return profile_report(args)
    check_tensorboard_dir(args.tensorboard)
    with Store.open(args.db, readonly=True) as store:
        run_ids = None if args.run is None else [resolve_run(store, args.run, args.db, "--run").id]
        runs = [run for run in store.runs(run_ids) if run.kind == "benchmark"]
        results = store.results(run_ids)
        peak = latest_peak(store)
    try:
        baseline = resolve_baseline(results, args.baseline)
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    _write_csv(args, results, peak)
    _write_html(args, runs, results, baseline, peak)
    _write_tensorboard(args, runs, results)
    if (args.html is not None or args.tensorboard is not None) and args.format is None and args.out is None:
        return 0
    text = report_text(args, runs, results, peak)
    if args.out is not None:
        _write_text("--out", args.out, text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _write_csv(args: argparse.Namespace, results: Sequence[ResultRecord], peak: Peak | None) -> None:
    """``--csv DIR``: the 2019 spreadsheet layout and results.csv written into DIR."""
    if args.csv is None:
        return
    if args.csv.exists() and not args.csv.is_dir():
        raise SpecError(f"--csv {args.csv} is not a folder")
    try:
        written = write_csv_dir(results, args.csv, peak)
    except OSError as exc:
        raise SpecError(f"--csv {args.csv}: cannot write it: {exc.strerror or exc}") from None
    print(f"wrote {len(written)} CSV files to {args.csv}", file=sys.stderr)


def _write_html(
    args: argparse.Namespace,
    runs: Sequence[RunRecord],
    results: Sequence[ResultRecord],
    baseline: str | None,
    peak: Peak | None,
) -> None:
    """``--html FILE``: the self-contained HTML report written to FILE."""
    if args.html is None:
        return
    from fwbench.report.html import to_html  # matplotlib: imported only when a page is written

    page = to_html(runs, results, baseline=baseline, peak=peak, source=str(args.db))
    _write_text("--html", args.html, page)
    print(f"wrote {args.html} ({len(page.encode()) / 2**20:.2f} MiB)", file=sys.stderr)


def _write_tensorboard(args: argparse.Namespace, runs: Sequence[RunRecord], results: Sequence[ResultRecord]) -> None:
    """``--tensorboard DIR``: a TensorBoard run per cell written under DIR."""
    if args.tensorboard is None:
        return
    try:
        folders = write_results(args.tensorboard, results, {r.id: r.settings for r in runs})
    except OSError as exc:
        raise SpecError(f"--tensorboard {args.tensorboard}: cannot write it: {exc.strerror or exc}") from None
    print(
        f"wrote {len(folders)} TensorBoard runs to {args.tensorboard} (tensorboard --logdir {args.tensorboard})",
        file=sys.stderr,
    )


def report_text(
    args: argparse.Namespace, runs: Sequence[RunRecord], results: Sequence[ResultRecord], peak: Peak | None
) -> str:
    """The report in ``--format`` (default table) to write to ``--out``; a table with no ``--out`` is printed now
    (the text returned is then empty)."""
    report_format = args.format or "table"
    if args.by == "machine":
        return machines_report(results, report_format, console_out=args.out is not None)
    if report_format == "json":
        return to_json(runs, results, peak) + "\n"
    if report_format == "csv":
        return to_csv(results, peak)
    if report_format == "markdown":
        return markdown_report(results, f"fwbench results in {args.db}", peak, args.baseline)
    console = Console(record=True, width=PIPE_WIDTH, file=io.StringIO()) if args.out else make_console()
    print_results(results, console, title=f"fwbench results in {args.db}", peak=peak, baseline=args.baseline)
    return console.export_text() if args.out else ""
