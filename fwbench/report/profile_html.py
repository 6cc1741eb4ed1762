"""``fwbench report --profile --html FILE``: one self-contained page with a profile run's tables (the same rows as
the terminal's, :mod:`fwbench.report.profile_table`), the run's settings and environment."""

from __future__ import annotations

from collections.abc import Sequence

from fwbench.report.html.markup import document, esc, table
from fwbench.report.html.sections import environment_section
from fwbench.report.profile_table import (
    CATEGORY_SECTION_ENDS,
    TOP_OP_HEADERS,
    ProfileGroup,
    category_rows,
    top_op_rows,
    uncategorized_lines,
)
from fwbench.store import RunRecord


def group_section(group: ProfileGroup) -> str:
    """One model × shape: the category table, each runtime's top ops (folded) and the op names in ``other``."""
    headers, rows = category_rows(group)
    classes = ["end" if index + 1 in CATEGORY_SECTION_ENDS else "" for index in range(len(rows))]
    parts = [
        f"<h3>{esc(group.title)}</h3>",
        table([esc(h) for h in headers], [[esc(v) for v in row] for row in rows], range(1, len(headers)), classes),
    ]
    for runtime, cell in group.cells.items():
        if isinstance(cell, str):
            continue
        ops = table(list(TOP_OP_HEADERS), [[esc(v) for v in row] for row in top_op_rows(cell)], (2, 3))
        parts.append(
            f"<details><summary>{esc(runtime)}: top ops by self time</summary>{ops}"
            f"<p class=small>trace <code>{esc(cell.trace)}</code> ({esc(cell.profiler)})</p></details>"
        )
    parts.extend(f"<p class=small>{esc(line)}</p>" for line in uncategorized_lines(group))
    return "\n".join(parts)


def profile_page(run: RunRecord, groups: Sequence[ProfileGroup], source: str) -> str:
    """The whole page (UTF-8 text) for profile run ``run`` of the database ``source``."""
    body = "\n".join(
        [
            f"<h1>fwbench profiles</h1><p class=scope>Profile run {esc(run.id)} in <code>{esc(source)}</code>, "
            f"{esc(run.created)}: <code>{esc(run.command)}</code>. Self time per op category and per profiled call "
            "(share of the call's wall time), busy time (the union of the op intervals), framework overhead (wall "
            "time outside every op) and the profiler's own overhead.</p>",
            '<section id="profiles"><h2>Profiles side by side</h2>',
            *(group_section(group) for group in groups),
            "</section>",
            environment_section([run]),
        ]
    )
    return document("fwbench profiles", body, "tr.end td{border-bottom:2px solid #999}")
