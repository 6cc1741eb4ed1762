"""What a cell produced, as the manager keeps it (:class:`CellOutcome` with its timed blocks), and
the one-shot worker run that produces it (:func:`run_worker`: a fresh worker runs the cell start to end)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fwbench.measure.rounds import Block
from fwbench.messages import Job
from fwbench.runner.process import WorkerFailure
from fwbench.runner.rankset import start_worker
from fwbench.spec import Case, Settings


@dataclass
class CellOutcome:
    """What one cell produced: a terminal status and the fields the store keeps."""

    case: Case
    status: str
    reason: str | None = None
    samples: list[float] = field(default_factory=list)
    fields: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    blocks: list[Block] = field(default_factory=list)


def failed(case: Case, failure: WorkerFailure) -> CellOutcome:
    """The outcome of a worker that died, hung or exceeded its memory limit."""
    return CellOutcome(case, failure.status, failure.reason)


def spread_fields(samples: list[float]) -> dict[str, float | None]:
    """The stored mean, standard deviation and minimum of a cell's samples (seconds per call; at least one)."""
    data = np.asarray(samples)
    return {
        "mean_s": float(np.mean(data)),
        "stdev_s": float(np.std(data, ddof=1)) if data.size > 1 else None,
        "min_s": float(np.min(data)),
    }


def outcome_from_result(case: Case, result: dict[str, Any], round_index: int = 0) -> CellOutcome:
    """Turn the worker's result message into stored fields (one round's median; statistics over rounds are
    computed when they are merged) and its blocks, one per sample (start times where the worker sent them)."""
    samples = [float(s) for s in result.pop("samples_s", [])]
    starts = result.pop("block_starts_unix_s", None)
    status = result.pop("status")
    reason = result.pop("reason", None)
    fields: dict[str, Any] = {
        "first_call_s": result.pop("first_call_s", None),
        "peak_memory_bytes": result.pop("peak_memory_bytes", None),
        "allocator_peak_bytes": result.pop("allocator_peak_bytes", None),
        "calls_per_sample": result.pop("calls_per_sample", None),
        "noise": result.pop("noise", None),
    }
    if samples:  # one round: its median (a CI needs rounds: fwbench.measure.rounds)
        fields.update(median_s=float(np.median(samples)), **spread_fields(samples))
    calls = int(fields["calls_per_sample"] or 1)  # fit: an epoch per sample
    if starts is None or len(starts) != len(samples):
        starts = [None] * len(samples)
    blocks = [Block(round_index, i, None, start, calls, s * calls) for i, (start, s) in enumerate(zip(starts, samples))]
    return CellOutcome(case, status, reason, samples, fields, result, blocks)


def check_memory(outcome: CellOutcome, settings: Settings) -> CellOutcome:
    """``outcome`` as ``oom`` when its resident peak (before or during timing) exceeded ``--memory-limit``."""
    limit = settings.memory_limit_bytes
    peaks = [outcome.details.get("peak_memory_before_timing_bytes"), outcome.fields.get("peak_memory_bytes")]
    peak = max((p for p in peaks if p is not None), default=None)
    if limit is not None and peak is not None and peak > limit:
        return CellOutcome(
            outcome.case, "oom", f"resident memory {peak} B exceeded --memory-limit {limit} B", details=outcome.details
        )
    return outcome


def run_worker(
    case: Case,
    settings: Settings,
    check_parity: bool = True,
    *,
    verify_output: str | None = None,
    weights_path: str | None = None,
    export_to: str | None = None,
    train_steps: int = 20,
    round_index: int = 0,
    profile_to: str | None = None,
    profile_calls: int = 5,
    checkpoints: bool = False,
    env: Mapping[str, str] | None = None,
) -> CellOutcome:
    """Run ``case`` start to end in a fresh ``python -m fwbench.runner.worker`` (``env``: variables added to its
    environment) and classify how it ended."""
    job = Job(
        case=case,
        settings=settings,
        check_parity=check_parity,
        verify_output=verify_output,
        weights_path=weights_path,
        export_to=export_to,
        train_steps=train_steps,
        profile_to=profile_to,
        profile_calls=profile_calls,
        checkpoints=checkpoints,
        record_kernels=round_index == 0,
    )
    try:
        with start_worker(job, env=env) as worker:
            result = worker.await_message({"result"}, settings.timeout_s)
            worker.wait_exit()
    except WorkerFailure as failure:
        return failed(case, failure)
    return check_memory(outcome_from_result(case, result, round_index), settings)
