"""The tables ``fwbench verify`` prints: output parity per model × runtime × output, and (``--phase training``)
loss curves and trained parameters per model × runtime. Errors are relative L2 (max abs error in brackets).

A parity verdict judges each runtime against the float64 reference alone (the first runtime's column is shown for
information), so it does not depend on the order of ``--runtimes``; training has no float64 reference for N steps
and judges each runtime against the first runtime's run."""

from __future__ import annotations

from collections.abc import Sequence

from rich.markup import escape
from rich.table import Table

from fwbench.report.flags import error_outliers
from fwbench.runner.tolerances import TrainingTolerance
from fwbench.runner.verify import OutputCheck, TrainingCheck

PARITY_COLUMNS = ("model", "runtime", "output", "shape", "vs first runtime", "vs float64 reference", "verdict")
PARITY_LEGEND = (
    "verdict: each runtime's error against the float64 reference, whatever the order of --runtimes; "
    "'vs first runtime' is information (judged only for a model without a reference)"
)
TRAINING_COLUMNS = (
    "model",
    "runtime",
    "first loss",
    "last loss",
    "loss curve max rel",
    "params rel L2",
    "worst tensor (rel L2)",
    "verdict",
)


def _error_cell(rel_l2: float | None, max_abs: float | None) -> str:
    return "—" if rel_l2 is None else f"{rel_l2:.2e} [{max_abs:.1e}]"


def _not_ok_verdict(status: str, reason: str | None) -> str:
    """``skipped: why`` or a red ``<status>: why`` for a runtime that produced nothing to compare."""
    verdict = "skipped" if status == "skipped" else f"[red]{status}[/]"
    return f"{verdict}: {escape(reason or '')}"


def _verdict(check: OutputCheck, outlier: str | None) -> str:
    """ok, a red mismatch (its error against the float64 reference over the tolerance, :attr:`OutputCheck.passed`),
    or a yellow ``ok, but …`` when the runtime's errors set it apart from the others'."""
    if not check.passed:
        return f"[red]mismatch (> {check.tolerance:g})[/]"
    return "ok" if outlier is None else f"[yellow]ok, but {escape(outlier)}[/]"


def parity_table(dtype: str, checks: Sequence[OutputCheck]) -> Table:
    """One row per check (each a model × runtime × output, or a runtime that did not run)."""
    table = Table(
        title=f"fwbench verify, {dtype} (relative L2 error; max abs error in brackets)", caption=PARITY_LEGEND
    )
    for column in PARITY_COLUMNS:
        table.add_column(column)
    errors: dict[tuple[str, str], dict[str, float]] = {}  # (model, runtime) -> output -> error vs the reference
    for check in checks:
        if check.status == "ok" and check.output is not None and check.rel_l2_vs_reference:
            errors.setdefault((check.model, check.runtime), {})[check.output] = check.rel_l2_vs_reference
    outliers: dict[tuple[str, str], str] = {}
    for model in dict.fromkeys(check.model for check in checks):
        outliers.update(error_outliers({key: e for key, e in errors.items() if key[0] == model}, dtype))
    for check in checks:
        if check.output is None or check.status != "ok":
            table.add_row(
                check.model,
                check.runtime,
                check.output or "—",
                "—",
                "—",
                "—",
                _not_ok_verdict(check.status, check.reason),
            )
            continue
        table.add_row(
            check.model,
            check.runtime,
            check.output,
            "×".join(map(str, check.shape or ())),
            _error_cell(check.rel_l2_vs_first, check.max_abs_vs_first),
            _error_cell(check.rel_l2_vs_reference, check.max_abs_vs_reference),
            _verdict(check, outliers.get((check.model, check.runtime))),
        )
    return table


def training_table(
    dtype: str, steps: int, optimizer: str, tolerance: TrainingTolerance, checks: Sequence[tuple[str, TrainingCheck]]
) -> Table:
    """One row per (model, check): the loss curve and trained parameters against the first runtime's (``verify
    --procs``: a run of N processes against the same runtime's 1-process run)."""
    distributed = any(check.procs is not None for _, check in checks)
    against = (
        "the first runtime's 1-process run; N processes: the same runtime's 1 process"
        if distributed
        else ("the first runtime")
    )
    table = Table(
        title=f"fwbench verify --phase training, {dtype}, {steps} {optimizer} steps "
        f"(errors against {against}; limits: loss {tolerance.loss_rel:g}, parameters "
        f"{tolerance.params_rel_l2:g}, worst tensor {tolerance.tensor_rel_l2:g})"
    )
    for column in TRAINING_COLUMNS:
        table.add_column(column)
    for model, check in checks:
        runtime = check.runtime if check.procs is None else f"{check.runtime} ×{check.procs}"
        if check.status != "ok":
            table.add_row(model, runtime, "—", "—", "—", "—", "—", _not_ok_verdict(check.status, check.reason))
            continue
        table.add_row(
            model,
            runtime,
            f"{check.losses[0]:.6g}",
            f"{check.losses[-1]:.6g}",
            f"{check.loss_rel:.2e}",
            f"{check.params_rel_l2:.2e}",
            f"{check.worst_tensor} ({check.worst_tensor_rel_l2:.2e})",
            "ok" if check.passed else f"[red]mismatch: {escape(check.failure() or '')}[/]",
        )
    return table


def divergence_lines(checks: Sequence[OutputCheck]) -> list[str]:
    """One line per mismatching model × runtime whose worker located where it starts (rich markup)."""
    found = {(c.model, c.runtime): c.divergence for c in checks if not c.passed and c.divergence}
    return [
        f"{escape(model)} {escape(runtime)}: [red]mismatch[/]{escape(note)}" for (model, runtime), note in found.items()
    ]
