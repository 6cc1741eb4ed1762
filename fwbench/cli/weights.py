"""``fwbench weights``: write a model's seeded canonical weights to a safetensors file."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fwbench.cli.common import check_output_file
from fwbench.models import get_model
from fwbench.models.weights_io import save_weights
from fwbench.spec import SpecError


def add_parser(commands: Any) -> None:
    """Register ``weights`` on the subcommand parsers ``commands``."""
    weights = commands.add_parser(
        "weights",
        help="write a model's canonical weights to a safetensors file",
        description="Write a model's seeded canonical weights (Hugging Face / "
        "torchvision names and layouts) to a safetensors file.",
    )
    weights.add_argument("model", help="model name (see `fwbench list`)")
    weights.add_argument("--out", type=Path, required=True, metavar="FILE.safetensors")
    weights.add_argument("--seed", type=int, default=0, help="default 0")


def command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    model = get_model(args.model)
    check_output_file("--out", args.out)
    try:
        save_weights(model, model.canonical_weights(args.seed), args.out, args.seed)
    except OSError as exc:
        raise SpecError(f"--out {args.out}: cannot write it: {exc.strerror or exc}") from None
    print(
        f"wrote {args.out}: {args.model}, {len(model.param_schema())} tensors, {model.parameter_count():,} "
        f"parameters, seed {args.seed}",
        file=sys.stderr,
    )
    return 0
