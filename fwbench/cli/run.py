"""``fwbench run``: sweep a grid of cells, each in a fresh worker, into the results database. This module runs the
command (plan, checks, the sweep, the results); its flags are :mod:`fwbench.cli.run_flags`, what they mean for the plan
:mod:`fwbench.cli.run_plan`."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import shlex
import sqlite3
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fwbench import __version__
from fwbench.cli.common import check_tensorboard_dir, given, resolve_run, terminate_on_sigterm
from fwbench.cli.run_flags import add_flags
from fwbench.cli.run_plan import plan_flags_given, plan_from_args
from fwbench.datasets.folders import DatasetError, default_folder, ensure_default
from fwbench.diskfull import DiskFull, cells_kept
from fwbench.measure import environment
from fwbench.report.peak import latest_peak
from fwbench.report.table import make_console, print_results
from fwbench.report.tensorboard import write_cell
from fwbench.runner import nodes
from fwbench.runner.estimate import format_estimate
from fwbench.runner.extra_rounds import minimum_only
from fwbench.runner.manager import CellOutcome, Listener, execute
from fwbench.runner.phases import estimate_s
from fwbench.runner.planner import check_plan_fits
from fwbench.runner.progress import sweep_progress
from fwbench.runner.ray_executor import RayExecutor, execute_on_ray
from fwbench.spec import Plan, Settings, SpecError
from fwbench.store import Store
from fwbench.store.paths import check_database_path
from fwbench.units import format_percent, format_seconds


def add_parser(commands: Any) -> None:
    """Register ``run`` on the subcommand parsers ``commands`` (its flags: :func:`fwbench.cli.run_flags.add_flags`)."""
    run = commands.add_parser(
        "run",
        help="sweep a grid of cells, each in a fresh worker, into the results database",
        description="Sweep models × runtimes × batch sizes × sequence lengths. Each cell runs in a fresh "
        "worker process; every cell gets a terminal status (ok, oom, timeout, error, skipped, mismatch) "
        "committed to the database at once.",
    )
    add_flags(run)


def tensorboard_listener(
    listener: Listener, store: Store, run_id: int, settings: dict[str, Any], folder: Path | None
) -> Listener:
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
            print(
                f"fwbench: --tensorboard {folder}: cannot write it: {exc.strerror or exc}; the sweep goes on "
                f"(`fwbench report --run {run_id} --tensorboard DIR` writes it later)",
                file=sys.stderr,
            )

    return listen


NO_EXTRA_ROUNDS = {
    "cluster": "extra rounds are given on this machine only; on Ray each comparison group runs its --rounds",
    "no-ci": "fewer than 3 rounds give no CI to aim at: no extra rounds",
    "protocol": "the hf2019 protocol fixes its blocks: no extra rounds",
    "max-rounds": "--max-rounds is --rounds: no extra rounds",
}


def print_budget(settings: Settings, *, ray: bool, flags: Sequence[str] = ()) -> None:
    """One line on stderr about the extra rounds a budget buys, or why it buys none here; ``flags``: the extra-round
    flags the user gave, which act only with a budget."""
    if settings.budget_s is None:
        if flags:
            verb = "act" if len(flags) > 1 else "acts"
            print(f"fwbench: {' and '.join(flags)} {verb} only with --budget: no extra rounds", file=sys.stderr)
        return
    budget = f"budget {format_seconds(settings.budget_s)}"
    reason = minimum_only(settings, local=not ray)
    if reason is not None:
        print(f"fwbench: {budget}: {NO_EXTRA_ROUNDS[reason]}", file=sys.stderr)
        return
    print(
        f"{budget}: after {settings.rounds} rounds each, extra rounds (up to {settings.round_limit}) go where a "
        f"speed-up's 95% CI is wider than ±{format_percent(settings.target_ci)}",
        file=sys.stderr,
        flush=True,
    )


def rewrite_tensorboard(store: Store, run_id: int, settings: dict[str, Any], folder: Path) -> None:
    """Every cell of the run written again to its TensorBoard run (extra rounds stored the cells again); a write
    that fails is reported on stderr, as the live writer's."""
    try:
        for row in store.results([run_id]):
            write_cell(folder, row, settings)
    except OSError as exc:
        print(f"fwbench: --tensorboard {folder}: cannot write it: {exc.strerror or exc}", file=sys.stderr)


