"""Achieved GFLOP/s and % of the stored peak in reports, on hand-made store rows (no worker runs)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from fwbench.report.export import to_csv, to_json
from fwbench.report.peak import PEAK_SUITE, Peak, achieved_gflops, latest_peak, peak_fraction
from fwbench.report.table import print_results
from fwbench.spec import Case, Plan, Settings
from fwbench.store import Store


def add_run(store: Store, suite: str | None, cells: list[tuple[Case, dict[str, Any]]]) -> int:
    run_id = store.create_run(Plan(tuple(c for c, _ in cells), Settings(threads=2), suite=suite), "test", {}, "0")
    for case, fields in cells:
        median = fields.get("median_s")
        store.add_result(
            run_id,
            case,
            {"status": "ok", "threads": 2, "calls_per_sample": 1, **fields},
            [] if median is None else [median],
            {},
        )
    return run_id


GEMM_FLOPS = 2 * 3072**3  # 57.98 GFLOP per call


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "db.sqlite") as opened:
        yield opened


def test_rates_and_fractions_from_stored_rows(store: Store) -> None:
    # An old peak run (200 GFLOP/s), then a newer one: torch 0.4 s (145 GFLOP/s), tensorflow 0.25 s (232).
    add_run(
        store,
        PEAK_SUITE,
        [(Case("gemm", "torch:eager", batch_size=3072), {"flops": GEMM_FLOPS, "median_s": GEMM_FLOPS / 200e9})],
    )
    newer = add_run(
        store,
        PEAK_SUITE,
        [
            (Case("gemm", "torch:eager", batch_size=3072), {"flops": GEMM_FLOPS, "median_s": 0.4}),
            (Case("gemm", "tensorflow:function", batch_size=3072), {"flops": GEMM_FLOPS, "median_s": 0.25}),
        ],
    )
    sweep = add_run(
        store,
        None,
        [
            (
                Case("mlp", "torch:eager", batch_size=256),
                {"flops": 4_700_000, "median_s": 5e-5, "ci_low_s": 4.9e-5, "ci_high_s": 5.1e-5},
            ),
            (Case("mlp", "torch:eager", batch_size=1), {"flops": 17_664, "median_s": None, "status": "oom"}),
        ],
    )
    peak = latest_peak(store)
    assert peak == Peak(GEMM_FLOPS / 0.25 / 1e9, "tensorflow:function", newer, 2, "fp32", "cpu")
    rows = store.results([sweep])
    assert achieved_gflops(rows[0]) == pytest.approx(94.0)  # 4.7e6 FLOP / 50 µs
    assert peak_fraction(rows[0], peak) == pytest.approx(94.0 / (GEMM_FLOPS / 0.25 / 1e9))  # 40.5%
    assert achieved_gflops(rows[1]) is None and peak_fraction(rows[1], peak) is None  # oom: no rate
    assert peak_fraction(replace(rows[0], dtype="bf16"), peak) is None  # an fp32 peak says nothing of bf16
    assert peak_fraction(replace(rows[0], threads=1), peak) is None  # nor of another thread count

    console = Console(record=True, width=300)
    print_results(rows, console, peak=peak)
    text = console.export_text()
    assert "GFLOP/s" in text and "% peak" in text and "94.0" in text and "40.5%" in text
    assert "of 232 GFLOP/s" in text and f"run {newer}" in text

    data = json.loads(to_json(store.runs([sweep]), rows, peak))
    assert data["peak"]["runtime"] == "tensorflow:function" and data["peak"]["gflops"] == pytest.approx(231.9, 1e-3)
    assert data["results"][0]["achieved_gflops"] == pytest.approx(94.0)
    assert data["results"][0]["peak_fraction"] == pytest.approx(0.4053, 1e-3)
    assert data["results"][1]["achieved_gflops"] is None
    table = list(csv.DictReader(io.StringIO(to_csv(rows, peak))))
    assert float(table[0]["achieved_gflops"]) == pytest.approx(94.0)
    assert float(table[0]["peak_fraction"]) == pytest.approx(0.4053, 1e-3)
    assert table[1]["achieved_gflops"] == "" and table[1]["peak_fraction"] == ""


def test_no_peak_means_no_peak_column(store: Store) -> None:
    run = add_run(store, None, [(Case("mlp", "torch:eager"), {"flops": 1000, "median_s": 1e-6})])
    assert latest_peak(store) is None
    rows = store.results([run])
    console = Console(record=True, width=300)
    print_results(rows, console, peak=latest_peak(store))
    text = console.export_text()
    assert "GFLOP/s" in text and "1.00" in text and "% peak" not in text
    data = json.loads(to_json([], rows, None))
    assert set(data) == {"runs", "results"} and "peak_fraction" not in data["results"][0]
    assert data["results"][0]["achieved_gflops"] == pytest.approx(1.0)


def test_a_failed_peak_run_does_not_hide_an_earlier_peak(store: Store) -> None:
    first = add_run(
        store, PEAK_SUITE, [(Case("gemm", "jax:jit", batch_size=3072), {"flops": GEMM_FLOPS, "median_s": 0.5})]
    )
    add_run(
        store,
        PEAK_SUITE,
        [(Case("gemm", "jax:jit", batch_size=3072), {"flops": GEMM_FLOPS, "median_s": None, "status": "timeout"})],
    )
    peak = latest_peak(store)
    assert peak is not None and peak.run_id == first and peak.gflops == pytest.approx(GEMM_FLOPS / 0.5 / 1e9)
