"""``fwbench diff``: where runtimes part from the float64 reference, layer by layer; exit 1 when any runtime diverges
or fails."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fwbench.cli.common import check_model_options, positive_float, positive_int, untimed_settings
from fwbench.frameworks import get_runtime
from fwbench.models import get_model
from fwbench.report.diff_table import diff_table, training_table, verdict_lines
from fwbench.report.table import make_console
from fwbench.runner.diff import diff_model
from fwbench.runner.phases import get_phase
from fwbench.runner.planner import parse_names
from fwbench.spec import DTYPES, SpecError


def add_parser(commands: Any) -> None:
    """Register ``diff`` on the subcommand parsers ``commands``."""
    diff = commands.add_parser(
        "diff",
        help="name the first layer where runtimes part from the float64 reference",
        description="Run MODEL once in each runtime (each in its own worker) on the same input with the same weights, "
        "returning the model's named checkpoints (embeddings, each layer's attention, feed-forward and output; "
        "ResNet's stem and blocks; the MLP's layers) from the runtime's own program — compiled runtimes compile "
        "them as extra outputs — and compare each with the float64 reference. A checkpoint may use its share of the "
        "output tolerance (tolerance × sqrt(k / (n + 1)) for the k-th of n); the first over it is named per runtime. "
        "Deployment engines are compared at their outputs only. Exit 1 when any runtime diverges or fails.",
    )
    diff.add_argument("model", help="one model name (fwbench list)")
    diff.add_argument("--runtimes", required=True, help="comma-separated runtimes")
    diff.add_argument(
        "--phase",
        choices=("inference", "training"),
        default="inference",
        help="inference: the forward pass's checkpoints (default); training: also each runtime's first training step, "
        "its loss against the float64 reference loss and every trained tensor's gradient against the first runtime's "
        "(there is no float64 gradient), the first one over the tolerance named in backward order",
    )
    diff.add_argument(
        "--dtype",
        choices=DTYPES,
        default="fp32",
        help="fp32; bf16: the one mixed-precision policy, to see how its error grows layer by layer; int8: the "
        "deployment engines' quantisation (outputs only); sets the tolerance (default: fp32)",
    )
    diff.add_argument("--batch-size", type=positive_int, help="default: the model's parity shape (2)")
    diff.add_argument("--seq-len", type=positive_int, help="default: the model's parity shape (16)")
    diff.add_argument(
        "--weights", type=Path, metavar="FILE", help="safetensors weights; default: the seeded canonical weights"
    )
    diff.add_argument("--format", choices=("table", "json"), default="table", help="default: table")
    diff.add_argument("--threads", type=positive_int, help="intra-op threads (default: physical cores)")
    diff.add_argument("--seed", type=int, default=0, help="seed of weights and inputs (default 0)")
    diff.add_argument("--timeout", type=positive_float, default=600.0, metavar="SECONDS", help="per runtime")


def command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    description = get_model(args.model)
    runtime_names = parse_names("--runtimes", args.runtimes)
    repeated = sorted({name for name in runtime_names if runtime_names.count(name) > 1})
    if repeated:
        raise SpecError(f"--runtimes names {', '.join(repeated)} more than once")
    for name in runtime_names:
        if get_runtime(name).distributed:
            raise SpecError(f"{name} runs as several processes; fwbench diff compares runtimes of one process")
    check_model_options(description, args.seq_len, args.weights)
    settings = untimed_settings(args)
    refused = get_phase(args.phase).dtype_unsupported(args.dtype) or (
        description.training_unsupported() if args.phase == "training" else None
    )
    if refused:
        raise SpecError(refused)
    result = diff_model(
        args.model,
        runtime_names,
        settings,
        args.batch_size,
        args.seq_len,
        args.weights,
        dtype=args.dtype,
        phase=args.phase,
    )
    if args.format == "json":
        print(json.dumps(result.to_dict(), indent=2))
    else:
        console = make_console()
        console.print(diff_table(result))
        if result.phase == "training":
            console.print(training_table(result))
        for line in verdict_lines(result):
            console.print(line)
    return 1 if result.failed else 0
