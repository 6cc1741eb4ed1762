"""Phase serving's table: each served runtime's unloaded latency, capacity, p99 at half and 90% of its capacity,
and the highest load whose p99 stayed under the bound with nothing lost, beside the floor (``floor:identity``: the
harness alone) of the same model and max batch at the same offered load, and how busy the client's CPU was.

Each figure is the geometric mean over the cell's rounds (one server process each) with a 95% interval (Student's t
on the logs) when there are at least 3, in parentheses; percentiles are LoadGen's, counted from each query's
scheduled send.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich.markup import escape

from fwbench.details import LoadPoint, ServingRound
from fwbench.measure.rounds import Estimate
from fwbench.report.round_figures import over_rounds, rate_text, seconds_text
from fwbench.store import ResultRecord
from fwbench.units import format_seconds_noise

FLOOR = "floor:identity"
SERVER_LABEL = "server@"  # the ladder's points (the peak probes sit at other loads in each round)
PROBE_LABEL = "peak@"  # the peak search's probes: past the peak they lose queries by design
HEADERS = [
    "model", "runtime", "max batch", "seq", "SingleStream p50", "capacity QPS", "p99 @ 50%", "p99 @ 90%",
    "peak QPS ≤ bound", "lost", "floor p99 @ 50% load", "client CPU",
]  # fmt: skip
LOST_MARK = "!"  # a percentile of a point that lost queries: refused ones answer fast and pull it down
TITLE = "Serving under load (fwbench's server, MLPerf LoadGen from another process)"
RIGHT = frozenset(HEADERS[2:])
LEGEND = (
    "Serving: latency from each query's scheduled send (LoadGen), so queueing counts; capacity: Offline answers per "
    "second; p99 @ 50% / 90%: the Server scenario (Poisson arrivals) at that fraction of the round's capacity; peak "
    "QPS ≤ bound: the highest answered load whose p99 stayed under the bound with no query lost (— none did); lost: "
    "queries dropped (a full queue, or a wait past the timeout), timed out or failed over all points but the peak "
    "search's probes (past the peak they lose queries by design), and ! after a "
    "p99 whose point lost some (a refused query answers fast, so that p99 reads low); floor p99 @ 50% load: "
    "floor:identity (outputs = inputs, the same server and client) at the offered load of this row's 50% point "
    "(interpolated on its ladder; below its lightest point, that point's); client CPU: the load generator's busiest "
    "point, CPU seconds over wall seconds (near 100%: the client, not the server, may set the pace). Geometric mean "
    "over the cell's rounds (fresh servers), its 95% interval in parentheses with ≥ 3 rounds."
)


def point_figure(
    rounds: Sequence[ServingRound], label: str, value: Callable[[LoadPoint], float | None]
) -> Estimate | None:
    """``value`` of the point ``label`` over the rounds."""
    return over_rounds([value(p) if (p := r.point(label)) is not None else None for r in rounds])


@dataclass(frozen=True)
class ServingRow:
    """One ok serving cell's figures."""

    row: ResultRecord
    unloaded_p50: Estimate | None
    capacity: Estimate | None
    p99_half: Estimate | None
    p99_ninety: Estimate | None
    peak: Estimate | None
    lost: int
    floor_p99_half: float | None  # seconds
    half_lost: bool  # the 50% point lost queries in some round
    ninety_lost: bool
    client_busy: float | None  # the load generator's highest CPU seconds per wall second over the points


def ladder_steps(rounds: Sequence[ServingRound]) -> list[list[LoadPoint]]:
    """Each Server ladder step's points, one per round that has it, in ladder order."""
    labels = sorted({p.label for r in rounds for p in r.points if p.label and p.label.startswith(SERVER_LABEL)})
    return [[p for r in rounds if (p := r.point(label)) is not None] for label in labels]


def load_curve(rounds: Sequence[ServingRound], value: Callable[[LoadPoint], float | None]) -> list[tuple[float, float]]:
    """(offered QPS, ``value``) of each Server ladder step, geometric means over the rounds, by offered load."""
    curve = []
    for points in ladder_steps(rounds):
        offered, measured = over_rounds([p.offered_qps for p in points]), over_rounds([value(p) for p in points])
        if offered is not None and measured is not None:
            curve.append((offered.value, measured.value))
    return sorted(curve)


def value_at(curve: Sequence[tuple[float, float]], load: float) -> float | None:
    """``curve``'s value at ``load``: interpolated between its points on log-log axes; below its first point that
    point's value (a latency only grows with load); None past its last point or for an empty curve."""
    if not curve or load > curve[-1][0]:
        return None
    if load <= curve[0][0]:
        return curve[0][1]
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if x0 <= load <= x1:
            share = (math.log(load) - math.log(x0)) / (math.log(x1) - math.log(x0)) if x1 > x0 else 0.0
            return math.exp(math.log(y0) + share * (math.log(y1) - math.log(y0)))
    return None


