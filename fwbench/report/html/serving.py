"""The HTML report's serving section (phase serving's own): the serving table (:mod:`fwbench.report.serving`) and, per model and max
batch, the p99 latency against the offered load, one line per runtime (each Server point's geometric mean over rounds, the
bars the rounds' range), the floor (``floor:identity``) in black, the p99 bound dotted."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from fwbench.details import ServingRound
from fwbench.report import serving
from fwbench.report.html.figures import LINES_RC, figure, finished_lines, mpl_text, runtime_styles
from fwbench.report.html.markup import esc, extra_section
from fwbench.report.peak import Peak
from fwbench.store import ResultRecord


def ladder_curve(rounds: Sequence[ServingRound]) -> list[tuple[float, float, float, float]]:
    """(offered QPS, p99 geometric mean, p99 min, p99 max) over the rounds of each ladder step, by offered load;
    seconds (the table's figures: serving.over_rounds)."""
    curve = []
    for points in serving.ladder_steps(rounds):
        p99 = [p.p99_s for p in points if p.p99_s]
        offered = serving.over_rounds([p.offered_qps for p in points])
        centre = serving.over_rounds(p99)
        if offered is not None and centre is not None:
            curve.append((offered.value, centre.value, min(p99), max(p99)))
    return sorted(curve)


def latencyfigure(rows: Sequence[ResultRecord], title: str) -> str:
    """The p99-against-offered-load plot of one model and max batch (``rows``: its serving cells)."""
    styles = runtime_styles([r.runtime for r in rows if r.runtime != serving.FLOOR])
    bound = next((r.serving.p99_bound_s for r in rows if r.serving and r.serving.p99_bound_s), None)
    with matplotlib.rc_context(LINES_RC):
        fig = figure(7.0, 4.2, layout=None)
        ax = fig.add_subplot(1, 1, 1)
        for row in rows:
            curve = ladder_curve(row.serving.rounds) if row.serving else []
            if not curve:
                continue
            xs = [c[0] for c in curve]
            ys = [c[1] * 1e3 for c in curve]
            # the range around the geometric mean (clamped: exp(mean log) may lie an ulp outside the rounds' range)
            errors = [[max(0.0, c[1] - c[2]) * 1e3 for c in curve], [max(0.0, c[3] - c[1]) * 1e3 for c in curve]]
            style = (
                {"color": "black", "linestyle": "--", "marker": "s"}
                if row.runtime == serving.FLOOR
                else styles[row.runtime]
            )
            ax.errorbar(
                xs, ys, yerr=errors, label=mpl_text(row.runtime), markersize=4, linewidth=1.2, capsize=2,
                color=style["color"], linestyle=style["linestyle"], marker=style["marker"],
            )  # fmt: skip
        if bound is not None:
            ax.axhline(bound * 1e3, color="#c0392b", linestyle=":", linewidth=1, label=f"p99 bound {bound * 1e3:g} ms")
        ax.set_xscale("log")
        ax.set_yscale("log")
        plain = FuncFormatter(lambda value, _: f"{value:g}")
        for axis in (ax.xaxis, ax.yaxis):  # 200, 500, 1000, 2000: not 10³ beside 2 × 10³, nor every minor tick
            axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(plain)
            axis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("offered load, queries/s (LoadGen's Server scenario, Poisson arrivals)", fontsize=8)
        ax.set_ylabel("p99 latency, ms\n(from the scheduled send)", fontsize=8)
        return finished_lines(fig, ax, 4.2, title, f"p99 latency against offered load: {title}")


def serving_section(results: Sequence[ResultRecord], peak: Peak | None = None) -> str:
    """The serving table and one latency-against-load plot per (run, model, max batch, sequence length, dtype);
    empty without serving cells."""
    items = serving.serving_rows(results)
    if not items:
        return ""
    rows = [serving.serving_cells(item, markup=False) for item in items]
    section = extra_section("serving", serving.TITLE, serving.HEADERS, serving.RIGHT, rows, serving.LEGEND)
    groups: dict[tuple[object, ...], list[ResultRecord]] = {}
    for item in items:
        row = item.row
        groups.setdefault((row.run_id, row.model, row.batch_size, row.seq_len, row.dtype), []).append(row)
    plots = []
    for (run_id, model, batch, seq_len, dtype), members in groups.items():
        shape = f"max batch {batch}" + ("" if seq_len is None else f", seq {seq_len}")
        title = f"{model} (run {run_id}, {shape}, {dtype})"
        plots.append(f"<h3>{esc(title)}</h3>{latencyfigure(members, title)}")
    note = (
        "<p class=small>Each point: a Server-scenario load point's p99 (geometric mean over rounds; bars: the "
        "rounds' range) "
        "at its offered load; the floor (black, dashed) is the harness alone.</p>"
    )
    return section.replace("</section>", "".join(plots) + note + "</section>") if plots else section
