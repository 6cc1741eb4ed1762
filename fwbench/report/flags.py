"""What every report marks on a stored cell, decided in one place: noisy cells, compile-health flags and
parity marks. The terminal/Markdown tables, the HTML page and the exports all read these."""

from __future__ import annotations

from collections.abc import Sequence

from fwbench.store import ResultRecord

NOISY_REL_CI = 0.05  # an ok cell whose 95% CI half-width exceeds this fraction of its median is noisy
NOISY = "noisy"
PARITY_FAILED = "✗"
NOT_CHECKED = "—"

ParityKey = tuple[int, str, str, str, str]  # (run, model, runtime, dtype, device): cells that share one check


def rel_half_width(row: ResultRecord) -> float | None:
    """The stored CI half-width over the median (0.01 = ±1%), or None."""
    median, low, high = row.median_s, row.ci_low_s, row.ci_high_s
    if median is None or low is None or high is None or median <= 0:
        return None
    return float((high - low) / 2 / median)


def is_noisy(row: ResultRecord) -> bool:
    """An ``ok`` cell whose CI half-width exceeds NOISY_REL_CI of its median."""
    half = rel_half_width(row)
    return row.status == "ok" and half is not None and half > NOISY_REL_CI


def compile_flags(row: ResultRecord) -> list[str]:
    """The compile-health flags the worker stored for a cell (recompiles in the timed loop, graph
    breaks, fallbacks to eager); empty when the mode compiled cleanly or compiles nothing."""
    return list(row.compile_health.flags)


CONTENDED = "contended"


def cell_flags(row: ResultRecord) -> list[str]:
    """The note of an ``ok`` cell: ``noisy`` first when it is, ``contended`` when other work shared the machine
    while it was timed (fwbench.measure.noise), the sub-groups its comparison group was split into when its
    workers did not fit in memory together, then its compile-health flags."""
    contended = [CONTENDED] if row.status == "ok" and row.contended else []
    subgroups = row.details.get("interleave_subgroups")
    split = (
        [f"interleaved in {max(subgroups)} sub-groups (memory)"] if isinstance(subgroups, list) and subgroups else []
    )
    return ([NOISY] if is_noisy(row) else []) + contended + split + compile_flags(row)


def parity_key(row: ResultRecord) -> ParityKey:
    """The cells one parity check covers: same run, model, runtime, dtype and device."""
    return row.run_id, row.model, row.runtime, row.dtype, row.device


def parity_by_pair(results: Sequence[ResultRecord]) -> dict[ParityKey, float | None]:
    """Per :func:`parity_key`: the worst relative L2 error of its stored parity check, or None when it failed
    (checks without a verdict are left out)."""
    out: dict[ParityKey, float | None] = {}
    for row in results:
        check = row.parity
        if check is None or check.ok is None:
            continue
        out[parity_key(row)] = check.worst_rel_l2 if check.ok else None
    return out


def parity_mark(row: ResultRecord, parity: dict[ParityKey, float | None]) -> str:
    """A cell's parity column (``parity`` from :func:`parity_by_pair`): ``✗`` for a mismatch or a failed check
    of its pair, its pair's worst error (``'3e-06'``), or ``—`` when not ok or not checked."""
    if row.status == "mismatch":
        return PARITY_FAILED
    if row.status != "ok" or parity_key(row) not in parity:
        return NOT_CHECKED
    worst = parity[parity_key(row)]
    return PARITY_FAILED if worst is None else f"{worst:.0e}"


def samples_text(row: ResultRecord) -> str:
    """The samples column: ``rounds×blocks×calls`` per block (blocks per round, the most in any round) when the
    cell ran in several rounds, else ``blocks×calls``; — without samples."""
    if not row.n_samples:
        return "—"
    rounds = row.round_samples
    if len(rounds) > 1:
        return f"{len(rounds)}×{max(len(r) for r in rounds)}×{row.calls_per_sample}"
    return f"{row.n_samples}×{row.calls_per_sample}"
