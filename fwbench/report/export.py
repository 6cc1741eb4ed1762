"""Machine-readable exports of stored runs and results: JSON and long-format CSV."""

from __future__ import annotations

import csv
import io
import json
from typing import Any, Sequence

from fwbench.store import RunRecord

CSV_COLUMNS = (
    "run_id", "model", "runtime", "phase", "batch_size", "seq_len", "dtype", "device", "status", "reason",
    "protocol", "n_samples", "calls_per_sample", "median_s", "ci_low_s", "ci_high_s", "mean_s", "stdev_s",
    "min_s", "first_call_s", "peak_memory_bytes", "allocator_peak_bytes", "threads", "interop_threads",
    "flops", "wall_s", "samples",
)


def to_json(runs: Sequence[RunRecord], results: Sequence[dict[str, Any]]) -> str:
    """``{"runs": [...], "results": [...]}``; each result carries every raw sample (seconds per call)."""
    return json.dumps({"runs": [r.to_dict() for r in runs], "results": list(results)}, indent=2, sort_keys=True)


def to_csv(results: Sequence[dict[str, Any]]) -> str:
    """One row per cell; ``samples`` is a space-separated list of seconds per call."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in results:
        writer.writerow({**row, "samples": " ".join(repr(s) for s in row["samples"])})
    return out.getvalue()
