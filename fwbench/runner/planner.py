"""From user choices (flags or a suite file) to a :class:`~fwbench.spec.Plan`.

Every name and number is validated here, before anything runs or is written.
"""

from __future__ import annotations

import itertools
from typing import Iterable, Iterator, Sequence

from fwbench.frameworks import get_runtime, phase_unsupported
from fwbench.models import get_model
from fwbench.spec import (
    FIT_DTYPES,
    MAX_COUNT,
    RUNNABLE_DTYPES,
    RUNNABLE_PHASES,
    TRAINING_DTYPES,
    Case,
    Plan,
    Settings,
    SkippedCase,
    SpecError,
)


def parse_positive_ints(option: str, text: str) -> list[int]:
    """``"1,2,4"`` → [1, 2, 4]; SpecError naming ``option`` for anything else (``0``, ``1,,2``, ``1.5``...)."""
    values: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not (part.isascii() and part.isdigit()) or not 0 < int(part) <= MAX_COUNT:
            raise SpecError(
                f"{option} {text!r}: every value must be a positive integer up to {MAX_COUNT}, "
                "comma-separated (e.g. 1,2,4)"
            )
        values.append(int(part))
    return values


def parse_names(option: str, text: str) -> list[str]:
    """``"a,b"`` → ["a", "b"]; SpecError on empty items."""
    names = [part.strip() for part in text.split(",")]
    if not all(names):
        raise SpecError(f"{option} {text!r}: expected comma-separated names with no empty item")
    return names


def _unique(items: Iterable[object]) -> list:
    return list(dict.fromkeys(items))


GridSpec = tuple[Sequence[str], Sequence[str], Sequence[int], Sequence[int]]  # models, runtimes, batches, seqs


def build_plan(
    models: Sequence[str],
    runtimes: Sequence[str],
    batch_sizes: Sequence[int],
    seq_lens: Sequence[int],
    settings: Settings,
    phase: str = "inference",
    dtype: str = "fp32",
    device: str = "cpu",
    suite: str | None = None,
) -> Plan:
    """The grid models × runtimes × batch sizes × sequence lengths, in that nesting order.

    Models without a sequence axis get one cell per batch size (seq_len None). Cells longer than a
    model's maximum are kept as skipped, with the reason; a plan with no runnable cell is an error.
    """
    return build_grids_plan([(models, runtimes, batch_sizes, seq_lens)], settings, phase, dtype, device, suite)


def build_grids_plan(
    grids: Sequence[GridSpec],
    settings: Settings,
    phase: str = "inference",
    dtype: str = "fp32",
    device: str = "cpu",
    suite: str | None = None,
) -> Plan:
    """The union of several grids' cells (see :func:`build_plan`), each cell once, in grid order."""
    if phase not in RUNNABLE_PHASES:
        raise SpecError(f"phase {phase!r} cannot be run yet; runnable: {', '.join(RUNNABLE_PHASES)}")
    if dtype not in RUNNABLE_DTYPES:
        raise SpecError(f"dtype {dtype!r} cannot be run yet; runnable: {', '.join(RUNNABLE_DTYPES)}")
    allowed = {"training": TRAINING_DTYPES, "fit": FIT_DTYPES}.get(phase, RUNNABLE_DTYPES)
    if dtype not in allowed:
        raise SpecError(f"phase {phase} with dtype {dtype!r} cannot be run yet; phase {phase} dtypes: "
                        f"{', '.join(allowed)}")
    if phase == "fit":
        for _, _, batch_sizes, _ in grids:
            uneven = [b for b in batch_sizes if settings.fit_samples % b]
            if uneven:
                raise SpecError(f"phase fit: batch size {uneven[0]} does not divide the {settings.fit_samples} fit "
                                "samples (--fit-samples must be a multiple of every batch size)")
    cases: dict[str, Case] = {}
    skipped: dict[str, SkippedCase] = {}
    for models, runtimes, batch_sizes, seq_lens in grids:
        for case, reason in _grid_cells(models, runtimes, batch_sizes, seq_lens, phase, dtype, device):
            if reason is None:
                cases.setdefault(case.key, case)
            else:
                skipped.setdefault(case.key, SkippedCase(case, reason))
    if not cases:
        reasons = "; ".join(_unique(s.reason for s in skipped.values()))
        raise SpecError(f"the plan has no runnable cell: {reasons}")
    return Plan(tuple(cases.values()), settings, tuple(skipped.values()), suite)


def _grid_cells(
    models: Sequence[str], runtimes: Sequence[str], batch_sizes: Sequence[int], seq_lens: Sequence[int],
    phase: str, dtype: str, device: str,
) -> Iterator[tuple[Case, str | None]]:
    """Every cell of one grid with the reason it cannot run (None when it can): a sequence too long for the
    model, or a phase the runtime or the model does not implement."""
    for name in models:
        get_model(name)
    for name in runtimes:
        get_runtime(name)
    if not models or not runtimes or not batch_sizes:
        raise SpecError("a plan needs at least one model, one runtime and one batch size")
    for model_name, runtime, batch in itertools.product(_unique(models), _unique(runtimes), _unique(batch_sizes)):
        model = get_model(model_name)
        unsupported = phase_unsupported(get_runtime(runtime), phase)
        if unsupported is None and phase == "training":
            unsupported = model.training_unsupported()
        if unsupported is None and phase == "fit":
            unsupported = model.fit_unsupported()
        lengths: list[int | None] = _unique(seq_lens) if model.has_sequence else [None]
        if model.has_sequence and not lengths:
            raise SpecError(f"model {model_name} needs at least one sequence length (--seq-lens)")
        for seq_len in lengths:
            case = Case(model_name, runtime, phase, batch, seq_len, dtype, device)  # type: ignore[arg-type]
            yield case, unsupported or model.supports_seq_len(seq_len)
