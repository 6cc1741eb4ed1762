"""``fwbench env``: print the environment record stored with each run; ``--peak`` measures the fp32 matmul
peak instead (:mod:`fwbench.cli.peak`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from rich.console import Console

from fwbench.cli import peak
from fwbench.cli.common import given, positive_float, positive_int
from fwbench.measure import environment, noise, probe
from fwbench.models.gemm import GEMM
from fwbench.report.environment_table import environment_table, noise_table
from fwbench.spec import SpecError
from fwbench.store import DEFAULT_DB

PEAK_ONLY_FLAGS = ("threads", "max_time", "db")
NOISE_ONLY_FLAGS = ("rounds", "seconds")


def add_parser(commands: Any) -> None:
    """Register ``env`` on the subcommand parsers ``commands``."""
    env = commands.add_parser(
        "env",
        help="print the environment record stored with each run; --peak: measure the machine's fp32 matmul peak",
        description="Print the environment record stored with each run. With --peak, "
        f"measure the fp32 matmul peak instead: the gemm model ({GEMM.n}×{GEMM.n} weight) at "
        f"batch {GEMM.n} in each framework's native runtime (torch:eager, tensorflow:function, "
        "jax:jit, and a plugin framework's own; those installed), each in its own "
        "worker, stored as a run of suite 'peak' that reports use for their % peak column.",
    )
    env.add_argument("--format", choices=("json", "table"), default="table", help="default: table")
    env.add_argument("--peak", action="store_true", help="measure GFLOP/s per runtime and store the best as the peak")
    env.add_argument(
        "--noise",
        action="store_true",
        help="run a fixed probe (a 256×256 matmul and a 1 µs call, numpy, one pinned thread) in fresh processes for "
        "about a minute and print how much timings move within and between processes, the machine's noise "
        "counters and the --rounds that give a ±2%% CI here",
    )
    env.add_argument("--rounds", type=positive_int, help="--noise: probe processes (default 6)")
    env.add_argument("--seconds", type=positive_float, help="--noise: seconds per probe process (default 8)")
    env.add_argument(
        "--threads",
        type=positive_int,
        help=f"--peak: intra-op threads (default: physical cores, here {environment.physical_core_count()})",
    )
    env.add_argument(
        "--max-time", type=positive_float, metavar="SECONDS", help="--peak: timing budget per runtime (default 5)"
    )
    env.add_argument(
        "--db",
        help=f"--peak: SQLite results database the peak run is stored in (default {DEFAULT_DB}, "
        "where `run` and `report` look by default)",
    )


def command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    if args.peak and args.noise:
        raise SpecError("--peak and --noise: one at a time")
    noise_only = given(args, NOISE_ONLY_FLAGS)
    if noise_only and not args.noise:
        raise SpecError(f"{', '.join(noise_only)}: only with env --noise")
    if args.noise:
        return noise_command(args)
    if args.peak:
        return peak.command(args, argv)
    peak_only = given(args, PEAK_ONLY_FLAGS)
    if peak_only:
        raise SpecError(f"{', '.join(peak_only)}: only with env --peak")
    record = environment.collect()
    if args.format == "json":
        print(json.dumps(record, indent=2, sort_keys=True))
        return 0
    Console().print(environment_table(record))
    return 0


def noise_command(args: argparse.Namespace) -> int:
    """``fwbench env --noise``: the probe's rounds, then its table (or JSON)."""
    rounds, seconds = args.rounds or 6, args.seconds or 8.0
    if rounds < 2:
        raise SpecError("--rounds: the noise probe needs at least 2 processes to see the spread between them")
    cpu = environment.cpus_one_per_core()[0]
    print(f"fwbench env --noise: {rounds} probe processes × {seconds:g} s on CPU {cpu}", file=sys.stderr, flush=True)
    before, children_before = noise.read(time.perf_counter()), os.times()
    results = probe.run_rounds(rounds, seconds, cpu)
    after, children_after = noise.read(time.perf_counter()), os.times()
    totals = noise.NoiseTotals()
    totals.add(before, after)
    probe_cpu = (children_after.children_user + children_after.children_system) - (
        children_before.children_user + children_before.children_system
    )
    totals.other_cpu_s = max(0.0, totals.other_cpu_s - probe_cpu)  # the probe processes are not "other"
    found = probe.spreads(results)
    if args.format == "json":
        print(json.dumps({"probes": [dataclasses.asdict(p) for p in found], "noise": totals.to_dict()}, indent=2))
        return 0
    Console().print(noise_table(found, totals, rounds))
    return 0
