"""What manager and worker say to each other: a job on the worker's stdin, JSON lines back on a pipe.

The worker writes one ``{"type": "stage", ...}`` line as it enters each stage and exactly one
``{"type": "result", ...}`` line at the end. Framework chatter on stdout/stderr never mixes in,
because results travel on their own file descriptor.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fwbench.spec import Case, Settings

STAGES = ("start", "import", "build", "compile", "first_call", "parity", "warmup", "timing", "fit", "evaluate", "done")

# Parity tolerance on the relative L2 error against the model's float64 reference, per dtype.
PARITY_REL_L2_TOLERANCE = {"fp32": 1e-4, "bf16": 2e-2}


@dataclass(frozen=True)
class TrainingTolerance:
    """``fwbench verify --phase training`` limits against the first runtime: ``loss_rel`` on the loss curve's
    max relative error over steps, ``params_rel_l2`` on the relative L2 error of all trained parameters
    concatenated, ``tensor_rel_l2`` on the worst single parameter tensor's relative L2 error."""

    loss_rel: float
    params_rel_l2: float
    tensor_rel_l2: float


# fp32, measured 2026-12-03 (20 AdamW steps, lr 1e-3, parity shape, 1 thread; torch:eager first against
# tensorflow:eager/function, jax:jit, keras:jax/torch/tensorflow on mlp, bert-tiny, gpt2-tiny), worst seen:
# loss curve 3.3e-5, all parameters 5.8e-4, single tensor 7.0e-2 (attention query/key biases, whose gradient
# is ~0 in exact arithmetic: Adam normalises rounding noise into full-size steps). Limits ≈ 30×, 9×, 3.5× that.
# keras:tensorflow on bert-tiny is the one outlier (loss 1.5e-3, parameters 1.4e-2): caught, as it should be.
# bf16 (mixed precision), measured 2026-12-03 the same way on mlp, bert-tiny, gpt2-tiny, resnet-tiny in torch:eager
# (first) against tensorflow (eager, function, xla), jax:jit, keras:*, torch:compile: text models and the MLP
# ≤ 5.4e-3 / 7.4e-3 / 0.34; resnet-tiny, which memorises its batch (loss 2.25 → 0.0084, so relative errors of the
# late losses grow), loss curve ≤ 7.7e-2, parameters ≤ 8.1e-2, worst tensor 0.39 (layer4.0.bn2.running_mean,
# means over N·H·W = 8 values); torch:compile against torch:eager alone gives 2.3e-2 / 6.3e-2 / 0.29.
TRAINING_TOLERANCE = {"fp32": TrainingTolerance(loss_rel=1e-3, params_rel_l2=5e-3, tensor_rel_l2=0.25),
                      "bf16": TrainingTolerance(loss_rel=0.15, params_rel_l2=0.15, tensor_rel_l2=1.0)}


@dataclass(frozen=True)
class Job:
    """One cell for one worker.

    With ``verify_output`` set, the worker only builds the model and writes its outputs at the
    case's shape to that .npz path (``fwbench verify``); nothing is timed. For a training case it takes
    ``train_steps`` optimizer steps and writes their losses and the trained parameters instead. ``weights_path`` is a
    safetensors file to use instead of the seeded canonical weights.
    """

    case: Case
    settings: Settings
    check_parity: bool = True
    verify_output: str | None = None
    weights_path: str | None = None
    train_steps: int = 20  # verify of a training case: optimizer steps taken before writing losses and parameters

    def to_json(self) -> str:
        return json.dumps(
            {
                "case": self.case.to_dict(),
                "settings": self.settings.to_dict(),
                "check_parity": self.check_parity,
                "verify_output": self.verify_output,
                "weights_path": self.weights_path,
                "train_steps": self.train_steps,
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
            train_steps=int(data.get("train_steps", 20)),
        )


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
    return json.dumps({"type": "stage", "stage": stage}) + "\n"


def result_message(result: dict[str, Any]) -> str:
    return json.dumps({"type": "result", **result}) + "\n"
