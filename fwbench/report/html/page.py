"""The HTML report's frame: the header (scope, machine, what was measured), the navigation and the sections in
page order, each given the rows of the phases that have it (:mod:`fwbench.report.phases`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from fwbench.report.html.generation import generation_section
from fwbench.report.html.markup import document, esc
from fwbench.report.html.models import models_section
from fwbench.report.html.results import results_section
from fwbench.report.html.sections import (
    environment_section,
    flags_section,
    kernels_section,
    parity_section,
    reduced_precision_section,
    scaling_section,
    summary_section,
)
from fwbench.report.html.serving import serving_section
from fwbench.report.peak import Peak
from fwbench.report.phases import compared_rows, section_rows, sections_of
from fwbench.report.walltime import rounds_stop_line, wall_time, wall_time_line
from fwbench.speedups import cell_key, grouped_pairs, runtimes_in
from fwbench.store import ResultRecord, RunRecord


def _machine(runs: Sequence[RunRecord]) -> str:
    """The last run's machine, thread budget, protocol and versions (a paragraph; empty without runs)."""
    if not runs:
        return ""
    env, settings = runs[-1].environment, runs[-1].settings
    versions = ", ".join(
        f"{esc(k.removeprefix('version_'))} {esc(v)}" for k, v in sorted(env.items()) if k.startswith("version_") and v
    )
    return (
        f"<p class=small>Machine (run {esc(runs[-1].id)}): {esc(env.get('cpu_model'))}, "
        f"{esc(env.get('physical_cores'))} physical cores, {esc(env.get('cpu_simd_flags'))}; "
        f"threads {esc(settings.get('threads'))}, protocol {esc(settings.get('protocol'))}; {versions}.</p>"
    )


def _header(
    runs: Sequence[RunRecord],
    results: Sequence[ResultRecord],
    baseline: str | None,
    source: str | None,
    anchors: Sequence[tuple[str, str]],
) -> str:
    """The title, the scope (results, runs, models, runtimes, the baseline where speed-ups are shown), the machine,
    what the run measured, and a link to each of the page's ``anchors`` ((id, label) of its sections)."""
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    status_text = ", ".join(f"{n} {esc(s)}" for s, n in sorted(counts.items())) or "none"
    models = ", ".join(esc(m) for m in dict.fromkeys(r.model for r in results)) or "none"
    runtimes = ", ".join(esc(r) for r in runtimes_in(results)) or "none"
    run_text = ", ".join(esc(r.id) for r in runs) or "none"
    where = f" in <code>{esc(source)}</code>" if source else ""
    compared = f" Baseline: <b>{esc(baseline)}</b>." if baseline is not None else ""
    measured_html = "".join(
        f"<p class=small>{esc(line[0].upper() + line[1:])}.</p>"
        for line in (wall_time_line(wall_time(results)), rounds_stop_line(results))
        if line
    )
    links = "".join(f'<a href="#{anchor}">{esc(label)}</a>' for anchor, label in anchors)
    generated = datetime.now(UTC).isoformat(timespec="seconds")
    return (
        f"<h1>fwbench report</h1><p class=scope>{len(results)} results ({status_text}) of run(s) {run_text}"
        f"{where}. Models: {models}. Runtimes: {runtimes}.{compared}</p>{_machine(runs)}{measured_html}"
        f"<nav class=small>{links}</nav><p class='small muted'>Generated {esc(generated)}; self-contained (no network "
        "references).</p>"
    )


# A phase's own section of the page, by the name the phase gives it (fwbench.report.phases): its rows → HTML.
PHASE_SECTIONS: dict[str, Callable[[Sequence[ResultRecord], Peak | None], str]] = {
    "serving": serving_section,
    "generate": generation_section,
}


def to_html(
    runs: Sequence[RunRecord],
    results: Sequence[ResultRecord],
    *,
    baseline: str | None,
    peak: Peak | None = None,
    source: str | None = None,
) -> str:
    """The whole report as one HTML document (UTF-8 text). ``baseline`` is the runtime speed-ups are
    relative to (None: no comparison); ``source`` names the database in the header. The summary, the per-model plots
    and the speed-up column cover the rows of the phases compared by speed-up; each phase's own section gets its
    phase's rows; flags, parity, environment and the results table cover every row."""
    compared = compared_rows(results)
    shown = baseline if compared else None
    comparisons = grouped_pairs(compared, shown) if shown is not None else []
    ratios = {(cell.runtime, *cell_key(cell)): cell for pair in comparisons for cell in pair.cells}
    multi_run = len({r.run_id for r in results}) > 1
    sections: list[tuple[str, str, str]] = []  # (anchor, navigation label, HTML)
    if compared:
        sections.append(("summary", "summary", summary_section(comparisons, baseline, compared)))
    sections += [
        ("reduced-precision", "", reduced_precision_section(results)),
        ("scaling", "", scaling_section(results)),
    ]
    sections += [
        (name, name, PHASE_SECTIONS[name](section_rows(results, name), peak))
        for name in sections_of(results)
        if name in PHASE_SECTIONS
    ]
    sections.append(("flags", "flags", flags_section(results, multi_run)))
    if compared:
        sections.append(("models", "per model", models_section(compared, comparisons, baseline)))
    sections += [
        ("parity", "parity", parity_section(results, multi_run)),
        ("kernels", "kernel libraries", kernels_section(results)),
        ("environment", "environment", environment_section(runs)),
        ("results", "all results", results_section(results, ratios, shown, peak)),
    ]
    anchors = [(anchor, label) for anchor, label, html in sections if label and html]
    body = "\n".join([_header(runs, results, shown, source, anchors), *(html for _, _, html in sections if html)])
    return document("fwbench report", body)
