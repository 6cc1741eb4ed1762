"""``fwbench run``'s flags as a plan: which flag sets which stored setting, the grid flags, and the planner's choices
made of them (flags over the settings file over the suite over the defaults)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fwbench.cli.common import given
from fwbench.models import register_checkpoint
from fwbench.runner.planner import PlanChoices, resolve_plan
from fwbench.spec import Plan

# Flag (argparse attribute) -> the Settings field it sets.
SETTINGS_FLAGS = {
    "threads": "threads",
    "interop_threads": "interop_threads",
    "protocol": "protocol",
    "max_time": "max_time_s",
    "warmup": "warmup_calls",
    "timeout": "timeout_s",
    "memory_limit": "memory_limit_bytes",
    "seed": "seed",
    "weights": "weights_path",
    "compile_mode": "compile_mode",
    "optimizer": "optimizer",
    "epochs": "epochs",
    "fit_samples": "fit_samples",
    "fit_logging": "fit_logging",
    "rounds": "rounds",
    "max_rounds": "max_rounds",
    "target_ci": "target_ci",
    "budget": "budget_s",
    "spread": "spread_s",
    "interleave": "interleave",
    "settle": "settle_s",
    "input": "data_input",
    "crop": "crop",
    "transform": "transform",
    "data_batches": "data_batches",
    "data_source": "data_source",
    "skip_corrupt": "skip_corrupt",
    "fit_source": "fit_source",
    "fit_workers": "fit_workers",
    "rank_threads": "rank_threads",
    "nnodes": "nodes",
    "max_delay": "serve_max_delay_s",
    "p99_bound": "serve_p99_bound_s",
    "point_duration": "serve_point_s",
    "port": "serve_port",
    "new_tokens": "new_tokens",
}
GRID_FLAGS = (
    "suite", "config", "models", "runtimes", "batch_sizes", "seq_lens", "workers", "procs", "scaling", "phase",
    "dtype", "device",
)  # fmt: skip


def plan_flags_given(args: argparse.Namespace) -> list[str]:
    """The grid and settings flags given (as ``--flag``), ``--nnodes`` aside: the flags that make a plan."""
    return [flag for flag in given(args, [*GRID_FLAGS, *SETTINGS_FLAGS]) if flag != "--nnodes"]


def plan_choices(args: argparse.Namespace, defaults: Mapping[str, Any] | None = None) -> PlanChoices:
    """The flags of ``fwbench run``, or of a command that has some of them (``profile``), as the planner's choices
    (None: not given; a flag the command lacks counts as not given), its settings over the command's own
    ``defaults`` (settings fields)."""
    chosen = {
        field: getattr(args, flag) for flag, field in SETTINGS_FLAGS.items() if getattr(args, flag, None) is not None
    }
    models = args.models
    weights = getattr(args, "weights", None)
    if weights is not None and Path(weights).is_dir():  # a Hugging Face checkpoint: its model, by the folder's name
        name = register_checkpoint(Path(weights)).name
        models = name if models is None else models
    return PlanChoices(
        suite=getattr(args, "suite", None),
        config=getattr(args, "config", None),
        models=models,
        runtimes=args.runtimes,
        batch_sizes=args.batch_sizes,
        seq_lens=args.seq_lens,
        workers=getattr(args, "workers", None),
        procs=getattr(args, "procs", None),
        scaling=getattr(args, "scaling", None),
        phase=args.phase,
        dtype=args.dtype,
        device=args.device,
        settings={**(defaults or {}), **chosen},
    )


def plan_from_args(args: argparse.Namespace) -> Plan:
    """Flags over settings file over suite over defaults (the planner's :func:`resolve_plan`); SpecError on any
    invalid choice."""
    return resolve_plan(plan_choices(args))
