"""What every command shares: the one-line-error parser, argument types, the run-id look-up, small checks.

Bad input raises :class:`UsageError` (from argparse) or :class:`~fwbench.spec.SpecError`; ``main`` prints it
as one line on stderr and exits 2, with nothing written.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from fwbench.measure import environment
from fwbench.models.base import ModelDescription
from fwbench.models.weights_io import load_weights
from fwbench.runner.planner import check_threads_fit
from fwbench.spec import MAX_COUNT, Settings, SpecError
from fwbench.store import DEFAULT_DB, RunRecord, Store
from fwbench.units import parse_bytes

EXIT_USAGE = 2
DB_HELP = f"SQLite results database (default {DEFAULT_DB})"
TENSORBOARD_HELP = (
    "write TensorBoard event files into DIR: one run per model × runtime (DIR/<model>/"
    "<framework>_<mode>/), scalars per ok cell tagged <phase>/<metric>/<shape>: loss per optimizer "
    "step (training), step_time_s, samples_per_s and tokens_per_s per timed sample, and the "
    "settings as text"
)

RunId = int | str  # a positive run id, or "latest"


class UsageError(Exception):
    """Bad input: one line for the user, exit status 2."""


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line instead of usage text."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: error: {message}")


# -- argument types: each turns text into a value or raises ArgumentTypeError (one line) -------------------
def positive_float(text: str) -> float:
    """A positive finite number (seconds, mostly)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive finite number")
    return value


def non_negative_float(text: str) -> float:
    """A finite number ≥ 0 (seconds)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number of at least 0")
    return value


DURATION_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration(text: str) -> float:
    """A positive finite duration in seconds: ``450``, ``90s``, ``7.5m``, ``2h``."""
    value = _duration_s(text)
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive finite duration")
    return value


def non_negative_duration(text: str) -> float:
    """A finite duration in seconds of at least 0: ``0``, ``450``, ``90s``, ``7.5m``, ``2h``."""
    value = _duration_s(text)
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite duration of at least 0")
    return value


def _duration_s(text: str) -> float:
    """Seconds written as ``450``, ``90s``, ``7.5m``, ``2h`` or ``20ms`` (any sign); ArgumentTypeError for anything
    else."""
    unit = next((unit for unit in DURATION_UNITS if text.endswith(unit) and text[: -len(unit)][-1:].isdigit()), "")
    number = text[: -len(unit)] if unit else text
    try:
        return float(number) * DURATION_UNITS[unit or "s"]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration (seconds, or with ms, s, m or h: 20ms, 90s, 7.5m)"
        ) from None


def on_off(text: str) -> bool:
    """``on`` → True, ``off`` → False."""
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected on or off")
    return text == "on"


def positive_int(text: str) -> int:
    """A positive integer up to MAX_COUNT, ASCII digits only."""
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit()) or not 0 < int(digits) <= MAX_COUNT:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer up to {MAX_COUNT}")
    return int(text)


def non_negative_int(text: str) -> int:
    """An integer from 0 up to MAX_COUNT, ASCII digits only (a seed, a worker count)."""
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit()) or int(digits) > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer from 0 to {MAX_COUNT}")
    return int(digits)


def fraction(text: str) -> float:
    """A non-negative finite number (0.05 = 5%)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r} must be a non-negative finite number (0.05 = 5%)")
    return value


def directory(text: str) -> str:
    """An absolute directory path (workers may not share the caller's relative view); an existing file is refused."""
    path = Path(text).expanduser().resolve()
    if not text or path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is not a directory")
    return str(path)


def run_id(text: str) -> RunId:
    """A run id, or 'latest'."""
    return "latest" if text == "latest" else positive_int(text)


def byte_count(text: str) -> int:
    """Bytes, with an optional K/M/G suffix (2G, 512M)."""
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None


# -- checks and look-ups ---------------------------------------------------------------------------------
def resolve_run(store: Store, run: RunId, db: str | Path, label: str, kind: str = "benchmark") -> RunRecord:
    """The run ``run`` (an id or 'latest': the newest of ``kind``) of ``store`` (opened from ``db``); ``label``
    names the argument that gave it (``--run``, ``--resume``, ``RUN_A``). SpecError ``<label> <run> is not in
    <db>; runs there: [...]`` when it is absent or of another kind (a profile run has no benchmark results)."""
    number = store.latest_run_id(kind) if run == "latest" else int(run)
    record = None if number is None else store.get_run(number)
    known = [r.id for r in store.runs() if r.kind == kind]
    if record is None:
        runs = "runs" if kind == "benchmark" else f"{kind} runs"
        raise SpecError(f"{label} {run} is not in {db}; {runs} there: {known or 'none'}")
    if record.kind != kind:
        raise SpecError(
            f"{label} {run} is a {record.kind} run, not a {kind} run; {kind} runs in {db}: {known or 'none'}"
        )
    return record


def check_model_options(description: ModelDescription, seq_len: int | None, weights: Path | None) -> None:
    """SpecError (one line) for a ``--seq-len`` the model cannot take or a ``--weights`` file that does not fit it."""
    problem = description.supports_seq_len(seq_len) if seq_len is not None else None
    if problem:
        raise SpecError(problem)
    if weights is not None:
        try:
            load_weights(description, weights)
        except ValueError as exc:
            raise SpecError(str(exc)) from None


def untimed_settings(args: argparse.Namespace) -> Settings:
    """The settings of ``verify`` and ``diff`` (nothing timed): ``--threads`` (default: physical cores), ``--timeout``
    per worker, ``--seed``; checked to fit this machine's CPUs."""
    settings = Settings(
        threads=args.threads or environment.physical_core_count(),
        timeout_s=args.timeout,
        max_time_s=min(5.0, args.timeout / 2),
        seed=args.seed,
    )
    check_threads_fit(settings)
    return settings


def given(args: argparse.Namespace, names: Sequence[str]) -> list[str]:
    """The flags among ``names`` (attribute names) that the user gave (an empty string counts as given)."""
    return ["--" + name.replace("_", "-") for name in names if getattr(args, name) is not None]


def check_output_file(flag: str, path: Path | None) -> None:
    """Refuse a FILE argument that is a folder or whose folder does not exist."""
    if path is not None and (path.is_dir() or not path.parent.is_dir()):
        raise SpecError(f"{flag} {path}: give a file path in an existing folder")


def check_tensorboard_dir(path: Path | None) -> None:
    """Refuse a --tensorboard DIR that is not a folder or cannot be created (nothing is written)."""
    if path is None:
        return
    if path.exists() and not path.is_dir():
        raise SpecError(f"--tensorboard {path} is not a folder")
    folder = path
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise SpecError(f"--tensorboard {path}: cannot write there, {folder} is not a writable folder")


def terminate_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit so the running worker is killed on the way out."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
