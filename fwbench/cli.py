"""fwbench: benchmark deep-learning frameworks against each other, honestly (run | verify | weights | report | compare | list | env).

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
from rich.text import Text

from fwbench import __version__
from fwbench.frameworks import get_runtime, missing_requirement, phase_unsupported, runtimes
from fwbench.measure import environment
from fwbench.models import MODELS, get_model
from fwbench.models.gemm import GEMM
from fwbench.models.weights_io import load_weights, save_weights
from fwbench.report.compare import DEFAULT_THRESHOLD, compare_runs, comparison_legend, comparison_tables, verdict_line
from fwbench.report.export import to_csv, to_json, write_csv_dir
from fwbench.report.html import to_html
from fwbench.report.peak import PEAK_SUITE, Peak, achieved_gflops, best_cell, latest_peak
from fwbench.report.summary import DEFAULT_BASELINE, resolve_baseline
from fwbench.report.table import PIPE_WIDTH, make_console, markdown_report, print_results, to_rich
from fwbench.report.units import format_gflops, format_seconds, parse_bytes
from fwbench.report.tensorboard import write_cell, write_results
from fwbench.runner.manager import CellOutcome, Listener, execute
from fwbench.runner.planner import build_grids_plan, build_plan, parse_names, parse_positive_ints
from fwbench.runner.progress import sweep_progress
from fwbench.runner.verify import verify_model, verify_training
from fwbench.runner.protocol import TRAINING_TOLERANCE
from fwbench.spec import (COMPILE_MODES, MAX_COUNT, OPTIMIZER_KINDS, PHASES, PROTOCOLS, RUNNABLE_DTYPES, TRAINING_DTYPES, Plan,
                          Settings, SpecError)
from fwbench.store import DEFAULT_DB, RunRecord, Store, StoreError
from fwbench.runner.estimate import (
    NOMINAL_FLOPS_PER_S_PER_THREAD,
    estimate_cell_s,
    estimate_plan_s,
    format_estimate,
)
from fwbench.suites import DEFAULT_SUITE, Suite, builtin_suites, load_settings_file, load_suite

EXIT_USAGE = 2
RUN_DEVICES = ("cpu", "cuda")
REPORT_FORMATS = ("table", "json", "csv", "markdown")
COMPARE_FORMATS = ("table", "json")
PEAK_RUNTIMES = ("torch:eager", "tensorflow:function", "jax:jit")  # one native runtime per framework
TENSORBOARD_HELP = ("write TensorBoard event files into DIR: one run per model × runtime (DIR/<model>/"
                    "<framework>_<mode>/), scalars per ok cell tagged <phase>/<metric>/<shape>: loss per optimizer "
                    "step (training), step_time_s, samples_per_s and tokens_per_s per timed sample, and the "
                    "settings as text")


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


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r} must be a non-negative finite number (0.05 = 5%)")
    return value


def _directory(text: str) -> str:
    """An absolute directory path (workers may not share the caller's relative view); an existing file is refused."""
    path = Path(text).expanduser().resolve()
    if not text or path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is not a directory")
    return str(path)


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
    grid.add_argument("--phase", choices=PHASES, help="inference (default), training (one optimizer step per "
                      "timed call; bf16: mixed precision, float32 master weights) or fit (fp32; --epochs over a seeded "
                      "in-memory dataset with each runtime's training loop: model.fit, Trainer.fit or a manual loop; "
                      "one sample per epoch)")
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
    timing.add_argument("--compile-mode", choices=COMPILE_MODES,
                        help="torch:compile only (other runtimes ignore it): passed as torch.compile(mode=...); "
                        "default: default (inductor's balance of compile time and speed); reduce-overhead adds "
                        "CUDA graphs (GPU only; no effect on a CPU); max-autotune also benchmarks matmul/conv "
                        "kernel choices while compiling (a much longer first call)")
    timing.add_argument("--optimizer", choices=OPTIMIZER_KINDS,
                        help="--phase training and fit: the optimizer of every framework (default adamw: "
                        "lr 1e-3, betas 0.9/0.999, eps 1e-10, weight decay 0.01; sgd: lr 1e-2, momentum 0.9)")
    timing.add_argument("--epochs", type=_positive_int,
                        help="--phase fit only: epochs (default 5, at least 2; epoch 1 includes compilation and is "
                        "stored as the first call, epochs 2.. are the samples)")
    timing.add_argument("--fit-samples", type=_positive_int, metavar="N",
                        help="--phase fit only: samples of the seeded synthetic dataset (default 4096; a multiple "
                        "of every batch size)")
    timing.add_argument("--fit-logging", type=_directory, metavar="DIR",
                        help="--phase fit, torch:lightning only (other runtimes ignore it): turn on Lightning's "
                        "CSVLogger (DIR/<model>-b<batch>/version_<n>/metrics.csv: train_loss per epoch, and per step every 50 "
                        "steps, Lightning's default) and "
                        "ModelCheckpoint (the last epoch's .ckpt in that version's checkpoints/); default: both off, "
                        "nothing written")
    limits = run.add_argument_group("limits (a cell over a limit is stored as timeout or oom)")
    limits.add_argument("--timeout", type=_positive_float, metavar="SECONDS", help="per cell (default 600)")
    limits.add_argument("--memory-limit", type=_bytes, metavar="BYTES",
                        help="kill a worker whose resident memory exceeds this (e.g. 2G, 512M)")
    run.add_argument("--config", type=Path, metavar="FILE", help="TOML file with a [settings] table (keys: the "
                     "fields of the stored settings, e.g. threads, protocol, max_time_s, timeout_s, "
                     "memory_limit_bytes); overrides the suite's [settings], flags override it")
    run.add_argument("--db", default=DEFAULT_DB, help=f"SQLite results database (default {DEFAULT_DB})")
    run.add_argument("--resume", type=_positive_int, metavar="RUN_ID",
                     help="run only the cells of that run's stored plan that have no status yet")
    run.add_argument("--tensorboard", type=Path, metavar="DIR", help=TENSORBOARD_HELP + "; each cell is written "
                     "as soon as it is stored")

    report = commands.add_parser("report", help="print stored results", description="Print stored results.")
    report.add_argument("--db", default=DEFAULT_DB, help=f"SQLite results database (default {DEFAULT_DB})")
    report.add_argument("--run", type=_run_id, metavar="ID", help="only this run, or 'latest' (default: all runs)")
    report.add_argument("--format", choices=REPORT_FORMATS, help="default: table (with --html or --tensorboard: "
                        "none, unless --format or --out is given)")
    report.add_argument("--out", type=Path, metavar="FILE", help="write the report to FILE instead of stdout")
    report.add_argument("--baseline", metavar="RUNTIME", help=f"runtime the speed-ups and the pair summary are "
                        f"relative to (default {DEFAULT_BASELINE}, or the first runtime when it is absent)")
    report.add_argument("--csv", type=Path, metavar="DIR", help="also write the 2019 spreadsheet layout into DIR "
                        "(one CSV per model × runtime: rows batch size, columns sequence length, the median in "
                        "seconds or N/A) and results.csv, every result in long format")
    report.add_argument("--html", type=Path, metavar="FILE", help="write one self-contained HTML report to FILE "
                        "(works offline: summary, flags, heat maps of speed-up, latency and memory plots, parity, "
                        "environment, every result)")
    report.add_argument("--tensorboard", type=Path, metavar="DIR", help=TENSORBOARD_HELP + " (several runs: "
                        "under DIR/run<ID>/)")

    compare = commands.add_parser(
        "compare", help="compare two runs cell by cell; exit 1 on a significant regression",
        description="Match the cells of two runs by model, runtime, phase, shape, dtype and device; print each "
        "cell's time ratio B/A with its 95% CI and significance (Mann–Whitney U, Holm-adjusted), the geometric "
        "mean of B/A, the cells only one run has, and the environment differences. Exit 0 when no cell regressed "
        "significantly beyond --threshold, 1 when one did (or broke: ok in A, not ok in B), 2 on bad input.")
    compare.add_argument("run_a", type=_run_id, metavar="RUN_A", help="run id (or 'latest') in --db")
    compare.add_argument("run_b", type=_run_id, metavar="RUN_B", help="run id (or 'latest') in --db-b")
    compare.add_argument("--db", default=DEFAULT_DB, help=f"database of RUN_A (default {DEFAULT_DB})")
    compare.add_argument("--db-b", metavar="PATH", help="database of RUN_B (default: --db)")
    compare.add_argument("--threshold", type=_fraction, default=DEFAULT_THRESHOLD, metavar="FRACTION",
                         help=f"slow-down a significant cell may have before it counts as a regression "
                         f"(default {DEFAULT_THRESHOLD:g}, i.e. {DEFAULT_THRESHOLD * 100:g}%%)")
    compare.add_argument("--format", choices=COMPARE_FORMATS, default="table", help="default: table")

    verify = commands.add_parser(
        "verify", help="check that runtimes compute the same outputs with the same weights",
        description="Build each model in each runtime (each in its own worker) with the same weights and inputs, "
        "compare every output with the first runtime's and with the float64 numpy reference (relative L2 "
        "error ≤ 1e-4 for fp32), print a table, and exit 1 on any mismatch or failure. --phase training compares "
        "N optimizer steps' loss curves and trained parameters instead.",
    )
    verify.add_argument("--models", required=True, help="comma-separated model names")
    verify.add_argument("--runtimes", required=True, help="comma-separated runtimes; the first is the comparison base")
    verify.add_argument("--weights", type=Path, metavar="FILE", help="safetensors weights (one model only); "
                        "default: the seeded canonical weights")
    verify.add_argument("--dump", type=Path, metavar="DIR", help="write DIR/<model>/inputs.npz and "
                        "DIR/<model>/<framework>_<mode>.npz with every output by name (--phase training: "
                        "DIR/<model>/training_<framework>_<mode>.npz with losses and param/<name>)")
    verify.add_argument("--batch-size", type=_positive_int, help="default: the model's parity shape (2)")
    verify.add_argument("--seq-len", type=_positive_int, help="default: the model's parity shape (16)")
    verify.add_argument("--threads", type=_positive_int, help="intra-op threads (default: physical cores)")
    verify.add_argument("--seed", type=int, default=0, help="seed of weights and inputs (default 0)")
    verify.add_argument("--dtype", choices=RUNNABLE_DTYPES, default="fp32",
                        help="compute dtype, each framework's own way; sets the tolerance (default: fp32)")
    verify.add_argument("--timeout", type=_positive_float, default=600.0, metavar="SECONDS", help="per runtime")
    verify.add_argument("--phase", choices=("inference", "training"), default="inference",
                        help="training: take --steps optimizer steps in each runtime from the same weights on the same "
                        "fixed batch and compare the loss curves and trained parameters with the first runtime's "
                        "(tolerances: fwbench/runner/protocol.py TRAINING_TOLERANCE) (default: inference)")
    verify.add_argument("--steps", type=_positive_int, help="--phase training: optimizer steps (default 20)")
    verify.add_argument("--optimizer", choices=OPTIMIZER_KINDS, help="--phase training: default adamw")
    verify.add_argument("--db", metavar="PATH", help="--phase training with --run: mark the run's training cells "
                        "of every mismatching model × runtime as mismatch, with the reason")
    verify.add_argument("--run", type=_run_id, metavar="ID", help="run id (or 'latest') in --db")

    weights = commands.add_parser("weights", help="write a model's canonical weights to a safetensors file",
                                  description="Write a model's seeded canonical weights (Hugging Face / "
                                  "torchvision names and layouts) to a safetensors file.")
    weights.add_argument("model", help="model name (see `fwbench list`)")
    weights.add_argument("--out", type=Path, required=True, metavar="FILE.safetensors")
    weights.add_argument("--seed", type=int, default=0, help="default 0")

    commands.add_parser("list", help="show models, runtimes (installed or not) and suites",
                        description="Show models, runtimes (installed or not) and suites.")
    env = commands.add_parser("env", help="print the environment record stored with each run; --peak: measure "
                              "the machine's fp32 matmul peak",
                              description="Print the environment record stored with each run. With --peak, "
                              f"measure the fp32 matmul peak instead: the gemm model ({GEMM.n}×{GEMM.n} weight) at "
                              f"batch {GEMM.n} in {', '.join(PEAK_RUNTIMES)} (those installed), each in its own "
                              "worker, stored as a run of suite 'peak' that reports use for their %% peak column.")
    env.add_argument("--format", choices=("json", "table"), default="table", help="default: table")
    env.add_argument("--peak", action="store_true", help="measure GFLOP/s per runtime and store the best as the peak")
    env.add_argument("--threads", type=_positive_int, help=f"--peak: intra-op threads (default: physical cores, "
                     f"here {environment.physical_core_count()})")
    env.add_argument("--max-time", type=_positive_float, metavar="SECONDS",
                     help="--peak: timing budget per runtime (default 5)")
    env.add_argument("--db", help=f"--peak: SQLite results database the peak run is stored in (default {DEFAULT_DB}, "
                     "where `run` and `report` look by default)")
    return parser


# -- run ----------------------------------------------------------------------------------------
SETTINGS_FLAGS = {
    "threads": "threads", "interop_threads": "interop_threads", "protocol": "protocol", "max_time": "max_time_s",
    "warmup": "warmup_calls", "timeout": "timeout_s", "memory_limit": "memory_limit_bytes", "seed": "seed",
    "weights": "weights_path", "compile_mode": "compile_mode", "optimizer": "optimizer",
    "epochs": "epochs", "fit_samples": "fit_samples", "fit_logging": "fit_logging",
}
GRID_FLAGS = ("suite", "config", "models", "runtimes", "batch_sizes", "seq_lens", "phase", "dtype", "device")


def _given(args: argparse.Namespace, names: Sequence[str]) -> list[str]:
    """The flags among ``names`` that the user gave (an empty string counts as given)."""
    return ["--" + name.replace("_", "-") for name in names if getattr(args, name) is not None]


def check_threads_fit(settings: Settings) -> None:
    """Refuse a thread budget larger than the CPUs this process may use (it could not be pinned)."""
    usable = len(os.sched_getaffinity(0))
    if settings.threads > usable:
        raise SpecError(f"--threads {settings.threads} exceeds the {usable} CPUs this process may use")


def plan_from_args(args: argparse.Namespace) -> Plan:
    """Flags over settings file over suite over defaults; SpecError on any invalid choice."""
    if args.suite is None and (args.models is None) != (args.runtimes is None):
        raise SpecError("give both --models and --runtimes, or a --suite")
    use_suite = args.suite is not None or args.models is None
    suite = load_suite(DEFAULT_SUITE if args.suite is None else args.suite) if use_suite else None
    settings_data: dict[str, Any] = {"threads": environment.physical_core_count()}
    if suite is not None:
        settings_data.update(suite.settings)
    if args.config is not None:
        settings_data.update(load_settings_file(args.config))
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

    # A grid flag replaces that axis in every grid of the suite.
    grids = [
        (pick("models", parse_names, grid and grid.models, []),
         pick("runtimes", parse_names, grid and grid.runtimes, []),
         pick("batch_sizes", parse_positive_ints, grid and grid.batch_sizes, [1]),
         pick("seq_lens", parse_positive_ints, grid and grid.seq_lens, []))
        for grid in (suite.grids if suite is not None else [None])
    ]
    plan = build_grids_plan(
        grids,
        settings,
        phase=pick("phase", None, suite and suite.phase, "inference"),
        dtype=pick("dtype", None, suite and suite.dtype, "fp32"),
        device=pick("device", None, suite and suite.device, "cpu"),
        suite=suite.name if suite else None,
    )
    if settings.weights_path is not None:
        check_weights_file(plan, settings.weights_path)
    return plan


def suite_plan(suite: Suite, threads: int) -> Plan:
    """The plan a suite runs with its own settings and ``threads`` threads (no flags)."""
    settings = Settings.from_dict({"threads": threads, **suite.settings})
    grids = [(g.models, g.runtimes, g.batch_sizes, g.seq_lens) for g in suite.grids]
    return build_grids_plan(grids, settings, suite.phase, suite.dtype, suite.device, suite.name)


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


def check_tensorboard_dir(path: Path | None) -> None:
    """Refuse a --tensorboard DIR that is not a folder or cannot be created (nothing is written)."""
    if path is None:
        return
    if path.exists() and not path.is_dir():
        raise SpecError(f"--tensorboard {path} is not a folder")
    folder = path
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise SpecError(f"--tensorboard {path}: cannot write there, {folder} is not a writable folder")


def tensorboard_listener(listener: Listener, store: Store, run_id: int, settings: dict[str, Any],
                         folder: Path | None) -> Listener:
    """``listener``, then (with ``folder``) the cell's TensorBoard run, written from what was just stored.
    A write that fails is reported once on stderr; the sweep goes on."""
    if folder is None:
        return listener
    failed = False

    def listen(outcome: CellOutcome) -> None:
        nonlocal failed
        listener(outcome)
        row = store.result(run_id, outcome.case.key)
        if row is None or failed:
            return
        try:
            write_cell(folder, row, settings)
        except OSError as exc:
            failed = True
            print(f"fwbench: --tensorboard {folder}: cannot write it: {exc.strerror or exc}; the sweep goes on "
                  f"(`fwbench report --run {run_id} --tensorboard DIR` writes it later)", file=sys.stderr)

    return listen


def command_run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    check_tensorboard_dir(args.tensorboard)
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
        done = store.done_keys(run_id)
        remaining = plan.size - len(done)
        err = sys.stderr
        todo = [case for case in plan.cases if case.key not in done]
        estimate = format_estimate(sum(estimate_cell_s(case, plan.settings) for case in todo))
        print(f"run {run_id}: {remaining} of {plan.size} cells to run (rough estimate {estimate}), database {args.db}",
              file=err, flush=True)
        try:
            with sweep_progress(remaining) as listener:
                execute(store, run_id, plan, tensorboard_listener(listener, store, run_id, plan.settings.to_dict(),
                                                                  args.tensorboard))
        except KeyboardInterrupt:
            print(f"fwbench: interrupted; finished cells are stored; continue with "
                  f"`fwbench run --resume {run_id} --db {args.db}`", file=sys.stderr)
            return 130
        store.finish_run(run_id)
        results = store.results([run_id])
        print_results(results, make_console(), title="fwbench results", peak=latest_peak(store))
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
    if args.html is not None and (args.html.is_dir() or not args.html.parent.is_dir()):
        raise SpecError(f"--html {args.html}: give a file path in an existing folder")
    check_tensorboard_dir(args.tensorboard)
    with Store.open(args.db, readonly=True) as store:
        run_id = store.latest_run_id() if args.run == "latest" else args.run
        if args.run is not None and (run_id is None or store.get_run(run_id) is None):
            known = [r.id for r in store.runs()]
            raise SpecError(f"run {args.run} is not in {args.db}; runs there: {known or 'none'}")
        run_ids = None if run_id is None else [run_id]
        runs, results = store.runs(run_ids), store.results(run_ids)
        peak = latest_peak(store)
    try:
        baseline = resolve_baseline(results, args.baseline)
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    if args.csv is not None:
        if args.csv.exists() and not args.csv.is_dir():
            raise SpecError(f"--csv {args.csv} is not a folder")
        try:
            written = write_csv_dir(results, args.csv, peak)
        except OSError as exc:
            raise SpecError(f"--csv {args.csv}: cannot write it: {exc.strerror or exc}") from None
        print(f"wrote {len(written)} CSV files to {args.csv}", file=sys.stderr)
    if args.html is not None:
        page = to_html(runs, results, baseline=baseline, peak=peak, source=str(args.db))
        try:
            args.html.write_text(page, encoding="utf-8")
        except OSError as exc:
            raise SpecError(f"--html {args.html}: cannot write it: {exc.strerror or exc}") from None
        print(f"wrote {args.html} ({len(page.encode()) / 2**20:.2f} MiB)", file=sys.stderr)
    if args.tensorboard is not None:
        try:
            folders = write_results(args.tensorboard, results, {r.id: r.settings for r in runs})
        except OSError as exc:
            raise SpecError(f"--tensorboard {args.tensorboard}: cannot write it: {exc.strerror or exc}") from None
        print(f"wrote {len(folders)} TensorBoard runs to {args.tensorboard} (tensorboard --logdir "
              f"{args.tensorboard})", file=sys.stderr)
    if (args.html is not None or args.tensorboard is not None) and args.format is None and args.out is None:
        return 0
    args.format = args.format or "table"
    if args.format == "json":
        text = to_json(runs, results, peak) + "\n"
    elif args.format == "csv":
        text = to_csv(results, peak)
    elif args.format == "markdown":
        text = markdown_report(results, f"fwbench results in {args.db}", peak, baseline)
    else:
        console = Console(record=True, width=PIPE_WIDTH, file=io.StringIO()) if args.out else make_console()
        print_results(results, console, title=f"fwbench results in {args.db}", peak=peak, baseline=baseline)
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


def _run_in(store: Store, run: int | str, db: str, name: str) -> RunRecord:
    """The run ``run`` (an id or 'latest') of ``store``; SpecError naming the runs there when it is absent."""
    run_id = store.latest_run_id() if run == "latest" else run
    record = None if run_id is None else store.get_run(int(run_id))
    if record is None:
        known = [r.id for r in store.runs()]
        raise SpecError(f"{name} {run} is not in {db}; runs there: {known or 'none'}")
    return record


def command_compare(args: argparse.Namespace) -> int:
    """Exit 0: no significant regression beyond --threshold; 1: at least one (or a cell that broke)."""
    db_b = args.db_b or args.db
    with Store.open(args.db, readonly=True) as store_a:
        run_a = _run_in(store_a, args.run_a, args.db, "RUN_A")
        results_a = store_a.results([run_a.id])
        if db_b == args.db:
            run_b = _run_in(store_a, args.run_b, db_b, "RUN_B")
            results_b = store_a.results([run_b.id])
    if db_b != args.db:
        with Store.open(db_b, readonly=True) as store_b:
            run_b = _run_in(store_b, args.run_b, db_b, "RUN_B")
            results_b = store_b.results([run_b.id])
    comparison = compare_runs(run_a, results_a, run_b, results_b, args.threshold)
    if not comparison.cells:
        raise SpecError(f"run {run_a.id} of {args.db} and run {run_b.id} of {db_b} have no cell in common "
                        "(same model, runtime, phase, shape, dtype and device); nothing to compare")
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


def command_verify(args: argparse.Namespace) -> int:
    models = parse_names("--models", args.models)
    runtime_names = parse_names("--runtimes", args.runtimes)
    for name in models:
        get_model(name)
    for name in runtime_names:
        get_runtime(name)
    if args.phase != "training":
        given = [flag for flag, value in (("--steps", args.steps), ("--optimizer", args.optimizer),
                                          ("--db", args.db), ("--run", args.run)) if value is not None]
        if given:
            raise SpecError(f"{', '.join(given)}: only with --phase training")
    else:
        if (args.db is None) != (args.run is None):
            raise SpecError("--db and --run go together: the run whose training cells a mismatch marks")
        if args.dtype not in TRAINING_DTYPES:
            raise SpecError(f"--phase training computes in {', '.join(TRAINING_DTYPES)} only, not {args.dtype}")
        for name in runtime_names:
            lacking = phase_unsupported(get_runtime(name), "training")
            if lacking:
                with_training = [n for n, r in runtimes().items() if "training" in r.phases]
                raise SpecError(f"--phase training: {lacking}; runtimes with training: {', '.join(with_training)}")
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
    if args.phase == "training":
        return verify_training_command(args, models, runtime_names, settings)
    table = Table(title=f"fwbench verify, {args.dtype} (relative L2 error; max abs error in brackets)")
    for column in ("model", "runtime", "output", "shape", "vs first runtime", "vs float64 reference", "verdict"):
        table.add_column(column)
    failures = 0
    for name in models:
        checks = verify_model(name, runtime_names, settings, args.batch_size, args.seq_len, args.weights, args.dump,
                              dtype=args.dtype)
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


def verify_training_command(args: argparse.Namespace, models: list[str], runtime_names: list[str],
                            settings: Settings) -> int:
    """``verify --phase training``: a table per model × runtime, exit 1 on any mismatch or failure; with
    ``--db``/``--run`` every training cell of that run with a failing model × runtime becomes ``mismatch``."""
    import dataclasses

    steps = args.steps or 20
    settings = dataclasses.replace(settings, optimizer=args.optimizer or settings.optimizer)
    store, run_id = None, None
    if args.db is not None:
        store = Store.open(args.db, create=False)
        run_id = store.latest_run_id() if args.run == "latest" else args.run
        if run_id is None or store.get_run(run_id) is None:
            raise SpecError(f"--run {args.run}: no such run in {args.db}")
    tolerance = TRAINING_TOLERANCE[args.dtype]
    table = Table(title=f"fwbench verify --phase training, {args.dtype}, {steps} {settings.optimizer} steps "
                  f"(errors against the first runtime; limits: loss {tolerance.loss_rel:g}, parameters "
                  f"{tolerance.params_rel_l2:g}, worst tensor {tolerance.tensor_rel_l2:g})")
    for column in ("model", "runtime", "first loss", "last loss", "loss curve max rel", "params rel L2",
                   "worst tensor (rel L2)", "verdict"):
        table.add_column(column)
    failures = marked = 0
    try:
        for name in models:
            for check in verify_training(name, runtime_names, settings, steps, args.batch_size, args.seq_len,
                                         args.weights, args.dump, dtype=args.dtype):
                failures += not check.passed
                if check.status != "ok":
                    verdict = "skipped" if check.status == "skipped" else f"[red]{check.status}[/]"
                    table.add_row(name, check.runtime, "—", "—", "—", "—", "—",
                                  f"{verdict}: {escape(check.reason or '')}")
                else:
                    table.add_row(name, check.runtime, f"{check.losses[0]:.6g}", f"{check.losses[-1]:.6g}",
                                  f"{check.loss_rel:.2e}", f"{check.params_rel_l2:.2e}",
                                  f"{check.worst_tensor} ({check.worst_tensor_rel_l2:.2e})",
                                  "ok" if check.passed else f"[red]mismatch: {escape(check.failure() or '')}[/]")
                if store is not None and run_id is not None and not check.passed:
                    marked += store.mark_mismatch(run_id, name, check.runtime, "training",
                                                  f"fwbench verify --phase training ({steps} steps): "
                                                  f"{check.failure()}")
    finally:
        if store is not None:
            store.close()
    make_console().print(table)
    if store is not None:
        print(f"{marked} training cell(s) of run {run_id} in {args.db} marked mismatch", file=sys.stderr)
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
    console = make_console()
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
    training = Table(title="--phase training: one timed call is one optimizer step (models: "
                     + ", ".join(n for n, m in MODELS.items() if m.training_unsupported() is None) + ")")
    for column in ("runtime", "what one timed training call is"):
        training.add_column(column)
    for name, info in runtimes().items():
        if "training" in info.phases:
            training.add_row(name, info.training)
    console.print(training)
    fit = Table(title="--phase fit: --epochs over a seeded in-memory dataset, one sample per epoch (models: "
                + ", ".join(n for n, m in MODELS.items() if m.fit_unsupported() is None) + ")")
    for column in ("runtime", "the training loop"):
        fit.add_column(column)
    for name, info in runtimes().items():
        if "fit" in info.phases:
            fit.add_row(name, info.fit)
    console.print(fit)
    threads = environment.physical_core_count()
    suites = Table(title=f"suites (time: a rough estimate at {threads} threads, from FLOPs at a nominal "
                   f"{NOMINAL_FLOPS_PER_S_PER_THREAD / 1e9:.0f} GFLOP/s per thread plus start-up and compile times)")
    for column in ("suite", "cells", "runnable", "time", "description"):
        suites.add_column(column, justify="right" if column in ("cells", "runnable", "time") else "left")
    for name in builtin_suites():
        suite = load_suite(name)
        try:
            plan = suite_plan(suite, threads)
        except SpecError as exc:  # e.g. a runtime registered by a plugin that is not loaded here
            suites.add_row(name, str(suite.size), "—", "—", f"{suite.description} ({exc})")
            continue
        suites.add_row(name, str(plan.size), str(len(plan.cases)), format_estimate(estimate_plan_s(plan)),
                       suite.description)
    console.print(suites)
    return 0


def command_peak(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``env --peak``: gemm at batch = n in each installed native runtime, each in its own worker through
    the manager, stored as a run of suite ``peak``; prints GFLOP/s per runtime and the best as the peak."""
    names = [name for name in PEAK_RUNTIMES if missing_requirement(get_runtime(name)) is None]
    if not names:
        raise SpecError(f"env --peak needs one of {', '.join(PEAK_RUNTIMES)}; none is installed")
    settings_data: dict[str, Any] = {"threads": args.threads or environment.physical_core_count()}
    if args.max_time is not None:
        settings_data["max_time_s"] = args.max_time
    settings = Settings.from_dict(settings_data)
    check_threads_fit(settings)
    plan = build_plan([GEMM.name], names, [GEMM.n], [], settings, suite=PEAK_SUITE)
    db = args.db or DEFAULT_DB
    store = Store.open(db)
    run_id = store.create_run(plan, shlex.join(["fwbench", *argv]), environment.collect(), __version__)
    _terminate_on_sigterm()
    with store:
        print(f"run {run_id} (suite {PEAK_SUITE}): gemm at batch {GEMM.n} in {len(names)} runtimes, "
              f"threads {settings.threads}, database {db}", file=sys.stderr, flush=True)
        with sweep_progress(plan.size) as listener:
            execute(store, run_id, plan, listener)
        store.finish_run(run_id)
        runs, results = store.runs([run_id]), store.results([run_id])
    best = best_cell(results)
    peak = None if best is None else Peak(achieved_gflops(best) or 0.0, best["runtime"], run_id, best["threads"],
                                          best["dtype"], best["device"])
    if args.format == "json":
        print(to_json(runs, results, peak))
        return 0 if peak else 1
    flops = GEMM.flops(GEMM.n, None)
    table = Table(title=f"fp32 matmul peak: gemm x ({GEMM.n}×{GEMM.n}) @ W ({GEMM.n}×{GEMM.n}), "
                  f"{flops / 1e9:.1f} GFLOP per call, threads {settings.threads}")
    for column in ("runtime", "status", "median", "GFLOP/s", "GFLOP/s 95% CI", "samples", "note"):
        table.add_column(column, justify="left" if column in ("runtime", "status", "note") else "right")
    for row in results:
        low, high = achieved_gflops(row, "ci_high_s"), achieved_gflops(row, "ci_low_s")
        table.add_row(
            row["runtime"], row["status"], format_seconds(row["median_s"]), format_gflops(achieved_gflops(row)),
            "—" if low is None or high is None else f"{format_gflops(low)}–{format_gflops(high)}",
            f"{row['n_samples']}×{row['calls_per_sample']}" if row["n_samples"] else "—", escape(row["reason"] or ""),
        )
    make_console().print(table)
    if peak is None:
        print(f"no runtime measured the peak; run {run_id} in {db} says why", file=sys.stderr)
        return 1
    print(f"peak: {format_gflops(peak.gflops)} GFLOP/s ({peak.runtime}, threads {peak.threads}), the best of "
          f"{len(results)} runtimes. Stored as run {run_id} (suite {PEAK_SUITE}) in {db}; `fwbench report --db {db}` "
          "shows every cell's % of the latest peak")
    return 0


def command_env(args: argparse.Namespace, argv: Sequence[str]) -> int:
    if args.peak:
        return command_peak(args, argv)
    given = _given(args, ["threads", "max_time", "db"])
    if given:
        raise SpecError(f"{', '.join(given)}: only with env --peak")
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
        if args.command == "compare":
            return command_compare(args)
        if args.command == "verify":
            return command_verify(args)
        if args.command == "weights":
            return command_weights(args)
        if args.command == "list":
            return command_list()
        return command_env(args, argv)
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
