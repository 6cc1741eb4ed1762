"""The HTML report's plots, drawn with matplotlib and inlined as PNG data URIs: the speed-up heat maps, the latency
and peak-RSS line plots, each runtime's line style, the legend that fits its figure. Store strings reach a plot
through :func:`mpl_text` (so ``$`` is never math text)."""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PatchCollection
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import NullLocator

from fwbench.report.html.markup import esc
from fwbench.speedups import CellComparison, runtimes_in
from fwbench.store import ResultRecord

DPI = 80
FAST_RC: dict[Any, Any] = {
    "axes.titley": 1.0
}  # a fixed title position: matplotlib skips re-measuring every axes for it
LINES_RC = {**FAST_RC, "axes.formatter.min_exponent": 3}  # the line plots': 1, 10, 100 on log axes, not 10⁰ ...
MAX_LINE_PANELS = 6  # latency/memory panels per group (values of the axis that is not x)
MAX_ANNOTATED_CELLS = 96  # a heat map with more cells shows colours only
MAX_TICKS = 12  # tick labels per heat-map axis (evenly spread)
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


def mpl_text(value: Any) -> str:
    """A store string for a matplotlib label: ``$`` escaped, so it is printed, never parsed as math text."""
    return str(value).replace("$", r"\$")


def second_axis(cells: Sequence[ResultRecord | CellComparison]) -> tuple[str, str]:
    """The attribute beside the batch size that tells ``cells`` apart and its axis label: the loaders' worker count
    for phase data cells, else the sequence length."""
    if any(c.workers is not None for c in cells):
        return "workers", "loader workers"
    return "seq_len", "sequence length"


def figure(width: float, height: float, layout: Literal["constrained", "tight"] | None = "constrained") -> Figure:
    fig = Figure(figsize=(width, height), layout=layout)
    FigureCanvasAgg(fig)
    return fig


