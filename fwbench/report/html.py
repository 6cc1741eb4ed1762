"""The self-contained HTML report: one file that works offline, plots inline as PNG data URIs.

Page order: the scope and the machine; the summary against the baseline; flags (compile health, noisy
cells, mismatches, cells that did not run); per model, heat maps of the speed-up over the baseline
(batch × sequence length, one per runtime) and latency and peak RSS against the shape (one line per
runtime, CI bands); parity; each run's environment, settings and command; the full results table.

Reads store rows only (never a framework). Every string from the store goes through
:func:`html.escape`, and through :func:`mpl_text` on its way into a plot (so ``$`` is never math text).
The page carries a Content-Security-Policy that allows nothing but inline styles and ``data:`` images,
so even a reference that slipped in could not reach the network.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PatchCollection
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import NullLocator

from fwbench.report import dtypes, scaling
from fwbench.report.flags import (
    NOISY_REL_CI,
    cell_flags,
    compile_flags,
    is_noisy,
    precision_flags,
    precision_key,
    samples_text,
)
from fwbench.report.peak import Peak, achieved_gflops, peak_fraction
from fwbench.report.table import throughput_headers
from fwbench.report.throughput import format_rate, throughput
from fwbench.report.walltime import rounds_stop_line, wall_time, wall_time_line
from fwbench.spec import shape_text
from fwbench.speedups import (
    ALPHA,
    CellComparison,
    GroupedPair,
    PairSummary,
    cell_key,
    grouped_pairs,
    pair_summary,
    rel_half_width,
    runtimes_in,
    split_groups,
)
from fwbench.store import ResultRecord, RunRecord
from fwbench.units import (
    format_bytes,
    format_fraction,
    format_gflops,
    format_seconds,
    format_seconds_noise,
    procs_text,
    short_id,
)

# one plot section per group (a distributed cell's processes and scaling: a section each)
PLOT_GROUP_FIELDS = ("run_id", "hardware_id", "model", "phase", "dtype", "device", "procs", "scaling")
MAX_PLOT_GROUPS = 24  # groups that get plots; every cell stays in the tables
MAX_LINE_PANELS = 6  # latency/memory panels per group (values of the axis that is not x)
MAX_ANNOTATED_CELLS = 96  # a heat map with more cells shows colours only
MAX_TICKS = 12  # tick labels per heat-map axis (evenly spread)
COLLAPSE_ROWS = 12  # flag lists longer than this start folded
DPI = 80
FAST_RC: dict[Any, Any] = {
    "axes.titley": 1.0
}  # a fixed title position: matplotlib skips re-measuring every axes for it
LINES_RC = {**FAST_RC, "axes.formatter.min_exponent": 3}  # the line plots': 1, 10, 100 on log axes, not 10⁰ ...
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"
RUNTIME_COLOURS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
LINE_STYLES = ("-", "--", ":", "-.")  # past the tenth runtime, the colours again with the next line style ...
LINE_MARKERS = ("o", "s", "^", "D")  # ... and marker
LEGEND_COLUMNS = 5  # the most columns of a line plot's legend (fewer when the figure is too narrow for them)
LEGEND_SIDE_IN = 0.1  # the least space between the legend and the figure's left and right edges, inches
LEGEND_GAP_IN = 0.05  # space between the legend and the x-axis labels above it, inches
CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:1.5em auto;max-width:1280px;
padding:0 1em;color:#1b1b1b}
h1{font-size:1.6em;margin:.2em 0}h2{border-bottom:2px solid #ccc;margin-top:1.8em}h3{margin-bottom:.3em}
table{border-collapse:collapse;margin:.4em 0 1em}th,td{border:1px solid #d4d4d4;padding:2px 6px;vertical-align:top}
th{background:#f0f0f0;text-align:left}td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.bad td{background:#fff1f0}tr.noisy td{background:#fffbe6}.faster{color:#0b6e1f;font-weight:600}
.slower{color:#b3261e;font-weight:600}.muted{color:#666}code{background:#f4f4f4;padding:0 3px;word-break:break-all}
img{max-width:100%;height:auto;display:block;margin:.3em 0}nav a{margin-right:1em}
details>summary{cursor:pointer;font-weight:600}.scope{font-size:1.05em}.kv td:first-child{white-space:nowrap}
.small,.pairs{font-size:.9em}.wide{overflow-x:auto}
"""


def esc(value: Any) -> str:
    """Any value as HTML text: ``html.escape(str(value))`` (quotes too); ``—`` for None."""
    return "—" if value is None else html.escape(str(value), quote=True)


def mpl_text(value: Any) -> str:
    """A store string for a matplotlib label: ``$`` escaped, so it is printed, never parsed as math text."""
    return str(value).replace("$", r"\$")


def _second_axis(cells: Sequence[ResultRecord | CellComparison]) -> tuple[str, str]:
    """The attribute beside the batch size that tells ``cells`` apart and its axis label: the loaders' worker count
    for phase data cells, else the sequence length."""
    if any(c.workers is not None for c in cells):
        return "workers", "loader workers"
    return "seq_len", "sequence length"


