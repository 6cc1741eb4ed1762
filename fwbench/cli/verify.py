"""``fwbench verify``: check that runtimes compute the same outputs (or, ``--phase training``, the same loss
curves and trained parameters) with the same weights; exit 1 on any mismatch or failure."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fwbench.cli.common import (
    check_model_options,
    given,
    positive_float,
    positive_int,
    resolve_run,
    run_id,
    untimed_settings,
)
from fwbench.frameworks import distributed_runtimes, get_runtime, runtimes
from fwbench.models import get_model
from fwbench.report.table import make_console
from fwbench.report.verify_table import divergence_lines, parity_table, training_table
from fwbench.runner.phases import get_phase, phase_names
from fwbench.runner.planner import parse_names
from fwbench.runner.tolerances import TRAINING_TOLERANCE
from fwbench.runner.verify import OutputCheck, TrainingCheck, verify_model, verify_training
from fwbench.spec import DTYPES, OPTIMIZER_KINDS, Settings, SpecError
from fwbench.store import Store

DEFAULT_STEPS = 20


def add_parser(commands: Any) -> None:
    """Register ``verify`` on the subcommand parsers ``commands``."""
    verify = commands.add_parser(
        "verify",
        help="check that runtimes compute the same outputs with the same weights",
        description="Build each model in each runtime (each in its own worker) with the same weights and inputs, "
        "compare every output with the float64 numpy reference (relative L2 error ≤ 1e-4 for fp32: the verdict, "
        "whatever the order of --runtimes) and, for information, with the first runtime's, print a table, and exit "
        "1 on any mismatch or failure. --phase training compares N optimizer steps' loss curves and trained "
        "parameters with the first runtime's instead (there is no float64 reference for them).",
    )
    verify.add_argument("--models", required=True, help="comma-separated model names")
    verify.add_argument(
        "--runtimes",
        required=True,
        help="comma-separated runtimes; the first is the base of the 'vs first runtime' column (information; "
        "the verdict is against the float64 reference) and, with --phase training, of the verdict: put a trusted "
        "runtime first there",
    )
    verify.add_argument(
        "--weights",
        type=Path,
        metavar="FILE",
        help="safetensors weights (one model only); default: the seeded canonical weights",
    )
    verify.add_argument(
        "--dump",
        type=Path,
        metavar="DIR",
        help="write DIR/<model>/inputs.npz and "
        "DIR/<model>/<framework>_<mode>.npz with every output by name (--phase training: "
        "DIR/<model>/training_<framework>_<mode>.npz with losses and param/<name>)",
    )
    verify.add_argument("--batch-size", type=positive_int, help="default: the model's parity shape (2)")
    verify.add_argument("--seq-len", type=positive_int, help="default: the model's parity shape (16)")
    verify.add_argument("--threads", type=positive_int, help="intra-op threads (default: physical cores)")
    verify.add_argument("--seed", type=int, default=0, help="seed of weights and inputs (default 0)")
    verify.add_argument(
        "--dtype",
        choices=DTYPES,
        default="fp32",
        help="fp32; bf16: the one mixed-precision policy in every framework (docs/precision.md); int8: the deployment "
        "engines' quantisation (others skipped); sets the tolerance (default: fp32)",
    )
    verify.add_argument("--timeout", type=positive_float, default=600.0, metavar="SECONDS", help="per runtime")
    verify.add_argument(
        "--phase",
        choices=phase_names(lambda phase: phase.verifiable),
        default="inference",
        help="training: take --steps optimizer steps in each runtime from the same weights on the same "
        "fixed batch and compare the loss curves and trained parameters with the first runtime's "
        "(tolerances: fwbench/runner/tolerances.py TRAINING_TOLERANCE) (default: inference)",
    )
    verify.add_argument(
        "--steps", type=positive_int, help=f"--phase training: optimizer steps (default {DEFAULT_STEPS})"
    )
    verify.add_argument("--optimizer", choices=OPTIMIZER_KINDS, help="--phase training: default adamw")
    verify.add_argument(
        "--procs",
        type=positive_int,
        help="--phase training, data-parallel runtimes: also take the steps as N processes, each on its rows of the "
        "same global batch (--batch-size, split evenly), and compare with the runtime's 1-process run; each process "
        "gets --threads / N threads, the 1-process run as many",
    )
    verify.add_argument(
        "--db",
        metavar="PATH",
        help="--phase training with --run: mark the run's training cells "
        "of every mismatching model × runtime as mismatch, with the reason",
    )
    verify.add_argument("--run", type=run_id, metavar="ID", help="run id (or 'latest') in --db")


def _check_choices(args: argparse.Namespace, models: list[str], runtime_names: list[str]) -> None:
    """Refuse flags the phase does not take, runtimes without the phase, a weights file or dump folder that
    does not fit, and a sequence length a model cannot take."""
    for name in models:
        get_model(name)
    for name in runtime_names:
        get_runtime(name)
    if args.phase != "training":
        training_only = given(args, ["steps", "optimizer", "db", "run", "procs"])
        if training_only:
            raise SpecError(f"{', '.join(training_only)}: only with --phase training")
    else:
        _check_training(args, models, runtime_names)
    _check_files(args, models)
    for name in models:
        check_model_options(get_model(name), args.seq_len, None)


def _check_training(args: argparse.Namespace, models: list[str], runtime_names: list[str]) -> None:
    """``--phase training``: refuse --db without --run (or the other way), a dtype it does not compute in, a runtime
    without training, and --procs that do not fit (:func:`_check_procs`)."""
    if (args.db is None) != (args.run is None):
        raise SpecError("--db and --run go together: the run whose training cells a mismatch marks")
    training = get_phase("training")
    if training.dtype_unsupported(args.dtype):
        raise SpecError(f"--phase training computes in {', '.join(training.dtypes)} only, not {args.dtype}")
    for name in runtime_names:
        lacking = training.runtime_unsupported(get_runtime(name), Settings())
        if lacking:
            with_training = [n for n, r in runtimes().items() if "training" in r.phases]
            raise SpecError(f"--phase training: {lacking}; runtimes with training: {', '.join(with_training)}")
    _check_procs(args, models, runtime_names)


def _check_files(args: argparse.Namespace, models: list[str]) -> None:
    """Refuse --weights with more than one model or weights that do not fit it, and a --dump that is not a folder."""
    if args.weights is not None:
        if len(models) != 1:
            raise SpecError("--weights holds one model's weights: give exactly one model")
        check_model_options(get_model(models[0]), None, args.weights)
    if args.dump is not None and args.dump.exists() and not args.dump.is_dir():
        raise SpecError(f"--dump {args.dump} is not a folder")


def _check_procs(args: argparse.Namespace, models: list[str], runtime_names: list[str]) -> None:
    """Refuse --procs with a runtime of one process, a data-parallel runtime without it, a batch it does not divide,
    or more processes than CPUs."""
    several = [name for name in runtime_names if get_runtime(name).distributed]
    single = [name for name in runtime_names if not get_runtime(name).distributed]
    if args.procs is None:
        if several:
            raise SpecError(f"{', '.join(several)} runs as several processes: give --procs (e.g. --procs 2)")
        return
    if single:
        raise SpecError(
            f"--procs compares data-parallel runtimes ({', '.join(distributed_runtimes())}); "
            f"{', '.join(single)} runs as one process"
        )
    if args.procs < 2:
        raise SpecError(f"--procs {args.procs}: give 2 or more (the processes are compared with 1)")
    for name in models:
        batch = args.batch_size or get_model(name).parity_shape()[0]
        if batch % args.procs:
            raise SpecError(f"--procs {args.procs} does not divide {name}'s global batch {batch} (--batch-size)")
    usable = len(os.sched_getaffinity(0))
    if args.procs > usable:
        raise SpecError(f"--procs {args.procs} needs a CPU each; this process may use {usable}")


def command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    models = parse_names("--models", args.models)
    runtime_names = parse_names("--runtimes", args.runtimes)
    _check_choices(args, models, runtime_names)
    settings = untimed_settings(args)
    if getattr(args, "procs", None):  # every process gets as many threads, the 1-process run too
        settings = dataclasses.replace(settings, rank_threads=max(1, settings.threads // args.procs))
    if args.phase == "training":
        return _verify_training(args, models, runtime_names, settings)
    checks: list[OutputCheck] = []
    for name in models:
        checks += verify_model(
            name, runtime_names, settings, args.batch_size, args.seq_len, args.weights, args.dump, dtype=args.dtype
        )
    console = make_console()
    console.print(parity_table(args.dtype, checks))
    for line in divergence_lines(checks):
        console.print(line)
    if args.dump is not None:
        print(f"outputs and inputs written under {args.dump}", file=sys.stderr)
    return 1 if any(not check.passed for check in checks) else 0


def _verify_training(args: argparse.Namespace, models: list[str], runtime_names: list[str], settings: Settings) -> int:
    """``verify --phase training``: a table per model × runtime, exit 1 on any mismatch or failure; with
    ``--db``/``--run`` every training cell of that run with a failing model × runtime becomes ``mismatch``."""
    steps = args.steps or DEFAULT_STEPS
    settings = dataclasses.replace(settings, optimizer=args.optimizer or settings.optimizer)
    store, run_number = None, None
    if args.db is not None:
        store = Store.open(args.db, create=False)
        try:
            run_number = resolve_run(store, args.run, args.db, "--run").id
        except SpecError:
            store.close()
            raise
    checks: list[tuple[str, TrainingCheck]] = []
    marked = 0
    try:
        for name in models:
            for check in verify_training(
                name,
                runtime_names,
                settings,
                steps,
                args.batch_size,
                args.seq_len,
                args.weights,
                args.dump,
                dtype=args.dtype,
                procs=args.procs,
            ):
                checks.append((name, check))
                if store is not None and run_number is not None and not check.passed:
                    marked += store.mark_mismatch(
                        run_number,
                        name,
                        check.runtime,
                        "training",
                        f"fwbench verify --phase training ({steps} steps"
                        f"{'' if check.procs is None else f', {check.procs} processes'}): {check.failure()}",
                        procs=check.procs if check.procs is not None and check.procs > 1 else None,
                    )
    finally:
        if store is not None:
            store.close()
    tolerance = TRAINING_TOLERANCE[args.dtype]
    make_console().print(training_table(args.dtype, steps, settings.optimizer, tolerance, checks))
    if store is not None:
        print(f"{marked} training cell(s) of run {run_number} in {args.db} marked mismatch", file=sys.stderr)
    return 1 if any(not check.passed for _, check in checks) else 0