def png(fig: Figure, alt: str) -> str:
    """The figure as an ``<img>`` with a base64 PNG data URI (no metadata: nothing but pixels)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{esc(alt)}">'


def axis_values(rows: Sequence[ResultRecord], key: str) -> list[Any]:
    values = {getattr(row, key) for row in rows}
    return sorted(values, key=lambda v: (v is not None, v or 0))


def na_text(cell: CellComparison) -> str:
    if cell.baseline_status != "ok" and cell.runtime_status != "ok":
        return f"both\n{cell.runtime_status}"
    if cell.baseline_status != "ok":
        return f"base\n{cell.baseline_status}"
    return cell.runtime_status if cell.runtime_status != "ok" else "no\nsamples"


@dataclass(frozen=True)
class HeatGrid:
    """What every panel of one heat-map figure shares: the batch sizes (rows) and second-axis values (columns), the
    colour scale, whether cells carry their numbers, the tick columns, and the panels per figure row."""

    batches: list[Any]
    seqs: list[Any]
    second: str
    second_label: str
    norm: Normalize
    cmap: Any
    annotate: bool
    columns: list[int]
    ncols: int
    panels: int


def _heat_panel(ax: Any, grid: HeatGrid, index: int, runtime: str, cells: Sequence[CellComparison]) -> Any:
    """Draw panel ``index`` (``runtime``'s cells) on ``ax``; returns its image (for the colour bar)."""
    data = np.full((len(grid.batches), len(grid.seqs)), np.nan)
    by_pos = {(grid.batches.index(c.batch_size), grid.seqs.index(getattr(c, grid.second))): c for c in cells}
    for (i, j), cell in by_pos.items():
        if cell.ratio is not None and math.isfinite(cell.ratio) and cell.ratio > 0:
            data[i, j] = math.log2(cell.ratio)
    image = ax.imshow(data, cmap=grid.cmap, norm=grid.norm, aspect="auto", interpolation="nearest")
    missing = [Rectangle((j - 0.5, i - 0.5), 1, 1) for (i, j), cell in by_pos.items() if cell.ratio is None]
    if missing:
        ax.add_collection(
            PatchCollection(missing, facecolor="#dddddd", edgecolor="#999999", hatch="///", linewidth=0.5)
        )
    for (i, j), cell in by_pos.items() if grid.annotate else ():
        if cell.ratio is None:
            text, colour = na_text(cell), "#333333"
        else:
            text = f"{cell.ratio:.3g}" if cell.significant else f"({cell.ratio:.3g})"
            colour = "white" if abs(float(grid.norm(data[i, j])) - 0.5) > 0.33 else "black"
        ax.text(j, i, text, ha="center", va="center", fontsize=7.5, color=colour)
    bottom_row, first_column = index >= grid.panels - grid.ncols, index % grid.ncols == 0
    ax.set_xticks(
        grid.columns,
        ["—" if grid.seqs[j] is None else str(grid.seqs[j]) for j in grid.columns] if bottom_row else [],
        rotation=90 if len(grid.columns) > 8 else 0,
        fontsize=8,
    )
    ax.set_yticks(range(len(grid.batches)), [str(b) for b in grid.batches] if first_column else [], fontsize=8)
    if bottom_row:
        ax.set_xlabel(grid.second_label, fontsize=8)
    if first_column:
        ax.set_ylabel("batch", fontsize=8)
    ax.set_title(mpl_text(runtime), fontsize=9)
    return image


def _colour_bar(fig: Figure, image: Any, limit: float, baseline: str, place: tuple[float, float, float, float]) -> None:
    """The shared colour bar at ``place`` (left, bottom, width, height as figure fractions), ticked in speed-ups."""
    bar = fig.colorbar(image, cax=fig.add_axes(place))
    step = next(s for s in (0.25, 0.5, *range(1, 64)) if limit / s < 3)  # at most 2 ticks a side
    ticks = [k * step for k in range(-int(limit / step), int(limit / step) + 1)]
    bar.set_ticks(ticks, labels=[f"{2.0**t:.3g}×" for t in ticks])
    bar.set_label(mpl_text(f"speed-up over {baseline}"), fontsize=8)


def heatmap_figure(pairs: Sequence[tuple[str, list[CellComparison]]], baseline: str, title: str) -> str:
    """One heat map per runtime of its speed-up over ``baseline`` (rows batch size, columns sequence length),
    on one diverging log-scale centred at 1 (blue: faster than the baseline, red: slower); N/A cells
    hatched grey with the status; numbers in parentheses are not significant."""
    everything = [c for _, cells in pairs for c in cells]
    batches = sorted({c.batch_size for c in everything})
    second, second_label = second_axis(everything)
    seqs = sorted({getattr(c, second) for c in everything}, key=lambda v: (v is not None, v or 0))
    logs = [abs(math.log2(c.ratio)) for c in everything if c.ratio and math.isfinite(c.ratio) and c.ratio > 0]
    limit = max([0.25, *logs])
    ncols = min(3, len(pairs))
    nrows = math.ceil(len(pairs) / ncols)
    grid = HeatGrid(
        batches, seqs, second, second_label, Normalize(-limit, limit),
        matplotlib.colormaps["RdBu"].with_extremes(bad="white"), len(batches) * len(seqs) <= MAX_ANNOTATED_CELLS,
        pick(list(range(len(seqs))), MAX_TICKS), ncols, len(pairs),
    )  # fmt: skip
    # fixed margins in inches (a constrained layout costs a third of the figure's time)
    left, right, top, bottom, gap_w, gap_h = 0.7, 1.3, 0.75, 0.85 if len(grid.columns) > 8 else 0.6, 0.2, 0.45
    width = min(15.0, left + right + ncols * max(1.8, 0.5 * len(seqs)) + (ncols - 1) * gap_w)
    cell_h = max(1.2, 0.32 * len(batches))
    height = top + bottom + nrows * cell_h + (nrows - 1) * gap_h
    cell_w = (width - left - right - (ncols - 1) * gap_w) / ncols
    with matplotlib.rc_context({**FAST_RC, "hatch.color": "#888888"}):
        fig = figure(width, height, layout=None)
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
            image = _heat_panel(ax, grid, index, *pairs[index])
        if image is not None:
            place = (1 - (right - 0.2) / width, bottom / height, 0.14 / width, 1 - (top + bottom) / height)
            _colour_bar(fig, image, limit, baseline, place)
        fig.suptitle(mpl_text(title), fontsize=10)
        return png(fig, f"heat maps of speed-up over {baseline}: {title}")


def pick(values: list[Any], limit: int) -> list[Any]:
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
        return png(fig, f"latency and peak RSS against shape: {title}"), note


def _runtime_lines(
    top: Any, bottom: Any, points: Sequence[ResultRecord], x_key: str, runtime: str, style: dict[str, str]
) -> None:
    """One runtime's lines in a panel: its median per call with the CI band on ``top``, its peak RSS on ``bottom``
    (``points``: its ok cells in the panel, by x); nothing without points."""
    if not points:
        return
    xs = [getattr(r, x_key) for r in points]
    medians = [m for r in points if (m := r.median_s) is not None]  # every point has one
    top.plot(xs, [m * 1e3 for m in medians], markersize=3, label=mpl_text(runtime), linewidth=1.2, **style)
    low = [(m if r.ci_low_s is None else r.ci_low_s) * 1e3 for r, m in zip(points, medians)]
    high = [(m if r.ci_high_s is None else r.ci_high_s) * 1e3 for r, m in zip(points, medians)]
    top.fill_between(xs, low, high, color=style["color"], alpha=0.25, linewidth=0)
    memory = [(getattr(r, x_key), r.peak_memory_bytes / 2**20) for r in points if r.peak_memory_bytes is not None]
    if memory:
        bottom.plot(*zip(*memory), markersize=3, linewidth=1.2, **style)


def lines_plot(rows: Sequence[ResultRecord], styles: dict[str, dict[str, str]], title: str) -> tuple[Figure, str]:
    """Latency (median, CI band) and peak RSS against the shape, one line per runtime (``styles``: see
    :func:`runtime_styles`); x is the axis with more values (batch or sequence length), one panel per value of the
    other (at most MAX_LINE_PANELS). Returns the figure and a sentence saying which panels are shown."""
    second, second_label = second_axis(rows)
    batches, seqs = axis_values(rows, "batch_size"), axis_values(rows, second)
    x_key, panel_key = ("batch_size", second) if len(batches) >= len(seqs) else (second, "batch_size")
    x_label = "batch size" if x_key == "batch_size" else second_label
    panel_values = seqs if panel_key == second else batches
    shown = pick(panel_values, MAX_LINE_PANELS)
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
        fig = figure(width, height, layout=None)  # fixed margins: a constrained layout doubles the time
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
                _runtime_lines(top, bottom, points, x_key, runtime, styles[runtime])
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


def finished_lines(fig: Figure, ax: Any, height: float, title: str, alt: str) -> str:
    """A line plot's common end: small tick labels, a light grid, the legend in a band below the axes, the margins
    for a figure ``height`` inches tall without it, the title; the figure as an ``<img>`` with ``alt``."""
    ax.tick_params(labelsize=7)
    ax.grid(True, alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    band = place_legend(fig, handles, labels) if handles else 0.0
    full = height + band
    fig.set_figheight(full)
    width = fig.get_figwidth()
    fig.subplots_adjust(left=0.9 / width, right=1 - 0.2 / width, top=1 - 0.45 / full, bottom=(0.7 + band) / full)
    fig.suptitle(mpl_text(title), fontsize=10)
    return png(fig, alt)
