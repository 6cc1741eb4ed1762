"""The HTML report's per-model section: per (run, model, phase, dtype, device) group, its pair summary, the heat maps
of the speed-up over the baseline and the latency and peak-RSS line plots."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fwbench.report.html.figures import heatmap_figure, lines_figure, runtime_styles
from fwbench.report.html.markup import esc, table
from fwbench.report.html.sections import SUMMARY_HEADERS, summary_rows
from fwbench.speedups import CellComparison, GroupedPair, pair_summary, runtimes_in, split_groups
from fwbench.store import ResultRecord
from fwbench.units import short_id

# one plot section per group (a distributed cell's processes and scaling: a section each)
PLOT_GROUP_FIELDS = ("run_id", "hardware_id", "model", "phase", "dtype", "device", "procs", "scaling")
MAX_PLOT_GROUPS = 24  # groups that get plots; every cell stays in the tables


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
            parts.append(table(SUMMARY_HEADERS, summary_rows(summaries, False), numeric=[1, 2, 3, 4, 5], css="pairs"))
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
