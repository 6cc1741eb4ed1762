"""The HTML report's generate section (phase generate's own): the generation table (:mod:`fwbench.report.generation`)
and, per run, model and shape, each runtime's decode latency against the position in the sequence (the median over
each round's timed generations, then the geometric mean over rounds; the bars the rounds' range), its time to the
first token marked at the prompt's last position."""

from __future__ import annotations

import math
from collections.abc import Sequence

import matplotlib

from fwbench.report import generation
from fwbench.report.html.figures import LINES_RC, figure, finished_lines, mpl_text, runtime_styles
from fwbench.report.html.markup import esc, extra_section
from fwbench.report.peak import Peak
from fwbench.store import ResultRecord


def position_curve(item: generation.GenerationRow) -> list[tuple[int, float, float, float]]:
    """(position, geometric mean over rounds, min, max) of the decode latency at each decode position, seconds."""
    rounds = [r.decode_step_s_by_position for r in item.details.rounds if r.decode_step_s_by_position]
    start = item.details.prompt_len or item.row.seq_len or 0
    curve = []
    for offset, values in enumerate(zip(*rounds, strict=False)):
        positive = [v for v in values if v > 0]
        if positive:
            centre = math.exp(sum(math.log(v) for v in positive) / len(positive))
            curve.append((start + offset, centre, min(positive), max(positive)))
    return curve


def decode_figure(items: Sequence[generation.GenerationRow], title: str) -> str:
    """Decode latency (ms) against the position in the sequence, one line per runtime."""
    styles = runtime_styles([item.row.runtime for item in items])
    with matplotlib.rc_context(LINES_RC):
        fig = figure(7.0, 4.0, layout=None)
        ax = fig.add_subplot(1, 1, 1)
        for item in items:
            curve = position_curve(item)
            if not curve:
                continue
            style = styles[item.row.runtime]
            xs, ys = [c[0] for c in curve], [c[1] * 1e3 for c in curve]
            errors = [[max(0.0, c[1] - c[2]) * 1e3 for c in curve], [max(0.0, c[3] - c[1]) * 1e3 for c in curve]]
            ax.errorbar(
                xs, ys, yerr=errors, label=mpl_text(item.row.runtime), markersize=3, linewidth=1.2, capsize=2,
                color=style["color"], linestyle=style["linestyle"], marker=style["marker"],
            )  # fmt: skip
        ax.set_yscale("log")
        ax.set_xlabel(
            "position of the decode step's input token (the prompt fills the positions before it)", fontsize=8
        )
        ax.set_ylabel("decode latency per token, ms", fontsize=8)
        return finished_lines(fig, ax, 4.0, title, f"decode latency against the position: {title}")


def generation_section(results: Sequence[ResultRecord], peak: Peak | None = None) -> str:
    """The generation table and one decode-latency plot per (run, model, batch, prompt, dtype); empty without
    generate cells."""
    items = generation.generation_rows(results, peak)
    if not items:
        return ""
    rows = [generation.generation_cells(item, markup=False) for item in items]
    section = extra_section("generate", generation.TITLE, generation.HEADERS, generation.RIGHT, rows, generation.LEGEND)
    groups: dict[tuple[object, ...], list[generation.GenerationRow]] = {}
    for item in items:
        row = item.row
        groups.setdefault((row.run_id, row.model, row.batch_size, row.seq_len, row.dtype), []).append(item)
    plots = [
        f"<h3>{esc(title)}</h3>{decode_figure(members, title)}"
        for (run_id, model, batch, prompt, dtype), members in groups.items()
        for title in [f"{model} (run {run_id}, batch {batch}, prompt {prompt}, {dtype})"]
    ]
    note = "<p class=small>Each point: the median decode latency at that position over a round's timed generations, "
    note += "the geometric mean over rounds (bars: the rounds' range).</p>"
    return section.replace("</section>", "".join(plots) + note + "</section>")
