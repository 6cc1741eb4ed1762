"""The table ``fwbench diff`` prints: one row per checkpoint and output in forward order, one column per runtime,
each cell the relative L2 error against the float64 reference (red over its share of the tolerance, the first such
marked); then one line per runtime naming its first divergence."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from fwbench.runner.diff import ModelDiff, RuntimeDiff, TrainingDiff

FIRST_MARK = "◀ first"


def _cell(runtime: RuntimeDiff, name: str, kind: str) -> str:
    layer = next((e for e in runtime.layers if e.name == name and e.kind == kind), None)
    if layer is None:
        return "—"
    text = f"{layer.rel_l2:.1e}"
    if not layer.diverged:
        return text
    return f"[bold red]{text} {FIRST_MARK}[/]" if layer is runtime.first else f"[red]{text}[/]"


def diff_table(diff: ModelDiff) -> Table:
    """Checkpoints, then outputs (``output:`` before their names), by runtime; ``share`` is each row's limit."""
    shape = f"batch {diff.batch_size}" + (f", seq {diff.seq_len}" if diff.seq_len is not None else "")
    table = Table(
        title=f"fwbench diff {diff.model}, {diff.phase}, {diff.dtype}, {shape}: relative L2 error against the "
        f"float64 reference (output tolerance {diff.tolerance:g})"
    )
    table.add_column("checkpoint")
    table.add_column("share", justify="right")
    ran = [r for r in diff.runtimes if r.status == "ok"]
    for runtime in ran:
        table.add_column(runtime.runtime, justify="right")
    rows = [(name, "checkpoint") for name in diff.checkpoints] + [(name, "output") for name in diff.outputs]
    for name, kind in rows:
        limit = next((e.limit for r in ran for e in r.layers if e.name == name and e.kind == kind), None)
        table.add_row(
            name if kind == "checkpoint" else f"output:{name}",
            "—" if limit is None else f"{limit:.1e}",
            *(_cell(runtime, name, kind) for runtime in ran),
        )
    return table


def training_table(diff: ModelDiff) -> Table:
    """``--phase training``: per runtime its first step's loss against the float64 reference loss, and its gradients
    against the first runtime's: the worst tensor and the first over the tolerance in backward order."""
    table = Table(title=f"first training step, {diff.dtype}: loss against the float64 reference, gradients against "
                  "the first runtime's (relative L2 per tensor)")  # fmt: skip
    for column in ("runtime", "loss", "loss rel. error", "gradients against", "worst gradient", "first over"):
        table.add_column(column)
    for runtime in diff.runtimes:
        step = runtime.training
        if step is None or step.status != "ok":
            reason = "—" if step is None else f"{step.status}: {step.reason or ''}"
            table.add_row(escape(runtime.runtime), "—", "—", "—", "—", escape(reason))
            continue
        table.add_row(escape(runtime.runtime), *_step_cells(step))
    return table


def _step_cells(step: TrainingDiff) -> tuple[str, ...]:
    worst = max(step.gradients, key=lambda g: g.rel_l2 if g.rel_l2 == g.rel_l2 else float("inf"), default=None)
    first = step.first
    loss_error = "—" if step.loss_rel is None else f"{step.loss_rel:.1e}"
    if step.loss_diverged:
        loss_error = f"[red]{loss_error} > {step.loss_tolerance:g}[/]"
    return (
        f"{step.loss:.6g}",
        loss_error,
        escape(step.against or "—"),
        "—" if worst is None else f"{escape(worst.name)} {worst.rel_l2:.1e}",
        "none" if first is None else f"[bold red]{escape(first.name)} {first.rel_l2:.1e} > {first.limit:g}[/]",
    )


def verdict_lines(diff: ModelDiff) -> list[str]:
    """One line per runtime (rich markup): its first divergence, no divergence, or why it has no errors to show."""
    lines = []
    for runtime in diff.runtimes:
        name = escape(runtime.runtime)
        if runtime.status != "ok":
            colour = "yellow" if runtime.status == "skipped" else "red"
            lines.append(f"{name}: [{colour}]{runtime.status}[/]: {escape(runtime.reason or '')}")
            continue
        first = runtime.first
        if first is None:
            verdict = "no divergence: every checkpoint and output within its share"
        else:
            error = f"{first.rel_l2:.2g}" if first.rel_l2 == first.rel_l2 else "NaN"
            verdict = (
                f"[bold red]first divergence: {escape(first.name)}[/], rel. error {error} > its share {first.limit:.2g}"
            )
        if runtime.unavailable:
            verdict += f" (outputs only: {escape(runtime.unavailable)})"
        if runtime.tapped_rel_l2 is not None and runtime.tapped_rel_l2 > diff.tolerance:
            verdict += (
                f"; [yellow]its program with checkpoints gives other outputs than the timed one "
                f"(rel. L2 {runtime.tapped_rel_l2:.2g})[/]"
            )
        step = runtime.training
        if step is not None and step.status not in ("ok", "skipped"):
            verdict += f"; [red]training: {escape(step.status)}[/]: {escape(step.reason or '')}"
        elif step is not None and step.status == "ok" and (step.first is not None or step.loss_diverged):
            where = "" if step.first is None else f"first gradient over the tolerance: {escape(step.first.name)}"
            loss = f"loss rel. error {step.loss_rel:.2g}" if step.loss_diverged else ""
            verdict += f"; [bold red]training: {', '.join(filter(None, (loss, where)))}[/]"
        lines.append(f"{name}: {verdict}")
    return lines