def check_dataset(plan: Plan) -> None:
    """A plan that reads images (phase data cells, phase fit cells with ``fit_source`` input): write the default
    dataset if it reads it and it is missing; SpecError when its folder is gone (a resumed run's --input)."""
    reads = plan.settings.fit_source == "input" and any(case.phase == "fit" for case in plan.cases)
    if not (reads or any(case.phase == "data" for case in plan.cases)) or plan.settings.data_input is None:
        return
    folder = Path(plan.settings.data_input)
    try:
        if folder == default_folder():
            ensure_default(folder)
        elif not folder.is_dir():
            raise SpecError(f"--input {folder}: no such folder")
    except DatasetError as exc:
        raise SpecError(str(exc)) from None


def connect_executor(args: argparse.Namespace) -> RayExecutor | None:
    """The Ray cluster of ``--executor ray`` (ExecutorError, one line, when it cannot be used); None for local."""
    if args.ray_address is not None and args.executor != "ray":
        raise SpecError("--ray-address goes with --executor ray")
    if args.executor != "ray":
        return None
    return RayExecutor(args.ray_address)


WILDCARD_ADDRESSES = ("0.0.0.0", "::", "")


def check_node_flags(args: argparse.Namespace, count: int) -> None:
    """Refuse node flags that do not go together for a run whose cells span ``count`` machines (SpecError, one
    line)."""
    if count == 1:
        stray = given(args, ["master_addr", "master_port"]) + (["--node-rank"] if args.node_rank else [])
        if stray:
            raise SpecError(f"{', '.join(stray)} go(es) with --nnodes M (M > 1)")
        return
    if args.master_addr is None or args.master_port is None:
        raise SpecError("--nnodes spans machines that meet at node 0: give --master-addr HOST and --master-port P")
    if args.master_addr in WILDCARD_ADDRESSES:
        raise SpecError(f"--master-addr {args.master_addr!r}: give node 0's address the other machines reach")
    if args.node_rank >= count:
        raise SpecError(f"--node-rank {args.node_rank} is not one of 0..{count - 1} (--nnodes {count})")
    if args.executor == "ray":
        raise SpecError(
            "--nnodes spreads one cell over machines from node 0; --executor ray spreads whole groups: not both"
        )


def resume_command(args: argparse.Namespace, run_id: int, spans_nodes: bool) -> str:
    """The command that continues run ``run_id`` where it stopped (``spans_nodes``: with node 0's flags)."""
    line = f"fwbench run --resume {run_id} --db {args.db}"
    if spans_nodes:
        line += f" --master-addr {args.master_addr} --master-port {args.master_port} (and the other nodes)"
    return line


def serve_node(args: argparse.Namespace) -> int:
    """Node 1..M-1: join node 0 and serve its ranks until it finishes the sweep. With plan flags, the plan they
    make must be node 0's (its digest is checked there)."""
    stray = given(args, ["resume", "shard", "tensorboard"])
    if stray:
        raise SpecError(f"node {args.node_rank} serves node 0's cells and stores nothing: drop {', '.join(stray)}")
    plan = plan_from_args(args) if plan_flags_given(args) else None
    if plan is not None:
        check_plan_fits(plan)
    terminate_on_sigterm()
    try:
        return nodes.serve(
            args.master_addr,
            args.master_port,
            args.node_rank,
            args.nnodes,
            args.join_timeout,
            nodes.plan_fingerprint(plan) if plan is not None else None,
            __version__,
            environment.collect(),
        )
    except nodes.ClusterError as exc:
        raise SpecError(str(exc)) from None
    except KeyboardInterrupt:
        print(f"fwbench: node {args.node_rank} interrupted; the ranks it started are killed", file=sys.stderr)
        return 130


