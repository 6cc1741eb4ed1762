"""A phase-serving cell (fwbench.runner.phases.serving, fwbench.serving.loadgen): ``details.serving``, its
rounds (one per server process) and each round's load points."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from fwbench.details.parse import all_fields, as_dict, as_float, as_int, as_str, each, ints


@dataclass(frozen=True)
class LoadPoint:
    """One load point of a serving round, as the load generator writes it (``fwbench.serving.loadgen.run_point``):
    LoadGen's latency percentiles from each query's scheduled send (seconds), the loads (queries per
    second), the queries lost (dropped: 503 from a full queue; timed out; failed), the server's batches by row count
    and both processes' CPU seconds over the point."""

    scenario: str | None = None
    label: str | None = None
    fraction: float | None = None
    target_qps: float | None = None
    offered_qps: float | None = None
    achieved_qps: float | None = None
    queries: int | None = None
    answered: int | None = None
    dropped: int | None = None
    timed_out: int | None = None
    failed: int | None = None
    p50_s: float | None = None
    p90_s: float | None = None
    p99_s: float | None = None
    p999_s: float | None = None
    mean_s: float | None = None
    max_s: float | None = None
    wall_s: float | None = None
    server_cpu_s: float | None = None
    client_cpu_s: float | None = None
    batch_rows: dict[str, int] = field(default_factory=dict)
    padded_rows: int | None = None
    first_failure: str | None = None

    @property
    def lost(self) -> int:
        return (self.dropped or 0) + (self.timed_out or 0) + (self.failed or 0)

    def to_dict(self) -> dict[str, Any]:
        return all_fields(self)

    @classmethod
    def parse(cls, raw: Any) -> LoadPoint | None:
        if not isinstance(raw, dict):
            return None
        values: dict[str, Any] = {}
        for f in fields(cls):
            value = raw.get(f.name)
            if f.name in ("scenario", "label", "first_failure"):
                values[f.name] = as_str(value)
            elif f.name == "batch_rows":
                rows = as_dict(value)
                values[f.name] = {str(k): v for k, v in rows.items() if as_int(v) is not None}
            elif f.name in ("queries", "answered", "dropped", "timed_out", "failed", "padded_rows"):
                values[f.name] = as_int(value)
            else:
                values[f.name] = as_float(value)
        return cls(**values)


@dataclass(frozen=True)
class ServingRound:
    """One round (one server process) of a serving cell: its Offline capacity, its peak load under the p99 bound
    (None: no point met it), its points in the order run."""

    capacity_qps: float | None = None
    peak_qps: float | None = None
    points: tuple[LoadPoint, ...] = ()

    def point(self, label: str) -> LoadPoint | None:
        return next((p for p in self.points if p.label == label), None)

    @classmethod
    def parse(cls, raw: Any) -> ServingRound | None:
        if not isinstance(raw, dict):
            return None
        return cls(
            as_float(raw.get("capacity_qps")), as_float(raw.get("peak_qps")), each(LoadPoint.parse, raw.get("points"))
        )


@dataclass(frozen=True)
class ServingDetails:
    """``details.serving`` of a phase-serving cell: the batcher's settings (max batch = the cell's batch size, the
    compiled batch sizes, seconds), the bound, and every round (one per worker, in order)."""

    max_batch: int | None = None
    buckets: tuple[int, ...] | None = None
    max_delay_s: float | None = None
    max_queue_rows: int | None = None
    p99_bound_s: float | None = None
    point_s: float | None = None
    rounds: tuple[ServingRound, ...] = ()

    @classmethod
    def parse(cls, raw: Any) -> ServingDetails | None:
        if not isinstance(raw, dict):
            return None
        rounds = each(ServingRound.parse, raw.get("rounds"))
        if not rounds:  # one round, stored without the list
            first = ServingRound.parse(raw)
            rounds = () if first is None else (first,)
        return cls(
            as_int(raw.get("max_batch")),
            ints(raw.get("buckets")),
            as_float(raw.get("max_delay_s")),
            as_int(raw.get("max_queue_rows")),
            as_float(raw.get("p99_bound_s")),
            as_float(raw.get("point_s")),
            rounds,
        )