def _ratio(value: float | None) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.3g}×"


# -- plots ------------------------------------------------------------------------------------
def _figure(width: float, height: float, layout: Literal["constrained", "tight"] | None = "constrained") -> Figure:
    fig = Figure(figsize=(width, height), layout=layout)
    FigureCanvasAgg(fig)
    return fig


def _png(fig: Figure, alt: str) -> str:
    """The figure as an ``<img>`` with a base64 PNG data URI (no metadata: nothing but pixels)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{esc(alt)}">'


def _axis_values(rows: Sequence[ResultRecord], key: str) -> list[Any]:
    values = {getattr(row, key) for row in rows}
    return sorted(values, key=lambda v: (v is not None, v or 0))


def _na_text(cell: CellComparison) -> str:
    if cell.baseline_status != "ok" and cell.runtime_status != "ok":
        return f"both\n{cell.runtime_status}"
    if cell.baseline_status != "ok":
        return f"base\n{cell.baseline_status}"
    return cell.runtime_status if cell.runtime_status != "ok" else "no\nsamples"


def heatmap_figure(pairs: Sequence[tuple[str, list[CellComparison]]], baseline: str, title: str) -> str:
    """One heat map per runtime of its speed-up over ``baseline`` (rows batch size, columns sequence length),
    on one diverging log-scale centred at 1 (blue: faster than the baseline, red: slower); N/A cells
    hatched grey with the status; numbers in parentheses are not significant."""
    everything = [c for _, cells in pairs for c in cells]
    batches = sorted({c.batch_size for c in everything})
    second, second_label = _second_axis(everything)
    seqs = sorted({getattr(c, second) for c in everything}, key=lambda v: (v is not None, v or 0))
    logs = [abs(math.log2(c.ratio)) for c in everything if c.ratio and math.isfinite(c.ratio) and c.ratio > 0]
    limit = max([0.25, *logs])
    norm = Normalize(-limit, limit)
    cmap = matplotlib.colormaps["RdBu"].with_extremes(bad="white")
    annotate = len(batches) * len(seqs) <= MAX_ANNOTATED_CELLS
    ncols = min(3, len(pairs))
    nrows = math.ceil(len(pairs) / ncols)
    columns = _pick(list(range(len(seqs))), MAX_TICKS)
    # fixed margins in inches (a constrained layout costs a third of the figure's time)
    left, right, top, bottom, gap_w, gap_h = 0.7, 1.3, 0.75, 0.85 if len(columns) > 8 else 0.6, 0.2, 0.45
    width = min(15.0, left + right + ncols * max(1.8, 0.5 * len(seqs)) + (ncols - 1) * gap_w)
    cell_h = max(1.2, 0.32 * len(batches))
    height = top + bottom + nrows * cell_h + (nrows - 1) * gap_h
    cell_w = (width - left - right - (ncols - 1) * gap_w) / ncols
    with matplotlib.rc_context({**FAST_RC, "hatch.color": "#888888"}):
        fig = _figure(width, height, layout=None)
        fig.subplots_adjust(
            left=left / width,
            right=1 - right / width,
            top=1 - top / height,
            bottom=bottom / height,
            wspace=gap_w / cell_w,
            hspace=gap_h / cell_h,
        )
        axes = fig.subplots(nrows, ncols, squeeze=False)
        image = None
        for index, ax in enumerate(axes.flat):
            if index >= len(pairs):
                ax.set_visible(False)
                continue
            runtime, cells = pairs[index]
            data = np.full((len(batches), len(seqs)), np.nan)
            by_pos = {(batches.index(c.batch_size), seqs.index(getattr(c, second))): c for c in cells}
            for (i, j), cell in by_pos.items():
                if cell.ratio is not None and math.isfinite(cell.ratio) and cell.ratio > 0:
                    data[i, j] = math.log2(cell.ratio)
            image = ax.imshow(data, cmap=cmap, norm=norm, aspect="auto", interpolation="nearest")
            missing = [Rectangle((j - 0.5, i - 0.5), 1, 1) for (i, j), cell in by_pos.items() if cell.ratio is None]
            if missing:
                ax.add_collection(
                    PatchCollection(missing, facecolor="#dddddd", edgecolor="#999999", hatch="///", linewidth=0.5)
                )
            for (i, j), cell in by_pos.items():
                if not annotate:
                    continue
                if cell.ratio is None:
                    text, colour = _na_text(cell), "#333333"
                else:
                    text = f"{cell.ratio:.3g}" if cell.significant else f"({cell.ratio:.3g})"
                    colour = "white" if abs(float(norm(data[i, j])) - 0.5) > 0.33 else "black"
                ax.text(j, i, text, ha="center", va="center", fontsize=7.5, color=colour)
            ax.set_xticks(
                columns,
                ["—" if seqs[j] is None else str(seqs[j]) for j in columns] if index >= len(pairs) - ncols else [],
                rotation=90 if len(columns) > 8 else 0,
                fontsize=8,
            )
            ax.set_yticks(range(len(batches)), [str(b) for b in batches] if index % ncols == 0 else [], fontsize=8)
            if index >= len(pairs) - ncols:
                ax.set_xlabel(second_label, fontsize=8)
            if index % ncols == 0:
                ax.set_ylabel("batch", fontsize=8)
            ax.set_title(mpl_text(runtime), fontsize=9)
        if image is not None:
            cax = fig.add_axes((1 - (right - 0.2) / width, bottom / height, 0.14 / width, 1 - (top + bottom) / height))
            bar = fig.colorbar(image, cax=cax)
            step = next(s for s in (0.25, 0.5, *range(1, 64)) if limit / s < 3)  # at most 2 ticks a side
            ticks = [k * step for k in range(-int(limit / step), int(limit / step) + 1)]
            bar.set_ticks(ticks, labels=[f"{2.0**t:.3g}×" for t in ticks])
            bar.set_label(mpl_text(f"speed-up over {baseline}"), fontsize=8)
        fig.suptitle(mpl_text(title), fontsize=10)
        return _png(fig, f"heat maps of speed-up over {baseline}: {title}")


def _pick(values: list[Any], limit: int) -> list[Any]:
    """At most ``limit`` of ``values``, evenly spread, first and last included."""
    if len(values) <= limit:
        return values
    return [values[int(i)] for i in np.unique(np.round(np.linspace(0, len(values) - 1, limit)))]


def runtime_styles(runtimes: Sequence[str]) -> dict[str, dict[str, str]]:
    """Each runtime's line style in the line plots (``color``, ``linestyle``, ``marker``): the colours in order,
    then, past RUNTIME_COLOURS' ten, the same colours with another line style and marker, so that no two of up to
    forty runtimes look alike."""
    n = len(RUNTIME_COLOURS)
    return {
        runtime: {
            "color": RUNTIME_COLOURS[i % n],
            "linestyle": LINE_STYLES[(i // n) % len(LINE_STYLES)],
            "marker": LINE_MARKERS[(i // n) % len(LINE_MARKERS)],
        }
        for i, runtime in enumerate(runtimes)
    }


def place_legend(fig: Figure, handles: Sequence[Any], labels: Sequence[str]) -> float:
    """Put the runtimes' legend at the bottom centre of ``fig``, inside it whatever the labels' number and length:
    as many columns (at most LEGEND_COLUMNS) as the figure's width holds, measured as rendered; one column that is
    still too wide widens the figure. Returns the height of the band it takes at the bottom, in inches.

    A legend wider than its figure is centred on it, so both its ends are cut off in the saved PNG: eleven
    runtimes' names in five columns need about 8 inches, a one-panel figure is 6."""
    canvas = fig.canvas
    assert isinstance(canvas, FigureCanvasAgg)
    renderer = canvas.get_renderer()
    room = fig.get_figwidth() - 2 * LEGEND_SIDE_IN
    for ncols in range(min(LEGEND_COLUMNS, len(labels)), 0, -1):
        legend = fig.legend(handles, labels, loc="lower center", ncols=ncols, fontsize=8, frameon=False)
        box = legend.get_window_extent(renderer)
        if box.width / fig.dpi <= room or ncols == 1:
            break
        legend.remove()
    if box.width / fig.dpi > room:
        fig.set_figwidth(box.width / fig.dpi + 2 * LEGEND_SIDE_IN)
    return box.y1 / fig.dpi + LEGEND_GAP_IN


