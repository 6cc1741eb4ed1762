"""The HTML report: escaping, offline-only references, inline plots, the CLI flag, and a real browser."""

from __future__ import annotations

import base64
import html.parser
import re
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fwbench.cli import main
from fwbench.frameworks import runtimes
from fwbench.report.html import figures as html_figures
from fwbench.report.html import markup, models, page, to_html
from fwbench.runner.scheduler import group_key
from fwbench.spec import Case, Plan, Settings
from fwbench.speedups import GroupedPair, compare_cells, grouped_pairs, split_groups
from fwbench.store import ResultRecord, Store
from headless_chromium import chromium_path, inspect_page
from report_store import Cell, add_run, blocks_of, timed

HOSTILE_MODEL = 'bert<&>"x'
SCRIPT_REASON = "<script>alert(1)</script> & more"
HOSTILE_CPU = "<img src=x onerror=alert(1)>"
ALLOWED_TAGS = {
    "html",
    "head",
    "meta",
    "title",
    "style",
    "body",
    "h1",
    "h2",
    "h3",
    "p",
    "nav",
    "a",
    "section",
    "table",
    "thead",
    "tbody",
    "tr",
    "th",
    "td",
    "img",
    "details",
    "summary",
    "code",
    "b",
    "i",
    "em",
    "span",
    "br",
    "div",
}


def _samples(rng: np.random.Generator, median: float, n: int) -> list[float]:
    return [float(v) for v in median * rng.lognormal(0.0, 0.02, n)]