def join_nodes(args: argparse.Namespace, plan: Plan) -> nodes.Cluster | None:
    """Node 0 of ``--nnodes M``: the cluster of the other nodes, once all have joined; None on one machine."""
    if plan.settings.nodes == 1:
        return None
    if not any((case.procs or 1) > 1 for case in plan.cases):
        raise SpecError("--nnodes spreads cells of several processes over machines; the plan has none (give --procs)")
    try:
        return nodes.Cluster(
            args.master_addr, args.master_port, plan.settings.nodes, args.join_timeout, plan, __version__
        )
    except nodes.ClusterError as exc:
        raise SpecError(str(exc)) from None


@dataclasses.dataclass(frozen=True)
class Sweep:
    """A run ready to sweep: its database, id and plan (a shard's cells), the Ray cluster of ``--executor ray`` and
    the other nodes of ``--nnodes M``."""

    store: Store
    run_id: int
    plan: Plan
    executor: RayExecutor | None
    cluster: nodes.Cluster | None


def command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``fwbench run``: node 1..M-1 serves node 0; node 0 plans a new run (or takes ``--resume``'s stored one),
    sweeps the cells not yet done and prints the results."""
    check_tensorboard_dir(args.tensorboard)
    if args.node_rank > 0:
        check_node_flags(args, args.nnodes or 1)
        return serve_node(args)
    sweep = resumed_sweep(args) if args.resume is not None else new_sweep(args, argv)
    terminate_on_sigterm()
    with sweep.store, sweep.cluster if sweep.cluster is not None else contextlib.nullcontext():
        stopped = run_sweep(args, sweep)
        if stopped is not None:
            return stopped
        print_summary(args, sweep.store, sweep.run_id)
    return 0


def resumed_sweep(args: argparse.Namespace) -> Sweep:
    """``--resume RUN_ID``: the stored run, its plan and settings, after the checks a new run's plan gets."""
    dropped = plan_flags_given(args)
    if dropped:
        raise SpecError(f"--resume reruns a stored plan with its stored settings; drop {', '.join(dropped)}")
    if args.shard is not None:
        raise SpecError("--resume reruns the stored run's own shard; drop --shard")
    store = Store.open(args.db, create=False)
    record = resolve_run(store, args.resume, args.db, "--resume")
    plan, run_id = record.planned, record.id
    if args.nnodes is not None and args.nnodes != plan.settings.nodes:
        raise SpecError(f"run {run_id} spans --nnodes {plan.settings.nodes}; --resume it with that many")
    check_node_flags(args, plan.settings.nodes)
    check_plan_fits(plan)
    check_dataset(plan)
    executor = connect_executor(args)
    cluster = join_nodes(args, record.plan)  # the other nodes give the whole plan's flags, or none
    return Sweep(store, run_id, plan, executor, cluster)


def new_sweep(args: argparse.Namespace, argv: Sequence[str]) -> Sweep:
    """A new run of the plan the flags make (``--shard``: its shard), stored once every check has passed and the
    executor and the other nodes are there."""
    full_plan = plan_from_args(args)
    check_node_flags(args, full_plan.settings.nodes)  # --nnodes, or nodes in a --config / suite [settings]
    plan = full_plan.shard(args.shard)
    check_dataset(plan)
    check_database_path(Path(args.db), create=True)  # a database that cannot be used fails before a cluster starts
    executor = connect_executor(args)  # a cluster that cannot be used fails before anything is written
    cluster = None
    try:
        cluster = join_nodes(args, full_plan)  # every node gives the whole plan (a shard is node 0's choice)
        store = Store.open(args.db)
    except BaseException:
        if executor is not None:
            executor.close()
        if cluster is not None:
            cluster.close()
        raise
    facts = environment.collect()
    if cluster is not None:
        facts["cluster_nodes"] = cluster.machines()  # the other machines a cell of several processes spans
    run_id = store.create_run(full_plan, shlex.join(["fwbench", *argv]), facts, __version__, shard=args.shard)
    if args.shard is not None:
        print(
            f"shard {args.shard} of plan {full_plan.digest[:12]}: {plan.size} of its {full_plan.size} cells",
            file=sys.stderr,
        )
    return Sweep(store, run_id, plan, executor, cluster)


def run_sweep(args: argparse.Namespace, sweep: Sweep) -> int | None:
    """Run the cells of ``sweep`` not yet done and finish the run: None, or the exit status of a sweep that stopped
    (1: a node was lost, 130: interrupted); a full disk: DiskFull, told what was kept and how to continue."""
    store, run_id, plan = sweep.store, sweep.run_id, sweep.plan
    done = store.done_keys(run_id, plan.settings.rounds)
    remaining = plan.size - len(done)
    todo = [case for case in plan.cases if case.key not in done]
    estimate = format_estimate(estimate_s(todo, plan.settings))
    print(
        f"run {run_id}: {remaining} of {plan.size} cells to run (rough estimate {estimate}), database {args.db}",
        file=sys.stderr,
        flush=True,
    )
    print_budget(plan.settings, ray=sweep.executor is not None, flags=given(args, ["target_ci", "max_rounds"]))
    try:
        execute_cells(args, sweep, remaining)
        store.finish_run(run_id)
    except DiskFull as full:  # a group's commit, or a worker's write, found no room: the group is not stored
        kept = "the cells stored before are kept"
        with contextlib.suppress(sqlite3.Error):  # a read needs no room; the line must come out all the same
            kept = cells_kept(len(store.done_keys(run_id, plan.settings.rounds)), "stored")
        raise full.told(kept, f"continue with `{resume_command(args, run_id, sweep.cluster is not None)}`") from full
    except (KeyboardInterrupt, nodes.NodeLost) as stop:
        lost = isinstance(stop, nodes.NodeLost)
        if sweep.cluster is not None:
            sweep.cluster.close(f"stopped the sweep: {stop}" if lost else "was interrupted", ok=False)
        print(
            f"fwbench: {f'{stop}; the sweep stops' if lost else 'interrupted'}; finished cells are stored; "
            f"continue with `{resume_command(args, run_id, sweep.cluster is not None)}`",
            file=sys.stderr,
        )
        return 1 if lost else 130
    return None


def execute_cells(args: argparse.Namespace, sweep: Sweep, remaining: int) -> None:
    """The ``remaining`` cells of ``sweep`` on this machine (or on Ray), under a progress bar, each stored (and with
    ``--tensorboard`` written) as it finishes."""
    store, run_id, plan = sweep.store, sweep.run_id, sweep.plan
    with sweep_progress(remaining) as listener:
        hears = tensorboard_listener(listener, store, run_id, plan.settings.to_dict(), args.tensorboard)
        if sweep.executor is None:
            execute(store, run_id, plan, hears, lambda line: print(line, file=sys.stderr, flush=True))
            if args.tensorboard is not None and plan.settings.budget_s is not None:
                rewrite_tensorboard(store, run_id, plan.settings.to_dict(), args.tensorboard)
        else:
            execute_on_ray(store, run_id, plan, hears, sweep.executor)


def print_summary(args: argparse.Namespace, store: Store, run_id: int) -> None:
    """The run's results table, then one line of its cells' statuses and where to read them again."""
    results = store.results([run_id])
    print_results(results, make_console(), title="fwbench results", peak=latest_peak(store))
    counts = Counter(row.status for row in results)
    summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    print(f"run {run_id}: {summary}. Results are in {args.db}; see `fwbench report --db {args.db} --run {run_id}`")