def lines_figure(rows: Sequence[ResultRecord], styles: dict[str, dict[str, str]], title: str) -> tuple[str, str]:
    """:func:`lines_plot` as an ``<img>``, with the sentence saying which panels are shown."""
    fig, note = lines_plot(rows, styles, title)
    with matplotlib.rc_context(LINES_RC):  # the tick labels are formatted as it is drawn
        return _png(fig, f"latency and peak RSS against shape: {title}"), note


def lines_plot(rows: Sequence[ResultRecord], styles: dict[str, dict[str, str]], title: str) -> tuple[Figure, str]:
    """Latency (median, CI band) and peak RSS against the shape, one line per runtime (``styles``: see
    :func:`runtime_styles`); x is the axis with more values (batch or sequence length), one panel per value of the
    other (at most MAX_LINE_PANELS). Returns the figure and a sentence saying which panels are shown."""
    second, second_label = _second_axis(rows)
    batches, seqs = _axis_values(rows, "batch_size"), _axis_values(rows, second)
    x_key, panel_key = ("batch_size", second) if len(batches) >= len(seqs) else (second, "batch_size")
    x_label = "batch size" if x_key == "batch_size" else second_label
    panel_values = seqs if panel_key == second else batches
    shown = _pick(panel_values, MAX_LINE_PANELS)
    panel_name = {"seq_len": "s", "workers": "w"}.get(panel_key, "b")
    note = (
        ""
        if len(shown) == len(panel_values)
        else (
            f"Panels for {len(shown)} of {len(panel_values)} {second_label + 's' if panel_key == second else 'batch sizes'}"
            f" ({', '.join(str(v) for v in shown)}); every cell is in the tables."
        )
    )
    runtimes = runtimes_in(rows)
    width, height = min(15.0, max(6.0, 1.4 + 2.6 * len(shown))), 5.0  # the height without the legend's band
    with matplotlib.rc_context(LINES_RC):
        fig = _figure(width, height, layout=None)  # fixed margins: a constrained layout doubles the time
        axes = fig.subplots(2, len(shown), squeeze=False, sharex="col", sharey="row")
        xs_all = sorted({x for r in rows if (x := getattr(r, x_key)) is not None})
        for column, value in enumerate(shown):
            top, bottom = axes[0, column], axes[1, column]
            for runtime in runtimes:
                points = sorted(
                    (
                        r
                        for r in rows
                        if r.runtime == runtime
                        and getattr(r, panel_key) == value
                        and r.status == "ok"
                        and r.median_s is not None
                        and getattr(r, x_key) is not None
                    ),
                    key=lambda r: getattr(r, x_key),
                )
                if not points:
                    continue
                xs = [getattr(r, x_key) for r in points]
                medians = [m for r in points if (m := r.median_s) is not None]  # every point has one
                style = styles[runtime]
                colour = style["color"]
                top.plot(xs, [m * 1e3 for m in medians], markersize=3, label=mpl_text(runtime), linewidth=1.2, **style)
                low = [(m if r.ci_low_s is None else r.ci_low_s) * 1e3 for r, m in zip(points, medians)]
                high = [(m if r.ci_high_s is None else r.ci_high_s) * 1e3 for r, m in zip(points, medians)]
                top.fill_between(xs, low, high, color=colour, alpha=0.25, linewidth=0)
                memory = [
                    (getattr(r, x_key), r.peak_memory_bytes / 2**20) for r in points if r.peak_memory_bytes is not None
                ]
                if memory:
                    bottom.plot(*zip(*memory), markersize=3, linewidth=1.2, **style)
            if xs_all and min(xs_all) > 0 and max(xs_all) / min(xs_all) >= 4:  # worker counts start at 0: linear
                bottom.set_xscale("log", base=2)
            if xs_all and len(xs_all) <= MAX_TICKS:
                bottom.set_xticks(xs_all, [str(x) for x in xs_all], minor=False)
            bottom.xaxis.set_minor_locator(NullLocator())
            top.set_title("" if value is None else f"{panel_name}={value}", fontsize=9)
            bottom.set_xlabel(x_label, fontsize=8)
            for ax in (top, bottom):
                ax.tick_params(labelsize=7)
                ax.grid(True, alpha=0.3)
        axes[0, 0].set_yscale("log")
        axes[0, 0].yaxis.set_minor_locator(NullLocator())  # minor ticks of log axes cost more than the rest
        axes[0, 0].set_ylabel("median per call, ms\n(band: 95% CI)", fontsize=8)
        axes[1, 0].set_ylabel("peak RSS, MiB", fontsize=8)
        handles, labels = [], []
        for ax in axes[0]:
            for handle, text in zip(*ax.get_legend_handles_labels()):
                if text not in labels:
                    handles.append(handle)
                    labels.append(text)
        band = place_legend(fig, handles, labels) if handles else 0.0
        width, height = fig.get_figwidth(), height + band
        fig.set_figheight(height)
        fig.subplots_adjust(
            left=0.85 / width,
            right=1 - 0.15 / width,
            top=1 - 0.55 / height,
            bottom=(0.75 + band) / height,
            wspace=0.08,
            hspace=0.1,
        )
        fig.suptitle(mpl_text(title), fontsize=10)
        return fig, note


