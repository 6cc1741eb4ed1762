"""``fwbench profile`` in JAX: a few calls under ``jax.profiler.trace``, which writes the XPlane and a Chrome
trace (``plugins/profile/<time>/<host>.trace.json.gz``) into the folder; the compiled program's thunks carry their
HLO instruction in ``args.hlo_op``."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax


def record(step: Callable[[], object], calls: int, directory: Path, device: str) -> dict[str, Any]:
    """``calls`` calls of ``step`` (each synchronised) under jax.profiler; the traces written under
    ``directory``. Returns ``trace`` (the Chrome trace's path), ``rule`` (fwbench.profile.trace.OP_RULES),
    ``wall_s`` (the profiled calls' seconds in all) and ``profiler``."""
    with jax.profiler.trace(str(directory)):
        start = time.perf_counter()
        for _ in range(calls):
            with jax.profiler.TraceAnnotation("fwbench.call"):
                step()
        wall_s = time.perf_counter() - start
    traces = sorted(directory.rglob("*.trace.json.gz"), key=lambda path: path.stat().st_mtime)
    if not traces:
        raise RuntimeError(f"jax.profiler.trace wrote no Chrome trace under {directory}")
    return {"trace": str(traces[-1]), "rule": "jax", "wall_s": wall_s, "profiler": f"jax.profiler {jax.__version__}"}