def _fields(samples: list[float], **extra: Any) -> dict[str, Any]:
    ordered = sorted(samples)
    return {
        "status": "ok",
        "protocol": "adaptive",
        "calls_per_sample": 4,
        "median_s": float(np.median(ordered)),
        "ci_low_s": ordered[len(ordered) // 4],
        "ci_high_s": ordered[-len(ordered) // 4],
        "mean_s": float(np.mean(ordered)),
        "min_s": ordered[0],
        "first_call_s": 0.01,
        "peak_memory_bytes": 300 * 2**20,
        "threads": 2,
        "interop_threads": 1,
        "flops": 10**6,
        "wall_s": 1.0,
        **extra,
    }


def make_store(path: Path) -> Path:
    """One run: ``mlp`` (no sequence axis) and a model with a hostile name (batch × seq), three runtimes,
    an oom with a <script> reason, a parity mismatch, a compile-health flag, a noisy cell, small sample
    counts and large ones, each in three interleaved rounds."""
    rng = np.random.default_rng(7)
    runtimes = ("torch:eager", "jax:jit", "tensorflow:function")
    cases = [Case("mlp", rt, batch_size=b) for rt in runtimes for b in (1, 4, 16)]
    cases += [Case(HOSTILE_MODEL, rt, batch_size=b, seq_len=s) for rt in runtimes for b in (1, 2) for s in (16, 32)]
    plan = Plan(cases=tuple(cases), settings=Settings(threads=2))
    environment = {"cpu_model": HOSTILE_CPU, "physical_cores": 2, "version_torch": "2.13.0 & <co>"}
    speed = {"torch:eager": 1.0, "jax:jit": 0.5, "tensorflow:function": 1.3}
    with Store.open(path) as store:
        run_id = store.create_run(plan, "fwbench run --models 'a&b' <x>", environment, "0.1.0")
        first: set[tuple[str, str]] = set()
        for case in cases:
            details: dict[str, Any] = {}
            if (case.model, case.runtime) not in first:
                first.add((case.model, case.runtime))
                bad = case.model == HOSTILE_MODEL and case.runtime == "tensorflow:function"
                details["parity"] = {
                    "ok": not bad,
                    "reference": "numpy-float64",
                    "tolerance_rel_l2": 1e-4,
                    "shape": [2, 16],
                    "outputs": {"<logits>": {"rel_l2": 0.3 if bad else 1e-7, "max_abs": 1e-6}},
                }
            if case.model == HOSTILE_MODEL and case.runtime == "tensorflow:function":
                store.add_result(run_id, case, {"status": "mismatch", "reason": "outputs <differ> & fail"}, [], details)
                continue
            if (
                case.model == HOSTILE_MODEL
                and case.runtime == "jax:jit"
                and case.batch_size == 2
                and case.seq_len == 32
            ):
                store.add_result(
                    run_id, case, {"status": "oom", "reason": SCRIPT_REASON, "peak_memory_bytes": 2**31}, [], details
                )
                continue
            n = 6 if case.batch_size == 1 else 30
            samples = _samples(rng, 1e-4 * speed[case.runtime] * case.batch_size * (case.seq_len or 1), n)
            extra: dict[str, Any] = {}
            if case.runtime == "jax:jit" and case.model == "mlp" and case.batch_size == 4:
                details["compile_health"] = {"flags": ["traces +3 in timed loop <i>"]}
            if case.runtime == "tensorflow:function" and case.batch_size == 16:
                extra = {"ci_low_s": samples[0] * 0.5, "ci_high_s": samples[0] * 1.5}  # noisy
            extra.update(group_key=group_key(case), schedule="interleaved", rounds=3)
            store.add_result(run_id, case, _fields(samples, **extra), samples, details, blocks_of(samples, 3, 1))
        store.finish_run(run_id)
    return path


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return make_store(tmp_path / "report.db")


def page_of(path: Path, baseline: str = "torch:eager") -> str:
    with Store.open(path, readonly=True) as store:
        return to_html(store.runs(), store.results(), baseline=baseline, source=str(path))


class Tags(html.parser.HTMLParser):
    """Every start tag with its attributes, and the text of <td> cells of the last table."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def tags_of(page: str) -> list[tuple[str, dict[str, str | None]]]:
    parser = Tags()
    parser.feed(page)
    return parser.tags


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk; AssertionError if ``data`` is not a PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_store_strings_are_escaped(store_path: Path) -> None:
    page = page_of(store_path)
    for raw in (
        SCRIPT_REASON,
        HOSTILE_MODEL,
        HOSTILE_CPU,
        "outputs <differ>",
        "traces +3 in timed loop <i>",
        "'a&b' <x>",
        "<logits>",
        "<co>",
    ):
        assert raw not in page, raw
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; more" in page
    assert "bert&lt;&amp;&gt;&quot;x" in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    tags = tags_of(page)
    assert {tag for tag, _ in tags} <= ALLOWED_TAGS, {tag for tag, _ in tags} - ALLOWED_TAGS
    assert not [attrs for _, attrs in tags if any(name.startswith("on") for name in attrs)]


def test_page_has_no_network_references(store_path: Path) -> None:
    page = page_of(store_path)
    text = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", page)
    assert not re.search(r"(?i)https?:|ftp:|//[a-z0-9]", text), "network reference"
    assert "@import" not in page and "url(" not in page
    for tag, attrs in tags_of(page):
        assert (attrs.get("src") or "data:").startswith("data:"), (tag, attrs)
        assert (attrs.get("href") or "#").startswith("#"), (tag, attrs)
    csp = [a["content"] for t, a in tags_of(page) if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    assert csp == [markup.CSP] and "default-src 'none'" in markup.CSP


def test_plots_are_inline_png_data(store_path: Path) -> None:
    images = [attrs for tag, attrs in tags_of(page_of(store_path)) if tag == "img"]
    # per model group: one heat-map figure and one latency/memory figure
    assert len(images) == 4
    for attrs in images:
        src = attrs["src"] or ""
        assert src.startswith("data:image/png;base64,")
        width, height = png_size(base64.b64decode(src.split(",", 1)[1], validate=True))
        assert width > 200 and height > 100
        assert attrs.get("alt")


def test_page_sections_and_full_table(store_path: Path) -> None:
    page = page_of(store_path)
    with Store.open(store_path, readonly=True) as store:
        n_results = len(store.results())
    for anchor in ("summary", "flags", "models", "parity", "environment", "results"):
        assert f'<section id="{anchor}">' in page
    table = page[page.index('<section id="results">') :]
    assert table.count("<tr") - 1 == n_results  # one header row + one row per stored cell
    assert "N/A" in table and "<b>oom</b>" in table and "<b>mismatch</b>" in table
    flags = page[page.index('<section id="flags">') : page.index('<section id="models">')]
    assert "Parity mismatches" in flags and "4 cells" in flags  # the four mismatch cells of one runtime
    assert "Noisy cells" in flags and "traces +3 in timed loop &lt;i&gt;" in flags
    assert "<b>MISMATCH</b>" in page[page.index('<section id="parity">') :]
    summary = page[page.index('<section id="summary">') : page.index('<section id="flags">')]
    assert "jax:jit" in summary and "tensorflow:function" in summary and "1 oom" in summary


def test_plot_limits_say_what_is_summarised(store_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(models, "MAX_PLOT_GROUPS", 1)
    monkeypatch.setattr(html_figures, "MAX_LINE_PANELS", 1)
    page = page_of(store_path)
    assert "Plots for the first 1 of 2 model groups" in page
    assert "Panels for 1 of 2 sequence lengths (16)" not in page  # the hostile model's group is not plotted
    assert len([t for t, _ in tags_of(page) if t == "img"]) == 2
    with Store.open(store_path, readonly=True) as store:
        n_results = len(store.results())
    table = page[page.index('<section id="results">') :]
    assert table.count("<tr") - 1 == n_results
    monkeypatch.setattr(models, "MAX_PLOT_GROUPS", 2)
    assert "Panels for 1 of 2 sequence lengths (16)" in page_of(store_path)


def test_page_comparisons_are_the_summary_modules(store_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The page's comparisons are summary.grouped_pairs: per group the same cells as compare_cells, with their
    round-level CIs."""
    with Store.open(store_path, readonly=True) as store:
        results = store.results()
    pairs = grouped_pairs(results, "torch:eager")
    assert len(pairs) == 2
    groups = split_groups(results)
    for pair in pairs:
        assert pair.cells == compare_cells(
            groups[(pair.run_id, pair.hardware_id, pair.phase, pair.dtype, pair.device)],
            "torch:eager",
            pair.cells[0].runtime,
        )
    assert any(c.ci_low is not None for pair in pairs for c in pair.cells)
    seen: list[str] = []
    real = page.grouped_pairs

    def spied(rows: Sequence[ResultRecord], baseline: str) -> list[GroupedPair]:
        seen.append(baseline)
        return real(rows, baseline)

    monkeypatch.setattr(page, "grouped_pairs", spied)
    page_of(store_path)
    assert seen == ["torch:eager"]


def test_cli_html(store_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.html"
    assert main(["report", "--db", str(store_path), "--run", "latest", "--html", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and f"wrote {out}" in captured.err
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert main(["report", "--db", str(store_path), "--html", str(out), "--format", "csv"]) == 0
    assert capsys.readouterr().out.startswith("run_id,model,runtime")
    assert main(["report", "--db", str(store_path), "--html", str(out), "--baseline", "jax:jit"]) == 0
    assert "Baseline: <b>jax:jit</b>" in out.read_text(encoding="utf-8")
    capsys.readouterr()
    for bad, fragment in (
        (tmp_path / "missing" / "r.html", "give a file path in an existing folder"),
        (tmp_path, "give a file path in an existing folder"),
        (Path("/sys/fwbench.html"), "cannot write it"),
    ):
        assert main(["report", "--db", str(store_path), "--html", str(bad)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"--html {bad}" in err[0] and fragment in err[0], err


# -- the line plots' legends --------------------------------------------------------------------
# The registry's inference runtimes (15 of them, the deployment engines' long names among them): every label a report
# of one model's inference cells can carry.
LONG_RUNTIMES = tuple(name for name, info in runtimes().items() if "inference" in info.phases and not info.unavailable)[
    :15
]
PLUGIN_RUNTIME = "someones-plugin:an-exported-graph-with-a-very-long-name-that-one-legend-column-cannot-hold"


def figures_of(path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every matplotlib figure the page of the store at ``path`` shows, in page order (saved as the page saves them)."""
    figures: list[Any] = []
    real = html_figures.png

    def kept(fig: Any, alt: str) -> str:
        figures.append(fig)
        return real(fig, alt)

    monkeypatch.setattr(html_figures, "png", kept)
    page_of(path)
    return figures


@pytest.mark.parametrize(
    ("runtimes", "shapes"),
    [
        (LONG_RUNTIMES[:11], [(1, 128)]),  # one panel: the narrowest figure, which cut the names off
        (LONG_RUNTIMES, [(b, s) for b in (1, 8) for s in (16, 128, 512)]),
        (LONG_RUNTIMES[:3], [(b, s) for b in (1, 2, 4, 8, 16, 32, 64, 128) for s in (16, 32, 64, 128, 256, 512)]),
        ((*LONG_RUNTIMES[:4], PLUGIN_RUNTIME), [(1, 128)]),  # wider than the figure even in one column
    ],
    ids=["11-runtimes-1-cell", "15-runtimes-6-cells", "3-runtimes-48-cells", "long-name"],
)
def test_legends_lie_inside_their_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runtimes: tuple[str, ...], shapes: list[tuple[int, int]]
) -> None:
    """Each line plot's legend names every runtime once and lies inside its figure, below the x-axis labels,
    whatever the number of runtimes and the length of their names; no two runtimes' lines look alike."""
    cells = [
        Cell(Case("bert-base", runtime, batch_size=b, seq_len=s), timed(1e-3 * (i + 1) * b, 9, seed=i))
        for i, runtime in enumerate(runtimes)
        for b, s in shapes
    ]
    with Store.open(tmp_path / "long.db") as store:
        add_run(store, cells)
    figures = figures_of(tmp_path / "long.db", monkeypatch)
    assert len(figures) == 2 and not figures[0].legends and len(figures[1].legends) == 1  # heat maps, lines
    for fig in figures:
        renderer = fig.canvas.get_renderer()
        page = fig.bbox
        for legend in fig.legends:
            assert [t.get_text() for t in legend.get_texts()] == list(runtimes)
            box = legend.get_window_extent(renderer)
            assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1, (
                box.bounds,
                page.bounds,
            )
            labels_bottom = min(ax.get_tightbbox(renderer).y0 for ax in fig.axes if ax.get_visible())
            assert box.y1 <= labels_bottom, (box.bounds, labels_bottom)  # below the axes and their labels
            looks = [(line.get_color(), line.get_linestyle(), line.get_marker()) for line in legend.get_lines()]
            assert len(set(looks)) == len(looks), looks


# -- a real browser ---------------------------------------------------------------------------
needs_chromium = pytest.mark.skipif(
    chromium_path() is None,
    reason="chromium is not installed (Debian: apt-get "
    "install chromium; .ci/run installs it): the real-browser check cannot run",
)


@needs_chromium
def test_report_renders_in_chromium(store_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    assert main(["report", "--db", str(store_path), "--html", str(out)]) == 0
    screenshot = tmp_path / "report.png"
    page = inspect_page(out, screenshot, str(chromium_path()))
    assert page.errors == []
    assert page.title == "fwbench report" and "Summary against the baseline" in page.body_text
    assert len(page.images) == 4
    for image in page.images:
        assert image["complete"] and image["decodeError"] is None and image["scheme"] == "data", image
        assert image["naturalWidth"] > 200 and image["naturalHeight"] > 100, image
        assert image["visible"] and image["width"] > 200 and image["height"] > 100, image  # laid out, not hidden
    assert png_size(screenshot.read_bytes()) == (1280, 900)
    assert png_size((tmp_path / "report-first-plot.png").read_bytes()) == (1280, 900)


@needs_chromium
def test_browser_check_catches_errors_and_broken_images(tmp_path: Path) -> None:
    """The probe is able to fail: a page with a thrown error, console.error, a blocked network image and
    a corrupt PNG must be reported as such."""
    scripted = tmp_path / "scripted.html"
    scripted.write_text(
        "<!DOCTYPE html><html><head><title>t</title></head><body><p>x</p>"
        "<script>console.error('boom'); throw new Error('kaboom');</script></body></html>"
    )
    page = inspect_page(scripted, tmp_path / "scripted.png", str(chromium_path()))
    assert any("boom" in e for e in page.errors) and any("kaboom" in e for e in page.errors), page.errors
    locked = tmp_path / "locked.html"
    locked.write_text(
        f'<!DOCTYPE html><html><head><meta http-equiv="Content-Security-Policy" '
        f'content="{markup.CSP}"><title>t</title></head><body>'
        '<img alt="net" src="http://127.0.0.1:9/x.png">'
        '<img alt="corrupt" src="data:image/png;base64,iVBORw0KGgoAAAANSUhEUg==">'
        "<script>document.title = 'ran'</script></body></html>"
    )
    page = inspect_page(locked, tmp_path / "locked.png", str(chromium_path()))
    assert page.title == "t"  # the inline script was blocked by the report's policy ...
    assert len(page.errors) >= 2, page.errors  # ... and so was the network image, both reported
    assert [i["naturalWidth"] for i in page.images] == [0, 0]
    assert all(i["decodeError"] for i in page.images)