# -- HTML pieces ------------------------------------------------------------------------------
def _table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    numeric: Sequence[int] = (),
    row_classes: Sequence[str] | None = None,
    css: str = "",
) -> str:
    """A ``<table>``; cells are already HTML (escaped by the caller); ``numeric`` columns right-aligned
    (by one CSS rule on the table's class ``css`` when it has one, else by a class on each cell)."""
    head = "".join(f"<th>{h}</th>" for h in headers)
    lines = [f"<table{f' class={css}' if css else ''}><thead><tr>{head}</tr></thead><tbody>"]
    if css and numeric:
        selectors = ",".join(f".{css} td:nth-child({i + 1})" for i in numeric)
        lines.insert(
            0, f"<style>{selectors}{{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}}</style>"
        )
    numeric_set = set() if css else set(numeric)
    for index, row in enumerate(rows):
        cls = row_classes[index] if row_classes else ""
        cells = "".join(f'<td class="n">{c}</td>' if i in numeric_set else f"<td>{c}</td>" for i, c in enumerate(row))
        lines.append(f'<tr class="{cls}">{cells}</tr>' if cls else f"<tr>{cells}</tr>")
    lines.append("</tbody></table>")
    return "\n".join(lines)


def _maybe_fold(title: str, cells: int, rows: int, body: str) -> str:
    """A titled flag list (``cells`` cells in ``rows`` table rows), folded when it is long."""
    if cells == 0:
        return f"<h3>{title}: none</h3>"
    count = f"{cells} cell{'s' if cells != 1 else ''}"
    if rows > COLLAPSE_ROWS:
        return f"<details><summary>{title}: {count} (click to show)</summary>{body}</details>"
    return f"<h3>{title}: {count}</h3>{body}"


