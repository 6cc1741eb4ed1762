"""``fwbench export``: write the artefact a deployment runtime runs (ONNX, TFLite, SavedModel, AOTInductor package)
for one model at one shape, with our weights, reloaded by its engine and checked against the float64 reference,
for users to take away. Runs in a fresh worker like every cell; the manager side imports no framework."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fwbench.cli.common import check_model_options, positive_float, positive_int
from fwbench.diskfull import DiskFull
from fwbench.frameworks import get_runtime, missing_implementation, missing_requirement, runtimes
from fwbench.measure import environment
from fwbench.models import get_model
from fwbench.runner.outcome import run_worker
from fwbench.runner.planner import check_threads_fit
from fwbench.spec import Case, Settings, SpecError
from fwbench.units import format_bytes, format_seconds


def exportable() -> list[str]:
    """The runtimes ``fwbench export`` writes an artefact for."""
    return [name for name, info in runtimes().items() if info.artefact and "inference" in info.phases]


def add_parser(commands: Any) -> None:
    """Register ``export`` on the subcommand parsers ``commands``."""
    export = commands.add_parser(
        "export",
        help="write the artefact a deployment runtime runs (ONNX, TFLite, SavedModel, .pt2), checked",
        description="Export MODEL with our weights as RUNTIME runs it (the same export the runtime's cells time), "
        "at one input shape, to --out; load it back with the runtime's engine and compare its outputs with the "
        "float64 reference. Prints one line (what was written, its size, export and load seconds, the parity "
        "error); exit 1 if the export fails, the disk is full, or the reloaded artefact computes something else "
        "(nothing is left at --out then), 2 on bad input (nothing written).",
    )
    export.add_argument("model", help="model name (fwbench list)")
    export.add_argument(
        "--runtime",
        required=True,
        help="a runtime that writes an artefact: torch:export, tensorflow:savedmodel, onnxruntime:torch, "
        "onnxruntime:tensorflow, openvino:torch, litert:tensorflow (or a plugin's; fwbench list)",
    )
    export.add_argument("--out", required=True, type=Path, metavar="PATH", help="where to write it (must not exist)")
    export.add_argument("--batch-size", type=positive_int, help="default: the model's parity shape (2)")
    export.add_argument("--seq-len", type=positive_int, help="default: the model's parity shape (16)")
    export.add_argument("--weights", type=Path, metavar="FILE", help="safetensors weights (default: seeded canonical)")
    export.add_argument("--threads", type=positive_int, help="intra-op threads (default: physical cores)")
    export.add_argument("--seed", type=int, default=0, help="seed of the weights and inputs (default 0)")
    export.add_argument("--timeout", type=positive_float, default=600.0, metavar="SECONDS", help="default 600")


def _checked_case(args: argparse.Namespace) -> Case:
    """The case to export, or SpecError (one line) for anything that cannot be exported where asked."""
    description = get_model(args.model)
    info = get_runtime(args.runtime)
    if not info.artefact or "inference" not in info.phases:  # onnxruntime-genai:torch: a generation loop's folder
        raise SpecError(f"{args.runtime} writes no artefact; fwbench export takes: {', '.join(exportable())}")
    missing = missing_requirement(info) or missing_implementation(info, description.arch)
    if missing:
        raise SpecError(f"{args.runtime}: {missing}")
    out: Path = args.out
    if out.exists() or out.is_symlink():
        raise SpecError(f"--out {out} exists; remove it or choose another path")
    if not out.parent.is_dir():
        raise SpecError(f"--out {out}: folder {out.parent} does not exist")
    if info.artefact_suffix and out.suffix != info.artefact_suffix:
        raise SpecError(
            f"--out {out}: {args.runtime} writes an {info.artefact}: the path must end in {info.artefact_suffix}"
        )
    batch, seq = description.parity_shape()
    if args.seq_len is not None and not description.has_sequence:
        raise SpecError(f"--seq-len: {args.model} has no sequence axis")
    check_model_options(description, args.seq_len, args.weights)
    seq_len = (args.seq_len or seq) if description.has_sequence else None
    return Case(args.model, args.runtime, batch_size=args.batch_size or batch, seq_len=seq_len)


def _size_bytes(path: Path) -> int:
    """The bytes of a file, or of every file under a folder."""
    if path.is_file():
        return path.stat().st_size
    return sum(file.stat().st_size for file in path.rglob("*") if file.is_file())


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()


def command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    case = _checked_case(args)
    settings = Settings(
        threads=args.threads or environment.physical_core_count(), timeout_s=args.timeout, seed=args.seed
    )
    check_threads_fit(settings)
    out: Path = args.out
    # Written under a hidden name beside --out (same suffix: AOTInductor wants .pt2), renamed once checked.
    partial = out.with_name(f".{out.stem}.partial-{os.getpid()}{out.suffix}")
    try:
        outcome = run_worker(
            case,
            settings,
            check_parity=False,
            export_to=str(partial),
            weights_path=str(args.weights) if args.weights else None,
        )
        if outcome.status != "ok":
            if outcome.details.get("disk_full"):  # the worker's write (the artefact, a compiler's files) found no room
                kept = f"nothing is left at {out}"
                raise DiskFull.from_report(outcome.details["disk_full"], out, kept, "export again", partial=partial)
            print(f"fwbench export: {args.runtime} {args.model}: {outcome.status}: {outcome.reason}", file=sys.stderr)
            return 1
        try:
            os.replace(partial, out)
        except OSError as exc:
            print(f"fwbench export: could not move the artefact to {out}: {exc.strerror or exc}", file=sys.stderr)
            return 1
    finally:
        _remove(partial)
    report: dict[str, Any] = outcome.details.get("compile_report", {})
    parity: dict[str, Any] = outcome.details.get("parity", {})
    seconds = ", ".join(
        f"{label} {format_seconds(report[key])}"
        for key, label in (("export_s", "export"), ("aot_compile_s", "AOT compile"), ("load_s", "load"))
        if key in report
    )
    shape = f"batch {case.batch_size}" + (f", seq {case.seq_len}" if case.seq_len is not None else "")
    worst = max((errors["rel_l2"] for errors in parity.get("outputs", {}).values()), default=None)
    check = (
        f"parity vs the float64 reference: relative L2 {worst:.2g} (limit {parity['tolerance_rel_l2']:g})"
        if worst is not None
        else "no float64 reference for this model"
    )
    info = get_runtime(args.runtime)
    print(f"wrote {out}: {info.artefact}, {format_bytes(_size_bytes(out))}, {shape}; {seconds}; {check}")
    return 0
