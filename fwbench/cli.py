"""fwbench: benchmark deep-learning frameworks against each other, honestly (run | verify | weights | report | list | env).

Bad input gets one line on stderr, exit status 2, and nothing written.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import shlex
import signal
import sys
from pathlib import Path
from typing import Any, NoReturn, Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fwbench import __version__
from fwbench.frameworks import get_runtime, missing_requirement, runtimes
from fwbench.measure import environment
from fwbench.models import MODELS, get_model
from fwbench.models.weights_io import load_weights, save_weights
from fwbench.report.export import to_csv, to_json
from fwbench.report.table import PIPE_WIDTH, make_console, print_results
from fwbench.report.units import parse_bytes
from fwbench.runner.manager import execute
from fwbench.runner.planner import build_plan, parse_names, parse_positive_ints
from fwbench.runner.progress import sweep_progress
from fwbench.runner.verify import verify_model
from fwbench.spec import MAX_COUNT, PROTOCOLS, RUNNABLE_DTYPES, RUNNABLE_PHASES, Plan, Settings, SpecError
from fwbench.store import DEFAULT_DB, Store, StoreError
from fwbench.suites import DEFAULT_SUITE, builtin_suites, load_suite

EXIT_USAGE = 2
RUN_DEVICES = ("cpu", "cuda")
REPORT_FORMATS = ("table", "json", "csv")


class UsageError(Exception):
    """Bad input: one line for the user, exit status 2."""


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line instead of usage text."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: error: {message}")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive finite number")
    return value


def _positive_int(text: str) -> int:
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit()) or not 0 < int(digits) <= MAX_COUNT:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer up to {MAX_COUNT}")
    return int(text)


def _run_id(text: str) -> int | str:
    return "latest" if text == "latest" else _positive_int(text)


def _bytes(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None


def build_parser() -> Parser:
    parser = Parser(prog="fwbench", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"fwbench {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser, metavar="COMMAND")

    run = commands.add_parser(
        "run", help="sweep a grid of cells, each in a fresh worker, into the results database",
        description="Sweep models × runtimes × batch sizes × sequence lengths. Each cell runs in a fresh "
        "worker process; every cell gets a terminal status (ok, oom, timeout, error, skipped, mismatch) "
        "committed to the database at once.",
    )
    grid = run.add_argument_group("grid (flags override the suite)")
    grid.add_argument("--suite", help=f"built-in suite name ({', '.join(builtin_suites())}) or a .toml path; "
                      f"default: {DEFAULT_SUITE} unless --models and --runtimes are given")
    grid.add_argument("--models", help="comma-separated model names (see `fwbench list`)")
    grid.add_argument("--runtimes", help="comma-separated framework:mode runtimes (see `fwbench list`)")
    grid.add_argument("--batch-sizes", help="comma-separated positive integers, e.g. 1,2,4,8")
    grid.add_argument("--seq-lens", help="comma-separated positive integers; ignored by models without a "
                      "sequence axis")
    grid.add_argument("--phase", choices=RUNNABLE_PHASES, help="default: inference")
    grid.add_argument("--dtype", choices=RUNNABLE_DTYPES, help="default: fp32")
    grid.add_argument("--device", choices=RUN_DEVICES, help="default: cpu")
    timing = run.add_argument_group("measurement")
    timing.add_argument("--protocol", choices=PROTOCOLS,
                        help="adaptive (default): blocks of ≥10 ms until the median's 95%% CI is within ±1%% or "
                        "--max-time is spent; hf2019: timeit repeat=30 number=3, as the 2019 study")
    timing.add_argument("--max-time", type=_positive_float, metavar="SECONDS",
                        help="adaptive: timing budget per cell (default 5)")
    timing.add_argument("--threads", type=_positive_int,
                        help=f"intra-op threads for every framework (default: physical cores, here "
                        f"{environment.physical_core_count()})")
    timing.add_argument("--interop-threads", type=_positive_int, help="inter-op threads (default 1)")
    timing.add_argument("--warmup", type=_positive_int, metavar="CALLS",
                        help="untimed calls after the first call (default 2, minimum 2)")
    timing.add_argument("--seed", type=int, help="seed of weights and inputs (default 0)")
    timing.add_argument("--weights", metavar="FILE", help="safetensors weights (Hugging Face / torchvision names) "
                        "for the one model of the run, instead of the seeded canonical weights")
    limits = run.add_argument_group("limits (a cell over a limit is stored as timeout or oom)")
    limits.add_argument("--timeout", type=_positive_float, metavar="SECONDS", help="per cell (default 600)")
    limits.add_argument("--memory-limit", type=_bytes, metavar="BYTES",
                        help="kill a worker whose resident memory exceeds this (e.g. 2G, 512M)")
    run.add_argument("--db", default=DEFAULT_DB, help=f"SQLite results database (default {DEFAULT_DB})")
    run.add_argument("--resume", type=_positive_int, metavar="RUN_ID",
                     help="run only the cells of that run's stored plan that have no status yet")

    report = commands.add_parser("report", help="print stored results", description="Print stored results.")
    report.add_argument("--db", default=DEFAULT_DB, help=f"SQLite results database (default {DEFAULT_DB})")
    report.add_argument("--run", type=_run_id, metavar="ID", help="only this run, or 'latest' (default: all runs)")
    report.add_argument("--format", choices=REPORT_FORMATS, default="table", help="default: table")
    report.add_argument("--out", type=Path, metavar="FILE", help="write the report to FILE instead of stdout")

    verify = commands.add_parser(
        "verify", help="check that runtimes compute the same outputs with the same weights",
        description="Build each model in each runtime (each in its own worker) with the same weights and inputs, "
        "compare every output with the first runtime's and with the float64 numpy reference (relative L2 "
        "error ≤ 1e-4 for fp32), print a table, and exit 1 on any mismatch or failure.",
    )
    verify.add_argument("--models", required=True, help="comma-separated model names")
    verify.add_argument("--runtimes", required=True, help="comma-separated runtimes; the first is the comparison base")
    verify.add_argument("--weights", type=Path, metavar="FILE", help="safetensors weights (one model only); "
                        "default: the seeded canonical weights")
    verify.add_argument("--dump", type=Path, metavar="DIR", help="write DIR/<model>/inputs.npz and "
                        "DIR/<model>/<framework>_<mode>.npz with every output by name")
    verify.add_argument("--batch-size", type=_positive_int, help="default: the model's parity shape (2)")
    verify.add_argument("--seq-len", type=_positive_int, help="default: the model's parity shape (16)")
    verify.add_argument("--threads", type=_positive_int, help="intra-op threads (default: physical cores)")
    verify.add_argument("--seed", type=int, default=0, help="seed of weights and inputs (default 0)")
    verify.add_argument("--timeout", type=_positive_float, default=600.0, metavar="SECONDS", help="per runtime")

    weights = commands.add_parser("weights", help="write a model's canonical weights to a safetensors file",
                                  description="Write a model's seeded canonical weights (Hugging Face / "
                                  "torchvision names and layouts) to a safetensors file.")
    weights.add_argument("model", help="model name (see `fwbench list`)")
    weights.add_argument("--out", type=Path, required=True, metavar="FILE.safetensors")
    weights.add_argument("--seed", type=int, default=0, help="default 0")

    commands.add_parser("list", help="show models, runtimes (installed or not) and suites",
                        description="Show models, runtimes (installed or not) and suites.")
    env = commands.add_parser("env", help="print the environment record stored with each run",
                              description="Print the environment record stored with each run, as JSON.")
    env.add_argument("--format", choices=("json", "table"), default="table", help="default: table")
    return parser


# -- run ----------------------------------------------------------------------------------------
SETTINGS_FLAGS = {
    "threads": "threads", "interop_threads": "interop_threads", "protocol": "protocol", "max_time": "max_time_s",
    "warmup": "warmup_calls", "timeout": "timeout_s", "memory_limit": "memory_limit_bytes", "seed": "seed",
    "weights": "weights_path",
}
GRID_FLAGS = ("suite", "models", "runtimes", "batch_sizes", "seq_lens", "phase", "dtype", "device")


def _given(args: argparse.Namespace, names: Sequence[str]) -> list[str]:
    """The flags among ``names`` that the user gave (an empty string counts as given)."""
    return ["--" + name.replace("_", "-") for name in names if getattr(args, name) is not None]


def check_threads_fit(settings: Settings) -> None:
    """Refuse a thread budget larger than the CPUs this process may use (it could not be pinned)."""
    usable = len(os.sched_getaffinity(0))
    if settings.threads > usable:
        raise SpecError(f"--threads {settings.threads} exceeds the {usable} CPUs this process may use")


def plan_from_args(args: argparse.Namespace) -> Plan:
    """Flags over suite over defaults; SpecError on any invalid choice."""
    if args.suite is None and (args.models is None) != (args.runtimes is None):
        raise SpecError("give both --models and --runtimes, or a --suite")
    use_suite = args.suite is not None or args.models is None
    suite = load_suite(DEFAULT_SUITE if args.suite is None else args.suite) if use_suite else None
    settings_data: dict[str, Any] = {"threads": environment.physical_core_count()}
    if suite is not None:
        settings_data.update(suite.settings)
    settings_data.update(
        {field: getattr(args, flag) for flag, field in SETTINGS_FLAGS.items() if getattr(args, flag) is not None}
    )
    settings = Settings.from_dict(settings_data)
    check_threads_fit(settings)

    def pick(flag: str, parse: Any, from_suite: Any, default: Any) -> Any:
        value = getattr(args, flag)
        if value is not None:
            return parse("--" + flag.replace("_", "-"), value) if parse else value
        return from_suite if suite is not None else default

    plan = build_plan(
        pick("models", parse_names, suite and suite.models, []),
        pick("runtimes", parse_names, suite and suite.runtimes, []),
        pick("batch_sizes", parse_positive_ints, suite and suite.batch_sizes, [1]),
        pick("seq_lens", parse_positive_ints, suite and suite.seq_lens, []),
        settings,
        phase=pick("phase", None, suite and suite.phase, "inference"),
        dtype=pick("dtype", None, suite and suite.dtype, "fp32"),
        device=pick("device", None, suite and suite.device, "cpu"),
        suite=suite.name if suite else None,
    )
    if settings.weights_path is not None:
        check_weights_file(plan, settings.weights_path)
    return plan


def check_weights_file(plan: Plan, path: str) -> None:
    """A weights file belongs to one model: refuse it for a plan of several, or if it does not fit."""
    models = sorted({case.model for case in (*plan.cases, *(s.case for s in plan.skipped))})
    if len(models) != 1:
        raise SpecError(f"--weights holds one model's weights; the plan has {len(models)} models ({', '.join(models)})")
    try:
        load_weights(get_model(models[0]), Path(path))
    except ValueError as exc:
        raise SpecError(str(exc)) from None


def _terminate_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit so the running worker is killed on the way out."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def command_run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    if args.resume is not None:
        given = _given(args, [*GRID_FLAGS, *SETTINGS_FLAGS])
        if given:
            raise SpecError(f"--resume reruns a stored plan with its stored settings; drop {', '.join(given)}")
        store = Store.open(args.db, create=False)
        record = store.get_run(args.resume)
        if record is None:
            known = [r.id for r in store.runs()]
            raise SpecError(f"run {args.resume} is not in {args.db}; runs there: {known or 'none'}")
        plan, run_id = record.plan, record.id
        check_threads_fit(plan.settings)
    else:
        plan = plan_from_args(args)
        store = Store.open(args.db)
        command = shlex.join(["fwbench", *argv])
        run_id = store.create_run(plan, command, environment.collect(), __version__)
    _terminate_on_sigterm()
    with store:
        remaining = plan.size - len(store.done_keys(run_id))
        err = sys.stderr
        print(f"run {run_id}: {remaining} of {plan.size} cells to run, database {args.db}", file=err, flush=True)
        try:
            with sweep_progress(remaining) as listener:
                execute(store, run_id, plan, listener)
        except KeyboardInterrupt:
            print(f"fwbench: interrupted; finished cells are stored; continue with "
                  f"`fwbench run --resume {run_id} --db {args.db}`", file=sys.stderr)
            return 130
        store.finish_run(run_id)
        results = store.results([run_id])
        print_results(results, make_console(), title="fwbench results")
        counts: dict[str, int] = {}
        for row in results:
            counts[row["status"]] = counts.get(row["status"], 0) + 1
        summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        print(f"run {run_id}: {summary}. Results are in {args.db}; see `fwbench report --db {args.db} --run {run_id}`")
    return 0


# -- report, list, env --------------------------------------------------------------------------
def command_report(args: argparse.Namespace) -> int:
    if args.out is not None and (args.out.is_dir() or not args.out.parent.is_dir()):
        raise SpecError(f"--out {args.out}: give a file path in an existing folder")
    with Store.open(args.db, readonly=True) as store:
        run_id = store.latest_run_id() if args.run == "latest" else args.run
        if args.run is not None and (run_id is None or store.get_run(run_id) is None):
            known = [r.id for r in store.runs()]
            raise SpecError(f"run {args.run} is not in {args.db}; runs there: {known or 'none'}")
        run_ids = None if run_id is None else [run_id]
        runs, results = store.runs(run_ids), store.results(run_ids)
    if args.format == "json":
        text = to_json(runs, results) + "\n"
    elif args.format == "csv":
        text = to_csv(results)
    else:
        console = Console(record=True, width=PIPE_WIDTH, file=io.StringIO()) if args.out else make_console()
        print_results(results, console, title=f"fwbench results in {args.db}")
        text = console.export_text() if args.out else ""
    if args.out is not None:
        try:
            args.out.write_text(text)
        except OSError as exc:
            raise SpecError(f"--out {args.out}: cannot write it: {exc.strerror or exc}") from None
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def command_verify(args: argparse.Namespace) -> int:
    models = parse_names("--models", args.models)
    runtime_names = parse_names("--runtimes", args.runtimes)
    for name in models:
        get_model(name)
    for name in runtime_names:
        get_runtime(name)
    if args.weights is not None:
        if len(models) != 1:
            raise SpecError("--weights holds one model's weights: give exactly one model")
        try:
            load_weights(get_model(models[0]), args.weights)
        except ValueError as exc:
            raise SpecError(str(exc)) from None
    if args.dump is not None and args.dump.exists() and not args.dump.is_dir():
        raise SpecError(f"--dump {args.dump} is not a folder")
    for name in models:
        model = get_model(name)
        if args.seq_len is not None and model.supports_seq_len(args.seq_len):
            raise SpecError(model.supports_seq_len(args.seq_len) or "")
    settings = Settings(threads=args.threads or environment.physical_core_count(), timeout_s=args.timeout,
                        max_time_s=min(5.0, args.timeout / 2), seed=args.seed)
    check_threads_fit(settings)
    table = Table(title="fwbench verify (relative L2 error; max abs error in brackets)")
    for column in ("model", "runtime", "output", "shape", "vs first runtime", "vs float64 reference", "verdict"):
        table.add_column(column)
    failures = 0
    for name in models:
        checks = verify_model(name, runtime_names, settings, args.batch_size, args.seq_len, args.weights, args.dump)
        for check in checks:
            failures += not check.passed
            if check.output is None or check.status != "ok":
                verdict = "skipped" if check.status == "skipped" else f"[red]{check.status}[/]"
                table.add_row(name, check.runtime, check.output or "—", "—", "—", "—",
                              f"{verdict}: {escape(check.reason or '')}")
                continue
            table.add_row(
                name, check.runtime, check.output, "×".join(map(str, check.shape or ())),
                _error_cell(check.rel_l2_vs_first, check.max_abs_vs_first),
                _error_cell(check.rel_l2_vs_reference, check.max_abs_vs_reference),
                "ok" if check.passed else f"[red]mismatch (> {check.tolerance:g})[/]",
            )
    make_console().print(table)
    if args.dump is not None:
        print(f"outputs and inputs written under {args.dump}", file=sys.stderr)
    return 1 if failures else 0


def _error_cell(rel_l2: float | None, max_abs: float | None) -> str:
    return "—" if rel_l2 is None else f"{rel_l2:.2e} [{max_abs:.1e}]"


def command_weights(args: argparse.Namespace) -> int:
    model = get_model(args.model)
    if args.out.is_dir() or not args.out.parent.is_dir():
        raise SpecError(f"--out {args.out}: give a file path in an existing folder")
    try:
        save_weights(model, model.canonical_weights(args.seed), args.out, args.seed)
    except OSError as exc:
        raise SpecError(f"--out {args.out}: cannot write it: {exc.strerror or exc}") from None
    count = model.parameter_count()
    print(f"wrote {args.out}: {args.model}, {len(model.param_schema())} tensors, {count:,} parameters, seed {args.seed}",
          file=sys.stderr)
    return 0


def command_list() -> int:
    console = Console()
    models = Table(title="models")
    for column in ("name", "sequence axis", "max seq len", "parameters"):
        models.add_column(column)
    for name, model in MODELS.items():
        count = model.parameter_count()
        models.add_row(name, "yes" if model.has_sequence else "no", str(model.max_seq_len or "—"), f"{count:,}")
    console.print(models)
    table = Table(title="runtimes")
    for column in ("runtime", "installed", "what is timed"):
        table.add_column(column)
    for name, info in runtimes().items():
        missing = missing_requirement(info)
        table.add_row(name, "yes" if missing is None else f"no: {missing}", info.description + (f" ({info.note})" if info.note else ""))
    console.print(table)
    suites = Table(title="suites")
    for column in ("suite", "cells (at most)", "description"):
        suites.add_column(column)
    for name in builtin_suites():
        suite = load_suite(name)
        suites.add_row(name, str(suite.size), suite.description)
    console.print(suites)
    return 0


def command_env(args: argparse.Namespace) -> int:
    record = environment.collect()
    if args.format == "json":
        print(json.dumps(record, indent=2, sort_keys=True))
        return 0
    table = Table(title="environment (stored with every run)")
    table.add_column("key")
    table.add_column("value")
    for key, value in record.items():
        table.add_row(key, "—" if value is None else str(value))
    Console().print(table)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
        if args.command == "run":
            return command_run(args, argv)
        if args.command == "report":
            return command_report(args)
        if args.command == "verify":
            return command_verify(args)
        if args.command == "weights":
            return command_weights(args)
        if args.command == "list":
            return command_list()
        return command_env(args)
    except (UsageError, SpecError, StoreError) as exc:
        message = str(exc)
        print(message if message.startswith("fwbench") else f"fwbench: error: {message}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("fwbench: interrupted; finished cells are stored (resume with --resume RUN_ID)", file=sys.stderr)
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