def _cell_label(row: ResultRecord, multi_run: bool) -> list[str]:
    return ([esc(row.run_id)] if multi_run else []) + [
        esc(row.model),
        esc(row.runtime),
        esc(shape_text(row.batch_size, row.seq_len, row.workers, row.procs, row.scaling)),
    ]


def _speedup_html(summary: PairSummary) -> str:
    text = _ratio(summary.geomean_ratio)
    if summary.ci_low is not None and summary.ci_high is not None:
        text += f' <span class="muted">[{summary.ci_low:.3g}–{summary.ci_high:.3g}]</span>'
        if summary.ci_low > 1:
            text = f'<span class="faster">{text}</span>'
        elif summary.ci_high < 1:
            text = f'<span class="slower">{text}</span>'
    return text


def _failed(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {esc(status)}" for status, n in counts.items()) or "0"


def _summary_rows(pairs: Sequence[GroupedPair], with_group: bool) -> list[list[str]]:
    rows = []
    for pair in pairs:
        s = pair.summary
        compared = sum(1 for c in pair.cells if c.ratio is not None)
        machine = f" machine {short_id(pair.hardware_id)}" if len({p.hardware_id for p in pairs}) > 1 else ""
        group = [esc(f"run {pair.run_id}{machine} {pair.phase} {pair.dtype} {pair.device}")] if with_group else []
        rows.append(
            group
            + [
                esc(s.runtime),
                str(s.n_common),
                _speedup_html(s),
                str(s.n_faster),
                str(s.n_slower),
                str(compared - s.n_faster - s.n_slower),
                _failed(s.failed_baseline),
                _failed(s.failed_runtime),
            ]
        )
    return rows


SUMMARY_HEADERS = [
    "runtime",
    "cells both ok",
    "geometric-mean speed-up [95% CI]",
    "sig. faster",
    "sig. slower",
    "no sig. diff.",
    "baseline could not run",
    "runtime could not run",
]


def summary_section(pairs: Sequence[GroupedPair], baseline: str | None, results: Sequence[ResultRecord]) -> str:
    """The pair summaries against the baseline, one row per runtime and (run, phase, dtype, device) group."""
    parts = ['<section id="summary"><h2>Summary against the baseline</h2>']
    if baseline is None or not pairs:
        present = ", ".join(esc(r) for r in runtimes_in(results)) or "none"
        parts.append(
            f"<p>No comparison: the baseline {esc(baseline)} shares no cells with another runtime here "
            f"(runtimes: {present}).</p></section>"
        )
        return "\n".join(parts)
    with_group = len({(p.run_id, p.hardware_id, p.phase, p.dtype, p.device) for p in pairs}) > 1
    headers = (["group"] if with_group else []) + SUMMARY_HEADERS
    offset = 1 if with_group else 0
    parts.append(_table(headers, _summary_rows(pairs, with_group), numeric=[offset + i for i in (1, 2, 3, 4, 5)]))
    parts.append(
        f"<p class=small>Speed-up = time of {esc(baseline)} / time of the runtime, per cell (&gt; 1: the "
        "runtime is faster); for cells measured interleaved, from paired blocks that ran back to back. The geometric "
        "mean is over the cells both completed <em>ok</em> (never a mean of seconds), with a seeded "
        "percentile-bootstrap 95% CI over cells; green/red when that CI excludes 1. Significant: Student-t over the "
        f"rounds (fresh worker processes; at least 3), Holm-adjusted over the pair's cells, p &lt; {ALPHA}."
        " <em>Could not run</em> counts the non-ok cells of each side among the cells both have. Ratios never "
        "mix runs, phases, dtypes or devices.</p></section>"
    )
    return "\n".join(parts)


def _grouped(
    rows: Sequence[ResultRecord], what: Callable[[ResultRecord], tuple[Any, ...]], multi_run: bool
) -> tuple[int, list[list[str]]]:
    """Cells grouped by (run, model, runtime, ``what(row)``): one table row per group with its cell count
    and every shape; returns (cells, table rows)."""
    groups: dict[tuple[Any, ...], list[str]] = {}
    for r in rows:
        groups.setdefault((r.run_id, r.model, r.runtime, *what(r)), []).append(
            shape_text(r.batch_size, r.seq_len, r.workers, r.procs, r.scaling)
        )
    table = [
        ([esc(key[0])] if multi_run else []) + [esc(k) for k in key[1:]] + [str(len(shapes)), esc(", ".join(shapes))]
        for key, shapes in groups.items()
    ]
    return len(rows), table


def flags_section(results: Sequence[ResultRecord], multi_run: bool) -> str:
    """Compile-health flags, noisy cells, parity mismatches and the other cells that did not run; cells
    with the same model, runtime and message are one row listing their shapes."""
    run = ["run"] if multi_run else []
    n_compile, compile_rows = _grouped(
        [r for r in results if compile_flags(r)], lambda r: ("; ".join(compile_flags(r)),), multi_run
    )
    noisy_rows = [
        _cell_label(r, multi_run)
        + [f"±{rel_half_width(r):.1%}", esc(format_seconds_noise(r.median_s, r.ci_low_s, r.ci_high_s))]
        for r in results
        if is_noisy(r)
    ]
    n_mismatch, mismatch_rows = _grouped(
        [r for r in results if r.status == "mismatch"], lambda r: (r.reason,), multi_run
    )
    n_other, other_rows = _grouped(
        [r for r in results if r.status not in ("ok", "mismatch")], lambda r: (r.status, r.reason), multi_run
    )
    tail = ["cells", "shapes"]
    count_column = len(run) + 3
    return "\n".join(
        [
            '<section id="flags"><h2>Flags</h2>',
            _maybe_fold(
                "Compile health (recompiles or retraces in the timed loop, graph breaks, eager fallbacks)",
                n_compile,
                len(compile_rows),
                _table(run + ["model", "runtime", "flags"] + tail, compile_rows, numeric=[count_column]),
            ),
            _maybe_fold(
                f"Noisy cells (95% CI half-width &gt; {NOISY_REL_CI:.0%} of the median)",
                len(noisy_rows),
                len(noisy_rows),
                _table(
                    run + ["model", "runtime", "shape", "CI half-width", "median"],
                    noisy_rows,
                    numeric=[len(run) + 3, len(run) + 4],
                ),
            ),
            _maybe_fold(
                "Parity mismatches (outputs differ from the float64 reference; no time reported)",
                n_mismatch,
                len(mismatch_rows),
                _table(run + ["model", "runtime", "reason"] + tail, mismatch_rows, numeric=[count_column]),
            ),
            _maybe_fold(
                "Other cells that did not run (oom, timeout, error, skipped)",
                n_other,
                len(other_rows),
                _table(run + ["model", "runtime", "status", "reason"] + tail, other_rows, numeric=[count_column + 1]),
            ),
            "</section>",
        ]
    )


def _error_text(value: float | None) -> str:
    return f"{math.nan if value is None else value:.2e}"


def _computed_in(row: ResultRecord) -> str:
    """The op classes' dtypes a cell's framework showed (details.precision), or why there are none."""
    seen = row.precision
    if seen is None:
        return "—"
    if seen.error:
        return f"not observed: {esc(seen.error)}"
    if not seen.observable:
        return "not observable (an engine's compiled artefact)"
    return "<br>".join(f"{esc(op)}: {esc(', '.join(names))}" for op, names in seen.observed.items()) or "—"


def parity_section(results: Sequence[ResultRecord], multi_run: bool) -> str:
    """One row per stored parity check: relative L2 and max-abs error of each output against the reference, the
    dtypes the framework's graph showed per op class, and the precision flag (fwbench.report.flags)."""
    precision = precision_flags(results)
    rows, classes = [], []
    for r in results:
        check = r.parity
        if check is None:
            continue
        errors = (
            "<br>".join(
                f"{esc(name)}: rel L2 {_error_text(v.rel_l2)}, max abs {_error_text(v.max_abs)}"
                for name, v in check.outputs.items()
            )
            or "—"
        )
        ok = check.passed
        computed = _computed_in(r)
        rows.append(
            ([esc(r.run_id)] if multi_run else [])
            + [
                esc(r.model),
                esc(r.runtime),
                esc(r.dtype),
                esc(" × ".join("—" if s is None else str(s) for s in check.shape)),
                "ok" if ok else "<b>MISMATCH</b>",
                esc(check.tolerance_rel_l2),
                esc(check.reference),
                errors,
                computed + (f"<br><b>{esc(precision[precision_key(r)])}</b>" if precision_key(r) in precision else ""),
            ]
        )
        classes.append("" if ok else "bad")
    headers = (["run"] if multi_run else []) + [
        "model",
        "runtime",
        "dtype",
        "checked at (batch × seq)",
        "parity",
        "tolerance (rel L2)",
        "reference",
        "error per output",
        "computed in (observed)",
    ]
    body = _table(headers, rows, row_classes=classes) if rows else "<p>No parity checks are stored here.</p>"
    return (
        f'<section id="parity"><h2>Parity</h2><p class=small>Each runtime is checked once per model in a run, '
        f"by its first cell, after the timing, on the model's parity shape.</p>{body}</section>"
    )


def _value(value: Any) -> str:
    if isinstance(value, (dict, list, tuple)):
        return f"<code>{esc(json.dumps(value, sort_keys=True, default=str))}</code>"
    return esc(value)


def environment_section(runs: Sequence[RunRecord]) -> str:
    """Each run's metadata, settings and environment record, as stored."""
    parts = ['<section id="environment"><h2>Environment and settings</h2>']
    for index, run in enumerate(runs):
        meta = [
            ("run", run.id),
            ("created", run.created),
            ("finished", run.finished or "not finished"),
            ("suite", run.suite),
            ("fwbench version", run.fwbench_version),
            ("cells planned", run.planned.size),
            *([("shard", f"{run.shard} of plan {str(run.plan_hash)[:12]}")] if run.shard else []),
            *(
                [("merged from", "; ".join(f"{p['file']} run {p['run_id']}" for p in run.sources))]
                if run.sources
                else []
            ),
        ]
        kv = [[esc(k), esc(v)] for k, v in meta] + [["command", f"<code>{esc(run.command)}</code>"]]
        settings = [[esc(k), _value(v)] for k, v in sorted(run.settings.items())]
        env = [[esc(k), _value(v)] for k, v in sorted(run.environment.items())]
        open_attr = " open" if index == 0 else ""
        parts.append(
            f"<details{open_attr}><summary>run {esc(run.id)}: {esc(run.created)}, {esc(run.suite or 'no suite')}, "
            f"{esc(run.planned.size)} cells</summary>"
            + _table(["", ""], kv, css="kv")
            + "<h3>Settings</h3>"
            + _table(["setting", "value"], settings, css="kv")
            + "<h3>Environment</h3>"
            + _table(["key", "value"], env, css="kv")
            + "</details>"
        )
    if not runs:
        parts.append("<p>No run records.</p>")
    parts.append("</section>")
    return "\n".join(parts)


def _speed_up_text(r: ResultRecord, ratios: dict[tuple[Any, ...], CellComparison], baseline: str | None) -> str:
    """The row's speed-up against the baseline's cell (HTML): its ratio, n.s. when not significant."""
    if r.runtime == baseline:
        return "<i>baseline</i>"
    cell = ratios.get((r.runtime, *cell_key(r)))
    if cell is None:
        return "—"
    return _ratio(cell.ratio) + ("" if cell.ratio is None or cell.significant else " <i>n.s.</i>")


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
        + _table(headers, rows, numeric=numeric, row_classes=classes, css="results")
        + "</div></section>"
    )


