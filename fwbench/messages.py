"""What manager and worker say to each other: a job on the worker's stdin, JSON lines back on a pipe.

The worker writes one ``{"type": "stage", ...}`` line as it enters each stage and exactly one
``{"type": "result", ...}`` line at the end. An *interleaved* job (``Job.interleaved``) also talks in between:
after warm-up the worker writes ``{"type": "ready", ...}`` (its resident peak) and then serves the commands the
manager writes on its stdin, one JSON line each: ``{"command": "calibrate"}`` → the calls per block →
``{"type": "calibrated", ...}`` (not sent in a later round where the manager already chose the calls:
:func:`fwbench.runner.interleave.equal_blocks`); ``{"command": "block", "calls": n}`` → one timed block of ``n`` calls
→ ``{"type": "block", ...}``; ``{"command": "finish"}`` → its remaining stages and the result, after which a
single-process worker exits without the interpreter's teardown. Framework chatter on stdout/stderr never mixes in,
because results travel on their own file descriptor. The thread budget reaches the worker's native
pools through its environment (:func:`thread_environment`), set by the manager before it starts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fwbench.spec import Case, Settings

STAGES = (
    "start", "import", "build", "compile", "first_call", "parity", "warmup", "timing", "profile", "fit", "evaluate",
    "kernels", "done",
)  # fmt: skip


@dataclass(frozen=True)
class Job:
    """One cell for one worker.

    With ``verify_output`` set, the worker only builds the model and writes its outputs at the
    case's shape to that .npz path (``fwbench verify``); nothing is timed. For a training case it takes
    ``train_steps`` optimizer steps and writes their losses and the trained parameters instead. ``weights_path`` is a
    safetensors file to use instead of the seeded canonical weights. With ``export_to`` set (``fwbench export``), the
    worker writes the artefact the runtime runs at the case's shape to that path, loads it back with the engine and
    checks its outputs against the float64 reference; nothing is timed. With ``profile_to`` set (``fwbench
    profile``), the worker times ``profile_calls`` calls without the profiler and as many under its framework's
    profiler, keeping the raw trace in that folder; no benchmark samples.
    """

    case: Case
    settings: Settings
    check_parity: bool = True
    verify_output: str | None = None
    weights_path: str | None = None
    export_to: str | None = None
    train_steps: int = 20  # verify of a training case: optimizer steps taken before writing losses and parameters
    interleaved: bool = False  # serve timed blocks on command (the scheduler's interleaved rounds)
    budget_s: float | None = None  # interleaved: this round's timing budget, seconds (block calibration)
    profile_to: str | None = None  # fwbench profile: the folder for the raw trace
    profile_calls: int = 5  # fwbench profile: calls timed without the profiler, and as many under it
    checkpoints: bool = False  # verify_output also holds the model's checkpoints (fwbench diff)
    record_kernels: bool = True  # the cell's first round: its kernel libraries (details.kernels), once per cell

    def to_json(self) -> str:
        return json.dumps(
            {
                "case": self.case.to_dict(),
                "settings": self.settings.to_dict(),
                "check_parity": self.check_parity,
                "verify_output": self.verify_output,
                "weights_path": self.weights_path,
                "export_to": self.export_to,
                "train_steps": self.train_steps,
                "interleaved": self.interleaved,
                "budget_s": self.budget_s,
                "profile_to": self.profile_to,
                "profile_calls": self.profile_calls,
                "checkpoints": self.checkpoints,
                "record_kernels": self.record_kernels,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Job:
        data = json.loads(text)
        return cls(
            case=Case.from_dict(data["case"]),
            settings=Settings.from_dict(data["settings"]),
            check_parity=bool(data.get("check_parity", True)),
            verify_output=data.get("verify_output"),
            weights_path=data.get("weights_path"),
            export_to=data.get("export_to"),
            train_steps=int(data.get("train_steps", 20)),
            interleaved=bool(data.get("interleaved", False)),
            budget_s=data.get("budget_s"),
            profile_to=data.get("profile_to"),
            profile_calls=int(data.get("profile_calls", 5)),
            checkpoints=bool(data.get("checkpoints", False)),
            record_kernels=bool(data.get("record_kernels", True)),
        )


# What a worker says of a runtime that fwbench cannot profile (``fwbench profile``, ``fwbench explain``'s levers).
NO_PROFILER = "has no profiler in fwbench"


def thread_environment(threads: int, interop_threads: int) -> dict[str, str]:
    """Environment variables that carry the thread budget to the frameworks' native pools."""
    return {
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "OPENBLAS_NUM_THREADS": str(threads),
        "TF_NUM_INTRAOP_THREADS": str(threads),
        "TF_NUM_INTEROP_THREADS": str(interop_threads),
    }


def stage_message(stage: str) -> str:
    """The line a worker writes as it enters ``stage`` (one of :data:`STAGES`)."""
    return message("stage", stage=stage)


def message(kind: str, **fields: Any) -> str:
    """One line of ``kind`` (stage, ready, calibrated, block, result) with ``fields``."""
    return json.dumps({"type": kind, **fields}) + "\n"


def result_message(result: dict[str, Any]) -> str:
    """The one line a worker writes at the end: its cell's result."""
    return message("result", **result)
