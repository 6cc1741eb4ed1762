"""Phase fit's overhead table: each high-level training API's per-epoch median against the manual loop in the
same framework (keras:torch and torch:lightning vs torch:eager, keras:tensorflow vs tensorflow:function, keras:jax
vs jax:jit), and every loop's final loss/accuracy against torch:eager's manual loop (fwbench.models.fit's
tolerance). Framework-free: it reads stored rows only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.markup import escape

from fwbench.frameworks import native_runtimes
from fwbench.models.fit import FIT_ACCURACY_ATOL, FIT_LOSS_RTOL, agreement
from fwbench.store import FitDetails, ResultRecord
from fwbench.units import format_seconds

# The manual loop of each framework a high-level API runs on (its native runtime, from the registry, which
# imports no framework); a keras:X runtime runs on framework X.
MANUAL_LOOPS = {runtime.split(":")[0]: runtime for runtime in native_runtimes()}
REFERENCE_LOOP = "torch:eager"  # final losses are compared with this one's
HEADERS = [
    "batch",
    "runtime",
    "loop",
    "per-epoch median",
    "vs manual loop",
    "per-step overhead",
    "epoch 1",
    "input wait",
    "final loss",
    "accuracy",
    "Δloss vs torch:eager",
    "agrees",
]
RIGHT = frozenset(
    {
        "batch",
        "per-epoch median",
        "vs manual loop",
        "per-step overhead",
        "epoch 1",
        "input wait",
        "final loss",
        "accuracy",
        "Δloss vs torch:eager",
    }
)


def engine(runtime: str) -> str:
    """The framework that executes ``runtime``'s loop: keras:X → X, else the runtime's own framework."""
    framework, mode = runtime.split(":", 1)
    return mode if framework == "keras" else framework


def _fit(row: ResultRecord) -> FitDetails:
    """The fit details of a row :func:`fit_rows` kept."""
    assert row.fit is not None
    return row.fit


def _group_key(row: ResultRecord) -> tuple[Any, ...]:
    fit = _fit(row)
    return (row.run_id, row.model, row.batch_size, row.dtype, row.device, fit.epochs, fit.samples)


def fit_rows(results: Sequence[ResultRecord]) -> list[ResultRecord]:
    """The ok phase-fit rows with their fit details."""
    return [r for r in results if r.status == "ok" and r.fit is not None]


def overhead_tables(results: Sequence[ResultRecord]) -> list[dict[str, Any]]:
    """One table per (run, model) as plain data: ``title`` and ``rows`` of dicts (keys: HEADERS, raw values).
    A high-level API row has ``ratio`` = its per-epoch median / the manual loop's (>1: slower)."""
    rows = fit_rows(results)
    tables: dict[tuple[Any, ...], dict[str, Any]] = {}
    groups: dict[tuple[Any, ...], list[ResultRecord]] = {}
    for row in rows:
        groups.setdefault(_group_key(row), []).append(row)
    for key, members in groups.items():
        run_id, model, batch, dtype, device, epochs, samples = key
        by_runtime = {r.runtime: r for r in members}
        reference = by_runtime.get(REFERENCE_LOOP)
        table = tables.setdefault(
            (run_id, model),
            {
                "title": f"phase fit: high-level API vs manual loop, {model} (run {run_id}, {dtype}, {device}, "
                f"{epochs} epochs × {samples} samples)",
                "rows": [],
            },
        )
        order = sorted(
            members,
            key=lambda r: (
                list(MANUAL_LOOPS).index(engine(r.runtime)) if engine(r.runtime) in MANUAL_LOOPS else 99,
                r.runtime not in MANUAL_LOOPS.values(),
                r.runtime,
            ),
        )
        for row in order:
            fit = _fit(row)
            final = {"loss": fit.final_loss, "accuracy": fit.final_accuracy}
            manual_name = MANUAL_LOOPS.get(engine(row.runtime))
            manual = by_runtime.get(manual_name) if manual_name else None
            is_manual = row.runtime == manual_name
            ratio = step_overhead = None
            if manual is not None and not is_manual and manual.median_s and row.median_s is not None:
                ratio = row.median_s / manual.median_s
                step_overhead = (row.median_s - manual.median_s) / fit.steps_per_epoch
            agree = None
            waits = fit.extra.get("input")
            wait = waits.get("wait_fraction") if isinstance(waits, dict) else None
            if reference is not None and not isinstance(waits, dict):  # from images: each its own crops
                ref = _fit(reference)
                agree = agreement(final, {"loss": ref.final_loss, "accuracy": ref.final_accuracy}, model)
            table["rows"].append(
                {
                    "batch": batch,
                    "framework": engine(row.runtime),
                    "runtime": row.runtime,
                    "loop": fit.loop,
                    "per-epoch median": row.median_s,
                    "ratio": ratio,
                    "manual": manual_name,
                    "is_manual": is_manual,
                    "per-step overhead": step_overhead,
                    "epoch 1": row.first_call_s,
                    "input wait": wait,
                    "final loss": fit.final_loss,
                    "accuracy": fit.final_accuracy,
                    "agreement": agree,
                }
            )
    return list(tables.values())


def _ratio_text(entry: dict[str, Any]) -> str:
    if entry["is_manual"]:
        return "manual loop"
    if entry["ratio"] is None:
        return f"— (no {entry['manual']})" if entry["manual"] else "—"
    return f"{entry['ratio']:.2f}×"


def _overhead_text(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    return ("+" if seconds >= 0 else "−") + format_seconds(abs(seconds))


def section_ends(table: dict[str, Any]) -> set[int]:
    """Row indices after which the framework (or the batch size) changes: one section per manual loop."""
    rows = table["rows"]
    return {
        i
        for i in range(len(rows) - 1)
        if (rows[i]["batch"], rows[i]["framework"]) != (rows[i + 1]["batch"], rows[i + 1]["framework"])
    }


def fit_table_cells(table: dict[str, Any]) -> list[list[str]]:
    """The rows of one overhead table as rich-markup strings, in HEADERS order."""
    cells = []
    for e in table["rows"]:
        agree = e["agreement"]
        cells.append(
            [
                str(e["batch"]),
                escape(e["runtime"]),
                escape(e["loop"]),
                format_seconds(e["per-epoch median"]),
                _ratio_text(e),
                _overhead_text(e["per-step overhead"]),
                format_seconds(e["epoch 1"]),
                "—" if e["input wait"] is None else f"{e['input wait']:.0%}",
                f"{e['final loss']:.6g}",
                f"{e['accuracy']:.4f}",
                "—" if agree is None else f"{agree['loss_rel_diff']:.1e}",
                "—" if agree is None else ("✓" if agree["ok"] else "✗"),
            ]
        )
    return cells


LEGEND = (
    f"phase fit: one sample is one epoch (epochs 2..; epoch 1, compilation included, is 'epoch 1'); vs manual "
    f"loop: the API's per-epoch median ÷ the manual loop's in the same framework, the first row of its section "
    f"({', '.join(MANUAL_LOOPS.values())}; >1: the API is slower); "
    f"per-step overhead: the difference ÷ optimizer steps per epoch; final loss/accuracy on the whole dataset "
    f"after the last epoch; agrees: relative loss difference from torch:eager's ≤ {FIT_LOSS_RTOL:g} and "
    f"accuracy within {FIT_ACCURACY_ATOL:g}. input wait (a fit from --input images through the framework's own "
    f"loader): the share of each epoch (2..) the loop stood waiting for its next batch once a step had finished; "
    f"such fits are not compared with torch:eager's loss (each loader draws its own random crops)."
)