def _header(
    runs: Sequence[RunRecord], results: Sequence[ResultRecord], baseline: str | None, source: str | None
) -> str:
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    status_text = ", ".join(f"{n} {esc(s)}" for s, n in sorted(counts.items())) or "none"
    models = ", ".join(esc(m) for m in dict.fromkeys(r.model for r in results)) or "none"
    runtimes = ", ".join(esc(r) for r in runtimes_in(results)) or "none"
    run_text = ", ".join(esc(r.id) for r in runs) or "none"
    where = f" in <code>{esc(source)}</code>" if source else ""
    machine = ""
    if runs:
        env, settings = runs[-1].environment, runs[-1].settings
        versions = ", ".join(
            f"{esc(k.removeprefix('version_'))} {esc(v)}"
            for k, v in sorted(env.items())
            if k.startswith("version_") and v
        )
        machine = (
            f"<p class=small>Machine (run {esc(runs[-1].id)}): {esc(env.get('cpu_model'))}, "
            f"{esc(env.get('physical_cores'))} physical cores, {esc(env.get('cpu_simd_flags'))}; "
            f"threads {esc(settings.get('threads'))}, protocol {esc(settings.get('protocol'))}; {versions}.</p>"
        )
    measured_html = "".join(
        f"<p class=small>{esc(line[0].upper() + line[1:])}.</p>"
        for line in (wall_time_line(wall_time(results)), rounds_stop_line(results))
        if line
    )
    generated = datetime.now(UTC).isoformat(timespec="seconds")
    return (
        f"<h1>fwbench report</h1><p class=scope>{len(results)} results ({status_text}) of run(s) {run_text}"
        f"{where}. Models: {models}. Runtimes: {runtimes}. Baseline: <b>{esc(baseline)}</b>.</p>{machine}"
        f"{measured_html}"
        f'<nav class=small><a href="#summary">summary</a><a href="#flags">flags</a><a href="#models">per model</a>'
        f'<a href="#parity">parity</a><a href="#environment">environment</a><a href="#results">all results</a>'
        f"</nav><p class='small muted'>Generated {esc(generated)}; self-contained (no network references).</p>"
    )


