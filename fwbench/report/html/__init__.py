"""The self-contained HTML report: one file that works offline, plots inline as PNG data URIs.

Page order: the scope and the machine; the summary against the baseline; flags (compile health, noisy
cells, mismatches, cells that did not run); per model, heat maps of the speed-up over the baseline
(batch × sequence length, one per runtime) and latency and peak RSS against the shape (one line per
runtime, CI bands); parity; each run's environment, settings and command; the full results table. A phase
whose cells are not compared by their time per call (serving) brings its own section instead of the
summary, heat maps and line plots (:mod:`fwbench.report.phases`).

Reads store rows only (never a framework). The frame is :mod:`.page`, the table sections :mod:`.sections` and
:mod:`.results`, the plots :mod:`.figures` and :mod:`.models`, phase serving's section :mod:`.serving`, the markup
pieces (escaping, the style sheet, the Content-Security-Policy that allows nothing but inline styles and ``data:``
images) :mod:`.markup`.
"""

from fwbench.report.html.page import to_html

__all__ = ["to_html"]
