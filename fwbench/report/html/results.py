"""The HTML report's last section: every stored cell, one row each, with the columns its rows have."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fwbench.report.flags import cell_flags, is_noisy, precision_flags, precision_key, samples_text
from fwbench.report.html.markup import esc, ratio_text, table
from fwbench.report.peak import Peak, achieved_gflops, peak_fraction
from fwbench.report.phases import compared_by_speedup
from fwbench.report.table import throughput_headers
from fwbench.report.throughput import format_rate, throughput
from fwbench.speedups import CellComparison, cell_key, rel_half_width
from fwbench.store import ResultRecord
from fwbench.units import format_bytes, format_fraction, format_gflops, format_seconds, format_seconds_noise, procs_text


def _speed_up_text(r: ResultRecord, ratios: dict[tuple[Any, ...], CellComparison], baseline: str | None) -> str:
    """The row's speed-up against the baseline's cell (HTML): its ratio, n.s. when not significant; ``—`` for a row
    of a phase not compared by speed-up."""
    if r.runtime == baseline and compared_by_speedup(r.phase):
        return "<i>baseline</i>"
    cell = ratios.get((r.runtime, *cell_key(r)))
    if cell is None:
        return "—"
    return ratio_text(cell.ratio) + ("" if cell.ratio is None or cell.significant else " <i>n.s.</i>")


# A column of the results table: header, whether its figures are numbers (right-aligned), the cell of a row (HTML).
Column = tuple[str, bool, Callable[[ResultRecord], str]]


def _result_columns(
    results: Sequence[ResultRecord],
    ratios: dict[tuple[Any, ...], CellComparison],
    baseline: str | None,
    peak: Peak | None,
) -> list[Column]:
    """The results table's columns for these rows: optional ones (workers, processes, time to first result, % peak,
    throughput) only where a row has them."""
    rate_headers = throughput_headers(results)  # training cells: samples/s (tokens/s); none for inference only
    precision = precision_flags(results)

    def note(r: ResultRecord) -> str:
        if r.status != "ok":
            return esc(r.reason)
        return esc("; ".join(cell_flags(r) + ([precision[precision_key(r)]] if precision_key(r) in precision else [])))

    def ok_only(text: Callable[[ResultRecord], str]) -> Callable[[ResultRecord], str]:
        return lambda r: text(r) if r.status == "ok" else "N/A"

    def half_width(r: ResultRecord) -> str:
        half = rel_half_width(r)
        return "—" if half is None else f"±{half:.1%}"

    columns: list[Column] = [
        ("run", True, lambda r: esc(r.run_id)),
        ("model", False, lambda r: esc(r.model)),
        ("runtime", False, lambda r: esc(r.runtime)),
        ("phase", False, lambda r: esc(r.phase)),
        ("batch", True, lambda r: esc(r.batch_size)),
        ("seq", True, lambda r: esc(r.seq_len)),
    ]
    if any(r.workers is not None for r in results):  # phase data: the loaders' worker count
        columns.append(("workers", True, lambda r: esc(r.workers)))
    if any(r.procs is not None for r in results):  # distributed cells: processes and scaling
        columns.append(("procs", True, lambda r: esc(procs_text(r.procs, r.scaling, r.nodes))))
    columns += [
        ("dtype", False, lambda r: esc(r.dtype)),
        ("device", False, lambda r: esc(r.device)),
        ("status", False, lambda r: esc(r.status) if r.status == "ok" else f"<b>{esc(r.status)}</b>"),
        ("median", True, ok_only(lambda r: esc(format_seconds_noise(r.median_s, r.ci_low_s, r.ci_high_s)))),
        ("±95% CI", True, half_width),
        (f"speed-up vs {esc(baseline)}", True, lambda r: _speed_up_text(r, ratios, baseline)),
        ("first call", True, lambda r: esc(format_seconds(r.first_call_s))),
    ]
    if any(r.exported for r in results):  # deployment runtimes: export and load before the first call
        columns.append(("to first result", True, lambda r: esc(format_seconds(r.time_to_first_result_s))))
    columns += [
        ("peak RSS", True, lambda r: esc(format_bytes(r.peak_memory_bytes))),
        ("GFLOP/s", True, lambda r: esc(format_gflops(achieved_gflops(r)))),
    ]
    if peak is not None:
        columns.append(("% peak", True, lambda r: esc(format_fraction(peak_fraction(r, peak)))))

    def rate(index: int) -> Callable[[ResultRecord], str]:
        return lambda r: esc(format_rate(throughput(r)[index]))

    columns += [(header, True, rate(index)) for index, header in enumerate(rate_headers)]
    return [*columns, ("samples", True, lambda r: esc(samples_text(r))), ("note", False, note)]


def results_section(
    results: Sequence[ResultRecord],
    ratios: dict[tuple[Any, ...], CellComparison],
    baseline: str | None,
    peak: Peak | None,
) -> str:
    """Every stored cell, one row each, in stored order."""
    columns = _result_columns(results, ratios, baseline, peak)
    headers = [header for header, _, _ in columns]
    rows = [[cell(r) for _, _, cell in columns] for r in results]
    classes = [
        "" if r.status == "ok" and not is_noisy(r) else ("noisy" if r.status == "ok" else "bad") for r in results
    ]
    numeric = [index for index, (_, number, _) in enumerate(columns) if number]
    peak_note = (
        ""
        if peak is None
        else (
            f" % peak: of {esc(format_gflops(peak.gflops))} GFLOP/s, the {esc(peak.dtype)} {esc(peak.device)} matmul "
            f"peak ({esc(peak.runtime)}, threads {esc(peak.threads)}, run {esc(peak.run_id)})."
        )
    )
    return (
        f'<section id="results"><h2>All results ({len(results)} cells)</h2><p class=small>Every stored cell. '
        "Median per call with the digits its 95% CI supports; samples = blocks × calls per block; peak RSS: the "
        "worker's resident high-water mark while timing; n.s.: the speed-up is not significant. Raw samples "
        f"are in <code>fwbench report --format json</code>.{peak_note}</p>"
        + '<div class="wide">'
        + table(headers, rows, numeric=numeric, row_classes=classes, css="results")
        + "</div></section>"
    )