def _extra_section(
    anchor: str, title: str, headers: Sequence[str], right: frozenset[str], rows: list[list[str]], legend: str
) -> str:
    """A section of one extra table (plain cells, escaped here) with its legend; empty without rows. Numeric
    columns: those in ``right`` and the ratio columns (speed-up, efficiency)."""
    if not rows:
        return ""
    numeric = [i for i, h in enumerate(headers) if h in right or h.startswith(("speed-up", "efficiency"))]
    return (
        f'<section id="{anchor}"><h2>{esc(title)}</h2>'
        + _table(list(headers), [[esc(cell) for cell in row] for row in rows], numeric=numeric, css=anchor)
        + f"<p class=small>{esc(legend)}</p></section>"
    )


def reduced_precision_section(results: Sequence[ResultRecord]) -> str:
    """bf16 / int8 cells beside the same runtime's fp32 cells (:mod:`fwbench.report.dtypes`); empty without any."""
    rows = [dtypes.dtype_cells(item, markup=False) for item in dtypes.dtype_comparisons(results)]
    return _extra_section("reduced-precision", dtypes.TITLE, dtypes.HEADERS, dtypes.RIGHT, rows, dtypes.LEGEND)


def scaling_section(results: Sequence[ResultRecord]) -> str:
    """Data-parallel cells against their 1-process cells (:mod:`fwbench.report.scaling`); empty without any."""
    rows = [scaling.scaling_cells(item, markup=False) for item in scaling.scaling_rows(results)]
    return _extra_section("scaling", scaling.TITLE, scaling.HEADERS, scaling.RIGHT, rows, scaling.LEGEND)


