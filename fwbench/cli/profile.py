"""``fwbench profile``: each cell in a fresh worker, a few warm calls under its framework's own profiler, the
profiles lined up in one op-category table per model × shape. Profiled calls are never benchmark samples."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.markup import escape

from fwbench import __version__
from fwbench.cli.common import DB_HELP, directory, positive_float, positive_int, terminate_on_sigterm
from fwbench.cli.run_plan import plan_choices
from fwbench.diskfull import DiskFull, cells_kept, low_space_cause
from fwbench.measure import environment
from fwbench.profile.cells import profiled_cell
from fwbench.report.peak import latest_peak
from fwbench.report.profile_table import profile_groups, profile_tables
from fwbench.report.table import make_console
from fwbench.runner.outcome import run_worker
from fwbench.runner.phases import phase_names
from fwbench.runner.planner import resolve_plan
from fwbench.spec import DTYPES, Case, Plan
from fwbench.store import DEFAULT_DB, Store

PROFILE_PHASES = phase_names(lambda phase: phase.profilable)
DEFAULT_OUT = "results/profiles"
DEFAULT_CALLS = 5


def add_parser(commands: Any) -> None:
    """Register ``profile`` on the subcommand parsers ``commands``."""
    parser = commands.add_parser(
        "profile",
        help="profile a few calls of each cell with its framework's own profiler and line the profiles up",
        description="Each cell runs in a fresh worker, warms up, times --calls calls, then records as many under "
        "its framework's profiler (torch.profiler, TensorFlow's profiler, jax.profiler; Keras through its "
        "backend's). The raw traces stay under --out/<model>/<framework>_<mode>/<shape>/ for Perfetto or "
        "TensorBoard; the table shows, per model and shape, self time per op category, the union of the op "
        "intervals, the framework overhead (wall time outside every op) and the profiler's own overhead.",
    )
    parser.add_argument("--models", required=True, help="comma-separated model names (see `fwbench list`)")
    parser.add_argument("--runtimes", required=True, help="comma-separated framework:mode runtimes")
    parser.add_argument("--batch-sizes", default="1", help="comma-separated positive integers (default 1)")
    parser.add_argument("--seq-lens", help="comma-separated positive integers; ignored by models without a sequence")
    parser.add_argument("--phase", choices=PROFILE_PHASES, default="inference", help="default: inference")
    parser.add_argument("--dtype", choices=DTYPES, default="fp32", help="default: fp32")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="default: cpu")
    add_profiled_cell_flags(parser, DEFAULT_CALLS)
    parser.add_argument(
        "--db",
        default=DEFAULT_DB,
        help=f"{DB_HELP}; the profiles go into a run of kind 'profile', which benchmark reports never read",
    )


def add_profiled_cell_flags(parser: argparse.ArgumentParser, default_calls: int) -> None:
    """The flags of a profiled cell that ``profile`` and ``explain`` share: --threads, --calls (``default_calls``),
    --timeout and --out."""
    parser.add_argument("--threads", type=positive_int, help="thread budget per cell (default: physical cores)")
    parser.add_argument(
        "--calls",
        type=positive_int,
        default=default_calls,
        help=f"calls timed without the profiler, and as many profiled (default {default_calls})",
    )
    parser.add_argument("--timeout", type=positive_float, metavar="SECONDS", help="per cell (default 600)")
    parser.add_argument(
        "--out", type=directory, default=DEFAULT_OUT, help=f"folder for the raw traces (default {DEFAULT_OUT})"
    )


def trace_folder(out: Path, case: Case) -> Path:
    """``out/<model>/<framework>_<mode>/<phase>-<dtype>-b<batch>[-s<seq>]``: one folder per profiled cell."""
    shape = f"b{case.batch_size}" + (f"-s{case.seq_len}" if case.seq_len is not None else "")
    return out / case.model / case.runtime.replace(":", "_") / f"{case.phase}-{case.dtype}-{shape}"


def profile_cases(
    store: Store, run_id: int, plan: Plan, out: Path, calls: int, db: str, *, finish: bool = True
) -> None:
    """Each of ``plan``'s cells profiled in a fresh worker (``calls`` calls without the profiler and as many under
    it, the raw trace under ``out``) and stored in profile run ``run_id``, a line per cell on stderr; with
    ``finish``, the run is finished. DiskFull (saying what was kept) when a trace finds no room."""
    profiled = 0
    try:
        for skipped in plan.skipped:
            store.add_profile(run_id, skipped.case, "skipped", skipped.reason, None, {})
        for index, case in enumerate(plan.cases, start=1):
            folder = trace_folder(out, case)
            outcome = run_worker(case, plan.settings, profile_to=str(folder), profile_calls=calls)
            status, reason, cell = outcome.status, outcome.reason, None
            if outcome.details.get("disk_full"):  # the trace, or another write of the worker, found no room
                raise DiskFull.from_report(outcome.details["disk_full"], folder)
            if status == "ok":
                try:
                    cell = profiled_cell(outcome.details["profile"])
                except (KeyError, ValueError, OSError) as exc:
                    # torch.profiler only logs a trace it could not write: none, or half of one, is left
                    cause = low_space_cause(folder, "no complete trace")
                    if cause is not None:
                        raise DiskFull(folder, cause) from exc
                    status, reason = "error", f"the profile could not be read: {exc}"
            store.add_profile(run_id, case, status, reason, cell, outcome.details)
            profiled += 1
            line = f"[{index}/{len(plan.cases)}] {case.label()}: {status}" + (f" ({reason})" if reason else "")
            print(line, file=sys.stderr, flush=True)
        if finish:
            store.finish_run(run_id)
    except DiskFull as full:  # the profiles stored before stay, with their traces
        kept = f"{cells_kept(profiled, 'profiled')} (profile run {run_id} of {db}, traces under {out})"
        raise full.told(kept, "profile again") from full


def command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    plan = resolve_plan(plan_choices(args, {"rounds": 1}))  # one worker per cell: no rounds to interleave
    terminate_on_sigterm()
    out = Path(args.out)
    with Store.open(args.db) as store:
        run_id = store.create_run(
            plan, shlex.join(["fwbench", *argv]), environment.collect(), __version__, kind="profile"
        )
        profile_cases(store, run_id, plan, out, args.calls, args.db)
        records = store.profiles([run_id])
        peak = latest_peak(store)
    console = make_console()
    console.print(escape(f"profile run {run_id} in {args.db}; raw traces under {out}"))
    for item in profile_tables(profile_groups(records, peak, plan.settings.threads)):
        console.print(item)
    return 0
