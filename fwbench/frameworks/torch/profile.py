"""``fwbench profile`` in torch: a few calls under torch.profiler (CPU activities; CUDA too on a GPU), the trace
exported as Chrome-trace JSON (ops: category ``cpu_op``, GPU ``kernel``; each call inside a
``record_function("fwbench.call")`` annotation)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

TRACE_NAME = "trace.json"


def record(step: Callable[[], object], calls: int, directory: Path, device: str) -> dict[str, Any]:
    """``calls`` calls of ``step`` (each synchronised) under torch.profiler; the Chrome trace written to
    ``directory``. Returns ``trace`` (its path), ``rule`` (fwbench.profile.trace.OP_RULES), ``wall_s`` (the
    profiled calls' seconds in all, on this process's clock) and ``profiler``."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as profiler:
        start = time.perf_counter()
        for _ in range(calls):
            with record_function("fwbench.call"):
                step()
        wall_s = time.perf_counter() - start
    trace = directory / TRACE_NAME
    profiler.export_chrome_trace(str(trace))
    return {
        "trace": str(trace),
        "rule": "torch",
        "wall_s": wall_s,
        "profiler": f"torch.profiler {torch.__version__} ({', '.join(a.name for a in activities)})",
    }
