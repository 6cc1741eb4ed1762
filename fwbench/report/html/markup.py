"""The HTML report's markup pieces: escaping, tables, folded lists, the page's style sheet and its
Content-Security-Policy (nothing but inline styles and ``data:`` images). Every string from the store goes through
:func:`esc` (:func:`html.escape`, quotes too)."""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from typing import Any

from fwbench.spec import shape_text
from fwbench.store import ResultRecord

COLLAPSE_ROWS = 12  # flag lists longer than this start folded
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"
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


def ratio_text(value: float | None) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.3g}×"


def table(
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


def maybe_fold(title: str, cells: int, rows: int, body: str) -> str:
    """A titled flag list (``cells`` cells in ``rows`` table rows), folded when it is long."""
    if cells == 0:
        return f"<h3>{title}: none</h3>"
    count = f"{cells} cell{'s' if cells != 1 else ''}"
    if rows > COLLAPSE_ROWS:
        return f"<details><summary>{title}: {count} (click to show)</summary>{body}</details>"
    return f"<h3>{title}: {count}</h3>{body}"


def extra_section(
    anchor: str, title: str, headers: Sequence[str], right: frozenset[str], rows: list[list[str]], legend: str
) -> str:
    """A section of one extra table (plain cells, escaped here) with its legend; empty without rows. Numeric
    columns: those in ``right`` and the ratio columns (speed-up, efficiency)."""
    if not rows:
        return ""
    numeric = [i for i, h in enumerate(headers) if h in right or h.startswith(("speed-up", "efficiency"))]
    return (
        f'<section id="{anchor}"><h2>{esc(title)}</h2>'
        + table(list(headers), [[esc(cell) for cell in row] for row in rows], numeric=numeric, css=anchor)
        + f"<p class=small>{esc(legend)}</p></section>"
    )


def value_html(value: Any) -> str:
    if isinstance(value, (dict, list, tuple)):
        return f"<code>{esc(json.dumps(value, sort_keys=True, default=str))}</code>"
    return esc(value)


def cell_label(row: ResultRecord, multi_run: bool) -> list[str]:
    return ([esc(row.run_id)] if multi_run else []) + [
        esc(row.model),
        esc(row.runtime),
        esc(shape_text(row.batch_size, row.seq_len, row.workers, row.procs, row.scaling)),
    ]


def document(title: str, body: str, style: str = "") -> str:
    """A whole page: ``body`` (HTML) under the report's Content-Security-Policy and style sheet (plus ``style``)."""
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{CSS}{style}</style></head><body>\n{body}\n</body></html>\n"
    )