def models_section(results: Sequence[ResultRecord], comparisons: Sequence[GroupedPair], baseline: str | None) -> str:
    """Per (run, model, phase, dtype, device): the model's pair summary, heat maps and line plots."""
    groups = split_groups(results, PLOT_GROUP_FIELDS)
    styles = runtime_styles(runtimes_in(results))
    by_pair: dict[tuple[Any, ...], list[CellComparison]] = {}
    for pair in comparisons:
        for cell in pair.cells:
            key = (
                cell.run_id, cell.hardware_id, cell.model, cell.phase, cell.dtype, cell.device, cell.procs,
                cell.scaling, cell.runtime,
            )  # fmt: skip
            by_pair.setdefault(key, []).append(cell)
    multi_run = len({key[0] for key in groups}) > 1
    multi_machine = len({key[1] for key in groups}) > 1
    parts = ['<section id="models"><h2>Per model</h2>']
    if len(groups) > MAX_PLOT_GROUPS:
        parts.append(
            f"<p><b>Plots for the first {MAX_PLOT_GROUPS} of {len(groups)} model groups</b> (run, model, "
            "phase, dtype, device); the summary above and the tables below cover every cell.</p>"
        )
    for index, (group, rows) in enumerate(groups.items()):
        if index >= MAX_PLOT_GROUPS:
            break
        run_id, hardware_id, model, phase, dtype, device, procs, scaling = group
        scope = ("run " + str(run_id) + ", " if multi_run else "") + (
            f"machine {short_id(hardware_id)}, " if multi_machine else ""
        )
        processes = "" if procs is None else f", {procs} processes {scaling}"
        title = f"{model} ({scope}{phase}, {dtype}, {device}{processes})"
        parts.append(f"<h3>{esc(title)}</h3>")
        pairs = [(rt, by_pair[(*group, rt)]) for rt in runtimes_in(rows) if rt != baseline and (*group, rt) in by_pair]
        if pairs and baseline is not None:
            summaries = [
                GroupedPair(run_id, hardware_id, phase, dtype, device, cells, pair_summary(cells, baseline, rt))
                for rt, cells in pairs
            ]
            parts.append(_table(SUMMARY_HEADERS, _summary_rows(summaries, False), numeric=[1, 2, 3, 4, 5], css="pairs"))
            parts.append(heatmap_figure(pairs, baseline, f"{title}: speed-up over {baseline}"))
            parts.append(
                "<p class=small>Heat map cells: speed-up over the baseline (blue: faster, red: slower, "
                "white: no such cell); hatched grey: N/A, with the status of the side that did not run; "
                "in parentheses: not significant.</p>"
            )
        else:
            parts.append(f"<p class=small>No heat map: {esc(baseline)} has no cells in this group to compare.</p>")
        image, note = lines_figure(rows, styles, title)
        parts.append(image)
        parts.append(
            f"<p class=small>Median per call with its 95% CI (band) and peak RSS, ok cells only. {esc(note)}</p>"
        )
    parts.append("</section>")
    return "\n".join(parts)


def to_html(
    runs: Sequence[RunRecord],
    results: Sequence[ResultRecord],
    *,
    baseline: str | None,
    peak: Peak | None = None,
    source: str | None = None,
) -> str:
    """The whole report as one HTML document (UTF-8 text). ``baseline`` is the runtime speed-ups are
    relative to (None: no comparison); ``source`` names the database in the header."""
    from fwbench.report.serving_html import serving_section  # it draws with this module's helpers

    comparisons = grouped_pairs(results, baseline) if baseline is not None else []
    ratios = {(cell.runtime, *cell_key(cell)): cell for pair in comparisons for cell in pair.cells}
    multi_run = len({r.run_id for r in results}) > 1
    body = "\n".join(
        [
            _header(runs, results, baseline, source),
            summary_section(comparisons, baseline, results),
            reduced_precision_section(results),
            scaling_section(results),
            serving_section(results),
            flags_section(results, multi_run),
            models_section(results, comparisons, baseline),
            parity_section(results, multi_run),
            environment_section(runs),
            results_section(results, ratios, baseline, peak),
        ]
    )
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>fwbench report</title><style>{CSS}</style></head><body>\n{body}\n</body></html>\n"
    )
