"""Reports: JSON shape, CSV layout, and store strings never interpreted as markup."""

from __future__ import annotations

import csv
import io
import json

from rich.console import Console

from fwbench.report.export import CSV_COLUMNS, to_csv, to_json
from fwbench.report.table import print_results
from fwbench.report.units import format_bytes, format_seconds, parse_bytes


def row(**extra: object) -> dict[str, object]:
    base: dict[str, object] = dict(
        run_id=1, model="mlp", runtime="torch:eager", phase="inference", batch_size=2, seq_len=None,
        dtype="fp32", device="cpu", status="ok", reason=None, protocol="adaptive", n_samples=3,
        calls_per_sample=4, median_s=2e-5, ci_low_s=1.9e-5, ci_high_s=2.1e-5, mean_s=2e-5, stdev_s=1e-6,
        min_s=1.9e-5, first_call_s=0.03, peak_memory_bytes=3 * 2**20, allocator_peak_bytes=None, threads=2,
        interop_threads=1, flops=100, wall_s=1.0, samples=[1.9e-5, 2e-5, 2.1e-5], details={},
    )
    base.update(extra)
    return base


def test_units() -> None:
    assert format_seconds(2.13e-5) == "21.3 µs" and format_seconds(1.5) == "1.5 s" and format_seconds(None) == "—"
    assert format_bytes(1536) == "1.5 KiB" and format_bytes(512) == "512 B"
    assert parse_bytes("2G") == 2 * 2**30 and parse_bytes("512m") == 512 * 2**20 and parse_bytes("100") == 100


def test_csv_layout() -> None:
    text = to_csv([row(), row(status="oom", reason="killed", median_s=None, samples=[], n_samples=0)])
    rows = list(csv.reader(io.StringIO(text)))
    assert tuple(rows[0]) == CSV_COLUMNS
    first = dict(zip(rows[0], rows[1]))
    assert first["seq_len"] == "" and first["median_s"] == "2e-05" and first["samples"] == "1.9e-05 2e-05 2.1e-05"
    second = dict(zip(rows[0], rows[2]))
    assert second["status"] == "oom" and second["median_s"] == "" and second["samples"] == ""


def test_json_shape() -> None:
    data = json.loads(to_json([], [row()]))
    assert set(data) == {"runs", "results"}
    assert data["results"][0]["samples"] == [1.9e-5, 2e-5, 2.1e-5]


def test_table_shows_markup_in_reasons_literally() -> None:
    console = Console(record=True, width=300)
    print_results([row(status="error", reason="RuntimeError: [bold]boom[/bold] x[0]", median_s=None)], console)
    text = console.export_text()
    assert "[bold]boom[/bold] x[0]" in text
    assert "21.3" not in text and "error" in text
