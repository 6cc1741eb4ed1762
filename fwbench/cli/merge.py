"""``fwbench merge``: results databases (shards of one sweep, runs from several machines) into one."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fwbench.store.merge import merge_stores


def add_parser(commands: Any) -> None:
    """Register ``merge`` on the subcommand parsers ``commands``."""
    merge = commands.add_parser(
        "merge",
        help="merge results databases into one (shards of one plan reunited into one run)",
        description="Copy every run of the SOURCE databases into --into (created if absent), ids remapped. Runs of "
        "`fwbench run --shard I/N` with the same plan hash are reunited into one run; a run already in the target "
        "(merged before) is skipped; the same shard from two different runs, or a source that is missing, foreign "
        "or corrupt, is refused with one line and the target untouched (one transaction).",
    )
    merge.add_argument("sources", nargs="+", type=Path, metavar="SOURCE", help="fwbench databases to merge")
    merge.add_argument("--into", type=Path, required=True, metavar="DB", help="the database to merge into")


def command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    summary = merge_stores(args.sources, args.into)
    for run in summary.runs:
        holds = "the whole plan" if run.shard is None else f"shards {run.shard} so far"
        print(
            f"run {run.run_id} of {args.into}: {run.cells} cells from {', '.join(run.parts)}; holds {holds} "
            f"(plan {str(run.plan_hash)[:12]})"
        )
    for duplicate in summary.duplicates:
        print(f"fwbench: {duplicate} is already in {args.into}; skipped", file=sys.stderr)
    if not summary.runs:
        print(f"nothing new to merge into {args.into}", file=sys.stderr)
    return 0
