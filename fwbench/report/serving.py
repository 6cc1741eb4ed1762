"""Phase serving's table: each served runtime's unloaded latency, capacity, p99 at half and 90% of its capacity,
and the highest load whose p99 stayed under the bound with nothing lost, beside the floor (``floor:identity``: the
harness alone) of the same model and max batch.

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
from fwbench.measure.rounds import t_quantile
from fwbench.store import ResultRecord
from fwbench.units import format_significant, seconds_unit, significant_digits

FLOOR = "floor:identity"
HEADERS = [
    "model", "runtime", "max batch", "seq", "SingleStream p50", "capacity QPS", "p99 @ 50%", "p99 @ 90%",
    "peak QPS ≤ bound", "lost", "floor p99 @ 50%",
]  # fmt: skip
TITLE = "Serving under load (fwbench's server, MLPerf LoadGen from another process)"
RIGHT = frozenset(HEADERS[2:])
LEGEND = (
    "Serving: latency from each query's scheduled send (LoadGen), so queueing counts; capacity: Offline answers per "
    "second; p99 @ 50% / 90%: the Server scenario (Poisson arrivals) at that fraction of the round's capacity; peak "
    "QPS ≤ bound: the highest answered load whose p99 stayed under the bound with no query lost (— none did); lost: "
    "queries dropped by a full queue, timed out or failed over all points; floor: floor:identity (outputs = inputs) "
    "through the same server and client. Geometric mean over the cell's rounds (fresh servers), its 95% interval in "
    "parentheses with ≥ 3 rounds."
)


@dataclass(frozen=True)
class Figure:
    """The geometric mean over rounds and its 95% interval (a Student-t interval of the logs; None: fewer than 3
    rounds), as fwbench's cell times: a round that stalled moves it less than it would an arithmetic mean."""

    mean: float
    low: float | None
    high: float | None


def over_rounds(values: Sequence[float | None]) -> Figure | None:
    """The rounds' values (those measured and positive) as a :class:`Figure`; None when none was."""
    logs = [math.log(v) for v in values if v is not None and math.isfinite(v) and v > 0]
    if not logs:
        return None
    centre = sum(logs) / len(logs)
    if len(logs) < 3:
        return Figure(math.exp(centre), None, None)
    sd = math.sqrt(sum((v - centre) ** 2 for v in logs) / (len(logs) - 1))
    half = t_quantile(len(logs) - 1) * sd / math.sqrt(len(logs))
    return Figure(math.exp(centre), math.exp(centre - half), math.exp(centre + half))


def point_figure(
    rounds: Sequence[ServingRound], label: str, value: Callable[[LoadPoint], float | None]
) -> Figure | None:
    """``value`` of the point ``label`` over the rounds."""
    return over_rounds([value(p) if (p := r.point(label)) is not None else None for r in rounds])


def _digits(figure: Figure, scale: float = 1.0) -> int:
    half = None if figure.low is None or figure.high is None else (figure.high - figure.low) / 2 / scale
    return significant_digits(figure.mean / scale, half)


def seconds_text(figure: Figure | None) -> str:
    """``12.3 ms (11.0–13.9)``: the interval in the mean's unit, digits as many as it supports."""
    if figure is None:
        return "—"
    scale, unit = seconds_unit(figure.mean)
    digits = _digits(figure, scale)
    text = f"{format_significant(figure.mean / scale, digits)} {unit}"
    if figure.low is None or figure.high is None:
        return text
    return f"{text} ({format_significant(figure.low / scale, 2)}–{format_significant(figure.high / scale, 2)})"


def rate_text(figure: Figure | None) -> str:
    """``1330 (1200–1470)`` queries per second."""
    if figure is None:
        return "—"
    text = format_significant(figure.mean, _digits(figure))
    if figure.low is None or figure.high is None:
        return text
    return f"{text} ({format_significant(figure.low, 2)}–{format_significant(figure.high, 2)})"


@dataclass(frozen=True)
class ServingRow:
    """One ok serving cell's figures."""

    row: ResultRecord
    unloaded_p50: Figure | None
    capacity: Figure | None
    p99_half: Figure | None
    p99_ninety: Figure | None
    peak: Figure | None
    lost: int
    floor_p99_half: Figure | None


def serving_rows(results: Sequence[ResultRecord]) -> list[ServingRow]:
    """Every ok serving cell, in stored order, with the floor of its model, max batch and sequence length."""
    served = [r for r in results if r.phase == "serving" and r.status in ("ok", "mismatch") and r.serving is not None]
    floors = {(r.model, r.batch_size, r.seq_len, r.dtype): r for r in served if r.runtime == FLOOR}
    out = []
    for row in served:
        assert row.serving is not None
        rounds = row.serving.rounds
        floor = floors.get((row.model, row.batch_size, row.seq_len, row.dtype))
        floor_rounds = floor.serving.rounds if floor is not None and floor.serving is not None else ()
        out.append(
            ServingRow(
                row=row,
                unloaded_p50=point_figure(rounds, "single-stream", lambda p: p.p50_s),
                capacity=over_rounds([r.capacity_qps for r in rounds]),
                p99_half=point_figure(rounds, "server@0.50", lambda p: p.p99_s),
                p99_ninety=point_figure(rounds, "server@0.90", lambda p: p.p99_s),
                peak=over_rounds([r.peak_qps for r in rounds]) if all(r.peak_qps for r in rounds) else None,
                lost=sum(p.lost for r in rounds for p in r.points),
                floor_p99_half=point_figure(floor_rounds, "server@0.50", lambda p: p.p99_s),
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
        seconds_text(item.p99_half), seconds_text(item.p99_ninety), rate_text(item.peak), str(item.lost),
        seconds_text(item.floor_p99_half),
    ]  # fmt: skip
