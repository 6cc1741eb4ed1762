"""``fwbench env``: print the environment record stored with each run; ``--peak`` measures the fp32 matmul
peak instead (:mod:`fwbench.cli.peak`)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from rich.console import Console

from fwbench.cli import peak
from fwbench.cli.common import given, positive_float, positive_int
from fwbench.measure import environment
from fwbench.models.gemm import GEMM
from fwbench.report.environment_table import environment_table
from fwbench.spec import SpecError
from fwbench.store import DEFAULT_DB

PEAK_ONLY_FLAGS = ("threads", "max_time", "db")


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
