"""The ``fwbench`` command line: one module per command (run, report, compare, verify, diff, export, weights, listing for
``list``, env and peak for ``env --peak``, data for ``data make``, merge), the parser helpers and argument types in
:mod:`fwbench.cli.common`; ``run``'s flags and its plan apart from its execution (:mod:`.run_flags`, :mod:`.run_plan`).

Bad input gets one line on stderr, exit status 2, and nothing written.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from fwbench import __version__
from fwbench.cli import compare, data, diff, env, explain, export, listing, merge, profile, report, run, verify, weights
from fwbench.cli.common import EXIT_USAGE, Parser, UsageError
from fwbench.cli.run import tensorboard_listener
from fwbench.cli.run_plan import plan_from_args
from fwbench.diskfull import DiskFull
from fwbench.runner.planner import suite_plan
from fwbench.spec import SpecError
from fwbench.store import StoreError

__all__ = ["EXIT_USAGE", "UsageError", "build_parser", "main", "plan_from_args", "suite_plan", "tensorboard_listener"]

DESCRIPTION = (
    "fwbench: benchmark deep-learning frameworks against each other, honestly "
    "(run | verify | diff | export | profile | explain | weights | data | report | compare | merge | list | env)."
)
Command = Callable[[argparse.Namespace, Sequence[str]], int]
# Each command's module registers its parser (add_parser) and runs it (command); in the order `--help` lists them.
COMMANDS: dict[str, tuple[Callable[[Any], None], Command]] = {
    "run": (run.add_parser, run.command),
    "report": (report.add_parser, report.command),
    "compare": (compare.add_parser, compare.command),
    "merge": (merge.add_parser, merge.command),
    "verify": (verify.add_parser, verify.command),
    "diff": (diff.add_parser, diff.command),
    "export": (export.add_parser, export.command),
    "profile": (profile.add_parser, profile.command),
    "explain": (explain.add_parser, explain.command),
    "weights": (weights.add_parser, weights.command),
    "data": (data.add_parser, data.command),
    "list": (listing.add_parser, listing.command),
    "env": (env.add_parser, env.command),
}


def build_parser() -> Parser:
    """The ``fwbench`` parser with every subcommand."""
    parser = Parser(prog="fwbench", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"fwbench {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser, metavar="COMMAND")
    for add_parser, _ in COMMANDS.values():
        add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: sys.argv[1:]); the exit status: 0, 1 (a command's own failure; a
    full disk: one line on stderr, what was stored before kept), 2 (bad input, one line on stderr, nothing written),
    130 (interrupted)."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(arguments)
        _, command = COMMANDS[args.command]
        return command(args, arguments)
    except (UsageError, SpecError, StoreError) as exc:
        message = str(exc)
        print(message if message.startswith("fwbench") else f"fwbench: error: {message}", file=sys.stderr)
        return EXIT_USAGE
    except DiskFull as exc:  # the command has said what was kept and how to go on
        print(exc, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("fwbench: interrupted; finished cells are stored (resume with --resume RUN_ID)", file=sys.stderr)
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