def floor_at_same_load(floor_rounds: Sequence[ServingRound], rounds: Sequence[ServingRound]) -> float | None:
    """The floor's p99 at the offered load of ``rounds``' 50% point, seconds (no interval: an interpolation)."""
    load = point_figure(rounds, "server@0.50", lambda p: p.offered_qps)
    if load is None:
        return None
    return value_at(load_curve(floor_rounds, lambda p: p.p99_s), load.value)


def serving_rows(results: Sequence[ResultRecord]) -> list[ServingRow]:
    """Every ok serving cell, in stored order, with the floor of its run, machine, model, max batch, sequence length,
    dtype and device."""

    def floor_key(row: ResultRecord) -> tuple[object, ...]:
        return (row.run_id, row.hardware_id, row.model, row.batch_size, row.seq_len, row.dtype, row.device)

    served = [r for r in results if r.status in ("ok", "mismatch") and r.serving is not None]
    floors = {floor_key(r): r for r in served if r.runtime == FLOOR}
    out = []
    for row in served:
        assert row.serving is not None
        rounds = row.serving.rounds
        floor = floors.get(floor_key(row))
        floor_rounds = floor.serving.rounds if floor is not None and floor.serving is not None else ()
        out.append(
            ServingRow(
                row=row,
                unloaded_p50=point_figure(rounds, "single-stream", lambda p: p.p50_s),
                capacity=over_rounds([r.capacity_qps for r in rounds]),
                p99_half=point_figure(rounds, "server@0.50", lambda p: p.p99_s),
                p99_ninety=point_figure(rounds, "server@0.90", lambda p: p.p99_s),
                peak=over_rounds([r.peak_qps for r in rounds]) if all(r.peak_qps for r in rounds) else None,
                lost=sum(p.lost for r in rounds for p in r.points if not (p.label or "").startswith(PROBE_LABEL)),
                floor_p99_half=floor_at_same_load(floor_rounds, rounds),
                half_lost=any(p.lost for r in rounds if (p := r.point("server@0.50")) is not None),
                ninety_lost=any(p.lost for r in rounds if (p := r.point("server@0.90")) is not None),
                client_busy=max(
                    (p.client_cpu_s / p.wall_s for r in rounds for p in r.points if p.client_cpu_s and p.wall_s),
                    default=None,
                ),
            )
        )
    return out


def serving_cells(item: ServingRow, markup: bool = True) -> list[str]:
    """The table's cells of one row (``markup``: store strings escaped for rich)."""
    row = item.row
    text = escape if markup else str
    runtime = text(row.runtime) + (" (mismatch)" if row.status == "mismatch" else "")
    return [
        text(row.model), runtime, str(row.batch_size), "—" if row.seq_len is None else str(row.seq_len),
        seconds_text(item.unloaded_p50), rate_text(item.capacity),
        seconds_text(item.p99_half) + (LOST_MARK if item.half_lost else ""),
        seconds_text(item.p99_ninety) + (LOST_MARK if item.ninety_lost else ""), rate_text(item.peak), str(item.lost),
        format_seconds_noise(item.floor_p99_half, None, None), "—" if item.client_busy is None else f"{item.client_busy:.0%}",
    ]  # fmt: skip


@dataclass(frozen=True)
class ServingChange:
    """One serving cell of both runs (``fwbench compare``): its capacity, p99 at half of it and peak load under the
    bound in A and in B, each the geometric mean over its rounds (queries per second, seconds; None: not
    measured)."""

    model: str
    runtime: str
    batch_size: int
    seq_len: int | None
    dtype: str
    device: str
    capacity_a: float | None
    capacity_b: float | None
    p99_half_a: float | None
    p99_half_b: float | None
    peak_a: float | None
    peak_b: float | None


def _mean(figure: Estimate | None) -> float | None:
    return None if figure is None else figure.value


def serving_changes(results_a: Sequence[ResultRecord], results_b: Sequence[ResultRecord]) -> list[ServingChange]:
    """The serving cells both runs have (same model, runtime, max batch, sequence length, dtype, device), in A's
    order."""

    def key(row: ResultRecord) -> tuple[object, ...]:
        return (row.model, row.runtime, row.batch_size, row.seq_len, row.dtype, row.device)

    in_b = {key(item.row): item for item in serving_rows(results_b)}
    changes = []
    for a in serving_rows(results_a):
        b = in_b.get(key(a.row))
        if b is None:
            continue
        row = a.row
        changes.append(
            ServingChange(
                row.model,
                row.runtime,
                row.batch_size,
                row.seq_len,
                row.dtype,
                row.device,
                _mean(a.capacity),
                _mean(b.capacity),
                _mean(a.p99_half),
                _mean(b.p99_half),
                _mean(a.peak),
                _mean(b.peak),
            )  # fmt: skip
        )
    return changes
