"""``fwbench profile`` in TensorFlow: a few calls under ``tf.profiler.experimental``, which writes only an
XPlane (``.xplane.pb``); it is converted here, with TensorFlow's own protobuf classes, to Chrome-trace JSON
(``trace.json.gz``) so that the framework-free reader (fwbench.profile.trace) reads every framework alike."""

from __future__ import annotations

import gzip
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tensorflow as tf
from tensorflow.tsl.profiler.protobuf import xplane_pb2

TRACE_NAME = "trace.json.gz"
TF_OP = re.compile(r"^(?P<name>[^:\s]+):(?P<type>[A-Za-z_][A-Za-z0-9_]*)$")  # a TF op's TraceMe: "name:Type"
EAGER_OP, EAGER_KERNEL = "EagerLocalExecute: ", "EagerKernelExecute"  # an eager op, and its kernel's run inside it
FUNCTION_PREFIXES = ("__inference", "__forward", "__backward")  # a tf.function call: its ops are traced one by one


def _stat_value(stat: Any, metadata: Any) -> Any:
    kind = stat.WhichOneof("value")
    if kind == "ref_value":
        return metadata[stat.ref_value].name
    return getattr(stat, kind) if kind and kind != "bytes_value" else None


def _line_events(plane: Any, line: Any, pid: int) -> list[dict[str, Any]]:
    """One XLine's events as Chrome-trace complete events (see :func:`chrome_events`)."""
    events: list[dict[str, Any]] = []
    eager_op: tuple[float, float, str] | None = None  # the open "EagerLocalExecute: Type": start, end (µs), type
    for event in sorted(line.events, key=lambda e: e.offset_ps):
        name = plane.event_metadata[event.metadata_id].name
        start_us = (line.timestamp_ns * 1000 + event.offset_ps) / 1e6
        duration_us = event.duration_ps / 1e6
        args = {plane.stat_metadata[s.metadata_id].name: _stat_value(s, plane.stat_metadata) for s in event.stats}
        category, shown = "trace", name
        graph_op = TF_OP.match(name)
        if graph_op and graph_op.group("type").startswith(FUNCTION_PREFIXES):
            graph_op = None  # a call of a function (e.g. the XLA cluster's): a container; its ops are traced
        if graph_op:  # an op the graph executor ran (tf.function)
            category, shown, args["tf_op"] = "tf_op", graph_op.group("type"), name
        elif name.startswith(EAGER_OP):
            op_type = name.removeprefix(EAGER_OP)
            eager_op = None if op_type.startswith(FUNCTION_PREFIXES) else (start_us, start_us + duration_us, op_type)
        elif name == EAGER_KERNEL and eager_op and eager_op[0] <= start_us <= eager_op[1]:
            category, shown, args["tf_op"] = "tf_op", eager_op[2], f"eager:{eager_op[2]}"
        events.append(
            {
                "ph": "X",
                "cat": category,
                "name": shown,
                "pid": pid,
                "tid": line.id,
                "ts": start_us,
                "dur": duration_us,
                "args": {key: value for key, value in args.items() if value is not None},
            }
        )
    return events


def chrome_events(space: Any) -> list[dict[str, Any]]:
    """Every event of the XSpace ``space`` as a Chrome-trace complete event (microseconds), one process per plane
    and one thread per line (with their names as metadata events), its stats as ``args``. Ops become category
    ``tf_op``, named by their type: an event named ``name:Type`` (an op the graph executor of a tf.function ran),
    and in eager mode the kernel run (``EagerKernelExecute``) inside an ``EagerLocalExecute: Type`` (whose own
    time beyond the kernel is eager dispatch, left to the overhead). An XLA cluster's thunks keep their
    ``args.hlo_op``."""
    events: list[dict[str, Any]] = []
    for pid, plane in enumerate(space.planes):
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": plane.name}})
        for line in plane.lines:
            name = {"name": line.display_name or line.name}
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": line.id, "args": name})
            events.extend(_line_events(plane, line, pid))
    return events


def record(step: Callable[[], object], calls: int, directory: Path, device: str) -> dict[str, Any]:
    """``calls`` calls of ``step`` (each synchronised) under TensorFlow's profiler; the XPlane written under
    ``directory`` and converted to ``directory/trace.json.gz``. Returns ``trace``, ``rule``
    (fwbench.profile.trace.OP_RULES), ``wall_s`` (the profiled calls' seconds in all) and ``profiler``."""
    options = tf.profiler.experimental.ProfilerOptions(host_tracer_level=2, python_tracer_level=0)
    tf.profiler.experimental.start(str(directory), options=options)
    try:
        start = time.perf_counter()
        for _ in range(calls):
            with tf.profiler.experimental.Trace("fwbench.call"):
                step()
        wall_s = time.perf_counter() - start
    finally:
        tf.profiler.experimental.stop()
    planes = sorted(directory.rglob("*.xplane.pb"), key=lambda path: path.stat().st_mtime)
    if not planes:
        raise RuntimeError(f"tf.profiler wrote no XPlane under {directory}")
    space = xplane_pb2.XSpace()
    space.ParseFromString(planes[-1].read_bytes())
    trace = directory / TRACE_NAME
    trace.write_bytes(gzip.compress(json.dumps({"traceEvents": chrome_events(space)}).encode()))
    return {
        "trace": str(trace),
        "xplane": str(planes[-1]),
        "rule": "tensorflow",
        "wall_s": wall_s,
        "profiler": f"tf.profiler.experimental {tf.__version__}",
    }
