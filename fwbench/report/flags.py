"""What every report marks on a stored cell, decided in one place: noisy cells, compile-health flags, parity
marks and precision flags. The terminal/Markdown tables, the HTML page and the exports all read these."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

from fwbench.speedups import rel_half_width
from fwbench.store import ResultRecord

NOISY_REL_CI = 0.05  # an ok cell whose 95% CI half-width exceeds this fraction of its median is noisy
NOISY = "noisy"
PARITY_FAILED = "✗"
NOT_CHECKED = "—"

# (run, model, runtime, dtype, device, processes): cells that share one check
ParityKey = tuple[int, str, str, str, str, int | None]


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
    most = row.interleaving.most_subgroups
    split = [] if most is None else [f"interleaved in {most} sub-groups (memory)"]
    return ([NOISY] if is_noisy(row) else []) + contended + split + compile_flags(row) + bf16_units_flag(row)


def bf16_units_flag(row: ResultRecord) -> list[str]:
    """For a bf16 CPU cell, whether the CPU had native bfloat16 units (the worker stored ``cpu_bf16_units``):
    ``bf16 units: amx_bf16``, or ``bf16 emulated (no avx512_bf16/amx_bf16)``; nothing for other cells or rows
    stored before the units were recorded."""
    units = row.cpu_units.bf16
    if row.dtype != "bf16" or units is None:
        return []
    return [f"bf16 units: {','.join(units)}" if units else "bf16 emulated (no avx512_bf16/amx_bf16)"]


def parity_key(row: ResultRecord) -> ParityKey:
    """The cells one parity check covers: same run, model, runtime, dtype, device and process count."""
    return row.run_id, row.model, row.runtime, row.dtype, row.device, row.procs


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


# A runtime whose parity error on an output is this many times the median of the other runtimes' (or this many
# times smaller) on the same run, model, dtype and device computes in another precision than they do. Under the
# bf16 policy the runtimes that follow it land within 2.7x of each other on the zoo (docs/precision.md), where
# pure bfloat16 lands 3-25x above them; fp32 errors are rounding noise near 1e-7 that spreads ~10x, where TF32
# or a bf16 pass lands 1e3x above.
PRECISION_OUTLIER_RATIO = {"bf16": 4.0, "fp32": 100.0}


PrecisionKey = tuple[int, str, str, str, str, int | None, str]  # (*ParityKey, phase)
K = TypeVar("K")


def precision_key(row: ResultRecord) -> PrecisionKey:
    """The cells one parity check covers, phase included (a training check is a loss, not comparable)."""
    return (*parity_key(row), row.phase)


def precision_flags(results: Sequence[ResultRecord]) -> dict[PrecisionKey, str]:
    """Per :func:`precision_key`, why its runtime's precision is suspect: op classes its framework's graph showed
    off the policy (``details.precision``; any phase), or — inference checks only, at the same checked shape —
    an output whose parity error is more than PRECISION_OUTLIER_RATIO[dtype] times above or below the lower
    median of every runtime's error on that output (same run, model, dtype, device; at least two runtimes: with
    two, the larger error is the one flagged, with three or more the majority decides). Training checks are one
    loss, whose bf16 error can cancel towards 0: never compared."""
    checks: dict[PrecisionKey, ResultRecord] = {}
    for row in results:
        if row.parity is not None and (row.parity.outputs or row.precision is not None):
            checks.setdefault(precision_key(row), row)
    flags: dict[PrecisionKey, list[str]] = {}
    comparable: dict[tuple[object, ...], dict[PrecisionKey, dict[str, float]]] = {}
    for key, row in checks.items():
        if row.precision is not None and row.precision.mismatches:
            flags.setdefault(key, []).append("off policy: " + "; ".join(row.precision.mismatches))
        assert row.parity is not None
        if row.phase == "inference":  # same run, model, dtype, device, phase and checked shape
            errors = {name: e.rel_l2 for name, e in row.parity.outputs.items() if e.rel_l2}
            comparable.setdefault((key[0], key[1], *key[3:], row.parity.shape), {})[key] = errors
    for group in comparable.values():
        dtype = next(iter(group))[3]
        for key, text in error_outliers(group, dtype).items():
            flags.setdefault(key, []).append(text)
    return {key: "; ".join(texts) for key, texts in flags.items()}


def error_outliers(errors: Mapping[K, Mapping[str, float]], dtype: str) -> dict[K, str]:
    """Of the runtimes (any key) whose outputs' relative L2 errors are ``errors`` (output name → error) on one
    comparable check: those with an output more than PRECISION_OUTLIER_RATIO[dtype] times above or below the
    lower median of every runtime's error on it, and why. The lower median of all: one outlier cannot move it
    (with two runtimes, the larger error is the one flagged)."""
    ratio = PRECISION_OUTLIER_RATIO.get(dtype)
    flagged: dict[K, str] = {}
    if ratio is None:
        return flagged
    for key, outputs in errors.items():
        for name, error in outputs.items():
            everyone = sorted(e[name] for e in errors.values() if e.get(name))
            if len(everyone) < 2 or not error:
                continue
            typical = everyone[(len(everyone) - 1) // 2]
            times = error / typical
            if times > ratio or times < 1 / ratio:
                flagged[key] = (
                    f"{name} error {error:.1e} is {times:.2g}x the runtimes' median {typical:.1e}: "
                    "computes another precision"
                )
                break
    return flagged


def samples_text(row: ResultRecord) -> str:
    """The samples column: ``rounds×blocks×calls`` per block (blocks per round, the most in any round) when the
    cell ran in several rounds, else ``blocks×calls``; — without samples."""
    if not row.n_samples:
        return "—"
    rounds = row.round_samples
    if len(rounds) > 1:
        return f"{len(rounds)}×{max(len(r) for r in rounds)}×{row.calls_per_sample}"
    return f"{row.n_samples}×{row.calls_per_sample}"
