"""Reading a Chrome trace (``{"traceEvents": [...]}``, plain or gzipped JSON) into :class:`OpEvent`\\ s.

Which complete events (``"ph": "X"``) are ops depends on the profiler that wrote the trace; the rules are data
(:data:`OP_RULES`). Timestamps and durations in a Chrome trace are microseconds; OpEvent holds seconds.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fwbench.profile.categories import Vocabulary
from fwbench.profile.summary import OpEvent

US = 1e-6  # a Chrome trace's time unit, in seconds


@dataclass(frozen=True)
class OpMatcher:
    """Which complete events of a trace are ops of one vocabulary: those whose category (``cat``) is one of
    ``categories``, or those carrying the argument ``arg`` (XLA's thunks name their HLO instruction in
    ``args.hlo_op``; they have no category)."""

    vocabulary: Vocabulary
    categories: frozenset[str] = frozenset()
    arg: str | None = None

    def matches(self, event: Mapping[str, Any]) -> bool:
        if self.categories and event.get("cat") in self.categories:
            return True
        return self.arg is not None and self.arg in (event.get("args") or {})


# The rules per profiler (the ``rule`` a worker's profile report names): an event is an op of the first
# matcher that matches it. torch.profiler: ATen / oneDNN ops on the CPU threads, kernels on the GPU streams (user
# annotations such as fwbench's per-call marker and Python frames are not ops). TensorFlow (fwbench's conversion
# of its XPlane, frameworks/tensorflow/profile.py): the executor's ops as "tf_op", and in XLA clusters the thunks
# of the compiled program. JAX: the compiled program's thunks.
OP_RULES: dict[str, tuple[OpMatcher, ...]] = {
    "torch": (OpMatcher("torch", categories=frozenset({"cpu_op", "kernel", "gpu_memcpy", "gpu_memset"})),),
    "tensorflow": (OpMatcher("tensorflow", categories=frozenset({"tf_op"})), OpMatcher("xla", arg="hlo_op")),
    "jax": (OpMatcher("xla", arg="hlo_op"),),
}


def read_chrome_trace(path: Path) -> dict[str, Any]:
    """The trace at ``path`` (``.json`` or ``.json.gz``) as a dict with ``traceEvents``."""
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    trace = json.loads(raw)
    if isinstance(trace, list):  # the JSON array form of the format
        trace = {"traceEvents": trace}
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ValueError(f"{path}: not a Chrome trace (no traceEvents list)")
    return trace


def op_events(trace: Mapping[str, Any], rule: Sequence[OpMatcher]) -> list[OpEvent]:
    """The trace's op events under ``rule`` (OP_RULES), in seconds, each on the lane ``pid:tid`` and in the
    vocabulary of the matcher that took it. An XLA thunk that hands its work to a thread pool (TensorFlow XLA's
    convolutions) is as long as its event: the work after it shows as overhead (time in no op)."""
    ops = []
    for event in trace["traceEvents"]:
        if event.get("ph") != "X" or "dur" not in event:
            continue
        matcher = next((m for m in rule if m.matches(event)), None)
        if matcher is None:
            continue
        lane = f"{event.get('pid')}:{event.get('tid')}"
        name = str(event.get("name", ""))
        ops.append(OpEvent(name, float(event["ts"]) * US, float(event["dur"]) * US, lane, matcher.vocabulary))
    return ops
