"""Runtime-vs-baseline comparisons of stored cells: per-cell speed-ups with CIs and significance, and a
summary per runtime pair; what the reports show and the runner's extra rounds decide on. Framework-free; statistics
with scipy.

Semantics (each is tested):

- Cells match across runtimes by ``(run_id, hardware_id, model, phase, batch_size, seq_len, dtype, device,
  workers, procs, scaling)``: a ratio never mixes two runs (absolute times from different runs are not comparable), nor two
  machines (a run spread over several, ``--executor ray`` or merged shards, is compared machine by machine).
- Speed-up of runtime R over baseline B in one cell (> 1: R is faster), from :mod:`fwbench.measure.rounds`:
  when both were measured interleaved in the same run and group, from their *paired* blocks (same round, same
  cycle: adjacent in time), exp(mean over rounds of the round's median log(t_B / t_R)); otherwise the ratio of
  the two cells' round-level time estimates (unpaired). Its 95% CI and p-value are Student-t over rounds, so
  they include the variation between worker processes; below 3 rounds there is neither (the report prints
  the ratio with "≈").
- Significance: that p-value, then Holm's step-down correction over the cells of the pair that have one
  (see :func:`holm`).
- Pair summary: geometric mean of the per-cell speed-ups over the cells both sides completed with
  status ``ok`` (never an arithmetic mean of seconds), with a seeded percentile bootstrap CI over
  cells; counts of significantly faster / slower cells; and, over the cells both sides have, the
  count of each side's non-ok cells by status.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fwbench.measure.environment import hardware_label
from fwbench.measure.rounds import paired_log_ratios, paired_speedup, unpaired_ratio
from fwbench.spec import CASE_FIELDS
from fwbench.store import ResultRecord
from fwbench.store.moderation import measured_together, pair_log_time

ALPHA = 0.05  # family-wise error rate of the per-pair significance claims
CONFIDENCE = 0.95
N_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
# A cell's key across runtimes: its run, machine and case but the runtime (spec.CASE_FIELDS).
KEY_FIELDS = ("run_id", "hardware_id", *(name for name in CASE_FIELDS if name != "runtime"))
# A pair summary never pools across these; nothing is ever compared across two machines (hardware fingerprints).
GROUP_FIELDS = ("run_id", "hardware_id", "phase", "dtype", "device")
DEFAULT_BASELINE = "torch:eager"


@dataclass(frozen=True)
class CellComparison:
    """One cell (a key shared by both runtimes) of ``runtime`` against ``baseline``.

    ``ratio`` is the speed-up median_baseline / median_runtime (> 1: ``runtime`` is faster), with its 95%
    bootstrap CI; ``p_value`` the two-sided Mann–Whitney U p-value, ``p_adjusted`` Holm-adjusted over
    the pair's comparable cells. All four are None unless both cells are ``ok`` with samples
    (``comparable``); the statuses and reasons say why not. Medians in seconds per call.
    """

    run_id: int
    model: str
    phase: str
    batch_size: int
    seq_len: int | None
    dtype: str
    device: str
    baseline: str
    runtime: str
    baseline_status: str
    runtime_status: str
    baseline_reason: str | None
    runtime_reason: str | None
    baseline_median_s: float | None
    runtime_median_s: float | None
    ratio: float | None
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    p_adjusted: float | None
    significant: bool
    rounds: int | None = None  # rounds behind the ratio
    pairs: int | None = None  # paired blocks behind it (None: not paired)
    dof: float | None = None  # its CI's degrees of freedom: rounds − 1, more when moderated over the run
    moderated: bool = False  # its CI's variance was moderated over the run
    workers: int | None = None  # phase data: the loaders' worker count
    procs: int | None = None  # a distributed cell's processes
    scaling: str | None = None  # and its batch semantics (weak, strong)
    hardware_id: str | None = None  # the machine both cells ran on

    @property
    def comparable(self) -> bool:
        """Both sides ``ok`` with samples: the cell has a ratio."""
        return self.ratio is not None


@dataclass(frozen=True)
class PairSummary:
    """``runtime`` against ``baseline`` over the cells both have: geometric-mean speed-up (> 1: ``runtime``
    faster) over the ``n_common`` cells both completed ``ok``, its 95% bootstrap CI over cells (None below
    2 cells), the counts of significantly faster / slower cells, and each side's non-ok cells by status."""

    baseline: str
    runtime: str
    n_common: int
    geomean_ratio: float | None
    ci_low: float | None
    ci_high: float | None
    n_faster: int
    n_slower: int
    failed_baseline: dict[str, int] = field(default_factory=dict)
    failed_runtime: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class RatioEstimate:
    """``ratio`` = time(numerator) / time(denominator) with its 95% CI and two-sided p-value (both None below 3
    rounds), the rounds and values (block pairs, or the fewer blocks of the two sides) behind it, and whether it
    came from paired blocks."""

    ratio: float
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    rounds: int = 1
    values: int = 0
    paired: bool = False
    dof: float | None = None  # the CI's degrees of freedom (more than rounds − 1 when moderated)
    moderated: bool = False  # its variance was moderated over the run (fwbench.store.moderation)


def row_ratio(numerator: ResultRecord, denominator: ResultRecord) -> RatioEstimate | None:
    """time(numerator) / time(denominator) of two stored cells (None unless both are ``ok`` with samples):
    paired when :func:`measured_together` and they share cycles, else unpaired (:mod:`fwbench.measure.rounds`);
    the round-level variance moderated by the priors their runs were read with (:mod:`fwbench.store.moderation`:
    the run's pair prior when paired, each side's time prior when not)."""
    if samples_of(numerator) is None or samples_of(denominator) is None:
        return None
    paired = (
        paired_log_ratios(numerator.blocks, denominator.blocks) if measured_together(numerator, denominator) else []
    )
    log_time = pair_log_time(numerator, denominator)
    if paired:
        prior = numerator.priors.pairs if numerator.priors is not None and log_time is not None else None
        estimate = paired_speedup(paired, prior, log_time, (numerator.runtime, denominator.runtime))
    else:
        sides = tuple(None if row.priors is None else row.priors.times for row in (numerator, denominator))
        estimate = unpaired_ratio(
            numerator.round_samples,
            denominator.round_samples,
            (sides[0], sides[1]),
            (numerator.runtime, denominator.runtime),
        )
    if estimate is None:
        return None
    return RatioEstimate(
        estimate.value,
        estimate.ci_low,
        estimate.ci_high,
        estimate.p_value,
        estimate.rounds,
        estimate.values,
        bool(paired),
        estimate.dof,
        estimate.moderated,
    )


def relative_half_width(value: float | None, low: float | None, high: float | None) -> float | None:
    """Half a CI's width over its estimate (0.05 = ±5%); None without a CI or a positive estimate."""
    if value is None or low is None or high is None or not value > 0:
        return None
    return float((high - low) / 2 / value)


def rel_half_width(row: ResultRecord) -> float | None:
    """The record's CI half-width over the median (0.01 = ±1%: moderated over its run when read with it,
    fwbench.store.moderation), or None."""
    return relative_half_width(row.median_s, row.ci_low_s, row.ci_high_s)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order: sort ascending, multiply the i-th smallest
    (from 0) by (m - i), carry the running maximum forward, cap at 1. A cell is significant when its
    adjusted p-value is below ALPHA; that keeps the chance of even one false claim in the family at most
    ALPHA under any dependence between the tests. (scipy has no Holm; its
    ``false_discovery_control`` is Benjamini–Hochberg/–Yekutieli, which bounds a different rate.)"""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


def geometric_mean_ci(
    ratios: Sequence[float], confidence: float = CONFIDENCE
) -> tuple[float | None, float | None, float | None]:
    """Geometric mean of positive ratios (``scipy.stats.gmean``) and its seeded percentile-bootstrap
    ``confidence`` interval over the ratios (cells resampled); (None, None, None) for no ratio, CI None
    for one."""
    from scipy import stats  # here, not at import: every CLI command imports the reports

    data = np.asarray(ratios, dtype=np.float64)
    if data.size == 0:
        return None, None, None
    centre = float(stats.gmean(data))
    if data.size < 2:
        return centre, None, None
    if np.all(data == data[0]):
        return centre, centre, centre
    result = stats.bootstrap(
        (data,),
        stats.gmean,
        vectorized=True,
        confidence_level=confidence,
        n_resamples=N_RESAMPLES,
        method="percentile",
        rng=np.random.default_rng(BOOTSTRAP_SEED),
    )
    return centre, float(result.confidence_interval.low), float(result.confidence_interval.high)


def cell_key(row: ResultRecord | CellComparison, fields: Iterable[str] = KEY_FIELDS) -> tuple[Any, ...]:
    """The values of ``fields`` (attribute names) of a stored cell or a comparison (the key cells are matched on)."""
    return tuple(getattr(row, name) for name in fields)


def machine_labels(results: Iterable[ResultRecord]) -> dict[str | None, str]:
    """Hardware id → a short description of that machine (``<cpu>, <N> CPUs, <M> GiB``), in order of first
    appearance (the description comes from hashed fields, so one id has one description)."""
    labels: dict[str | None, str] = {}
    for row in results:
        labels.setdefault(row.hardware_id, hardware_label(row.machine))
    return labels


def samples_of(row: ResultRecord) -> list[float] | None:
    """The raw samples (seconds per call) of an ``ok`` row, or None when it has no time to compare."""
    if row.status != "ok":
        return None
    return list(row.samples) or None


def sample_median(row: ResultRecord) -> float | None:
    """An ``ok`` row's time (seconds per call): its stored estimate (the geometric mean of its rounds' medians),
    else the median of its raw samples; None without samples."""
    samples = samples_of(row)
    if not samples:
        return None
    return row.median_s if row.median_s is not None else float(np.median(samples))


RowPairs = Sequence[tuple[ResultRecord, ResultRecord]]


def estimates(pairs: RowPairs) -> list[tuple[RatioEstimate | None, float | None]]:
    """For each (numerator, denominator) row pair: :func:`row_ratio` and its Holm-adjusted p-value, the family
    being the pairs with a p-value; (None, None) where both rows are not ``ok`` with samples."""
    raw = [row_ratio(top, bottom) for top, bottom in pairs]
    tested = [(i, e.p_value) for i, e in enumerate(raw) if e is not None and e.p_value is not None]
    adjusted = dict(zip((i for i, _ in tested), holm([p for _, p in tested])))
    return [(estimate, adjusted.get(i)) for i, estimate in enumerate(raw)]


def _row_pairs(results: Sequence[ResultRecord], baseline: str, runtime: str) -> list[tuple[ResultRecord, ResultRecord]]:
    """(baseline row, runtime row) for every cell key both have, in the baseline's stored order."""
    others = {cell_key(row): row for row in results if row.runtime == runtime}
    return [(row, others[cell_key(row)]) for row in results if row.runtime == baseline and cell_key(row) in others]


def compare_cells(results: Sequence[ResultRecord], baseline: str, runtime: str) -> list[CellComparison]:
    """Every cell key that both ``baseline`` and ``runtime`` have in ``results`` (store rows), in the
    baseline's stored order; the Holm family is this list's comparable cells."""
    pairs = _row_pairs(results, baseline, runtime)
    return _comparisons(pairs, estimates(pairs), baseline, runtime)


def _comparisons(
    pairs: RowPairs, found: Sequence[tuple[RatioEstimate | None, float | None]], baseline: str, runtime: str
) -> list[CellComparison]:
    out = []
    for (base, other), (estimate, p_adjusted) in zip(pairs, found):
        out.append(
            CellComparison(
                run_id=base.run_id,
                model=base.model,
                phase=base.phase,
                batch_size=base.batch_size,
                seq_len=base.seq_len,
                dtype=base.dtype,
                device=base.device,
                workers=base.workers,
                procs=base.procs,
                scaling=base.scaling,
                hardware_id=base.hardware_id,
                baseline=baseline,
                runtime=runtime,
                baseline_status=base.status,
                runtime_status=other.status,
                baseline_reason=base.reason,
                runtime_reason=other.reason,
                baseline_median_s=sample_median(base),
                runtime_median_s=sample_median(other),
                ratio=None if estimate is None else estimate.ratio,
                ci_low=None if estimate is None else estimate.ci_low,
                ci_high=None if estimate is None else estimate.ci_high,
                p_value=None if estimate is None else estimate.p_value,
                p_adjusted=p_adjusted,
                significant=p_adjusted is not None and p_adjusted < ALPHA,
                rounds=None if estimate is None else estimate.rounds,
                pairs=None if estimate is None or not estimate.paired else estimate.values,
                dof=None if estimate is None else estimate.dof,
                moderated=estimate is not None and estimate.moderated,
            )
        )
    return out


def _count(statuses: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for status in statuses:
        if status != "ok":
            counts[status] = counts.get(status, 0) + 1
    return dict(sorted(counts.items()))


def pair_summary(cells: Sequence[CellComparison], baseline: str, runtime: str) -> PairSummary:
    """The :class:`PairSummary` of one pair's :func:`compare_cells` output (so a caller that shows the cells
    too computes them once)."""
    ratios = [cell.ratio for cell in cells if cell.ratio is not None]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # gmean of a zero ratio: a zero median, still reported
        centre, low, high = geometric_mean_ci(ratios)
    return PairSummary(
        baseline=baseline,
        runtime=runtime,
        n_common=len(ratios),
        geomean_ratio=centre,
        ci_low=low,
        ci_high=high,
        n_faster=sum(1 for c in cells if c.significant and c.ratio is not None and c.ratio > 1),
        n_slower=sum(1 for c in cells if c.significant and c.ratio is not None and c.ratio < 1),
        failed_baseline=_count(c.baseline_status for c in cells),
        failed_runtime=_count(c.runtime_status for c in cells),
    )


def runtimes_in(results: Sequence[ResultRecord]) -> list[str]:
    """The runtimes of ``results`` in order of first appearance."""
    return list(dict.fromkeys(row.runtime for row in results))


def pair_summaries(results: Sequence[ResultRecord], baseline: str) -> list[PairSummary]:
    """One :class:`PairSummary` per other runtime present in ``results``, in order of first appearance
    (none when ``baseline`` is absent)."""
    if baseline not in runtimes_in(results):
        return []
    return [
        pair_summary(compare_cells(results, baseline, runtime), baseline, runtime)
        for runtime in runtimes_in(results)
        if runtime != baseline
    ]


@dataclass(frozen=True)
class GroupedPair:
    """One runtime against the baseline within one (run, machine, phase, dtype, device) group: the cells of
    :func:`compare_cells` (the Holm family) and their :class:`PairSummary`."""

    run_id: int
    hardware_id: str | None
    phase: str
    dtype: str
    device: str
    cells: list[CellComparison]
    summary: PairSummary

    @property
    def baseline(self) -> str:
        return self.summary.baseline


def split_groups(
    results: Sequence[ResultRecord], fields: Sequence[str] = GROUP_FIELDS
) -> dict[tuple[Any, ...], list[ResultRecord]]:
    """``results`` split by the values of ``fields``, groups and rows in stored order."""
    groups: dict[tuple[Any, ...], list[ResultRecord]] = {}
    for row in results:
        groups.setdefault(cell_key(row, fields), []).append(row)
    return groups


def grouped_pairs(results: Sequence[ResultRecord], baseline: str, fallback: bool = False) -> list[GroupedPair]:
    """Every other runtime against ``baseline`` in each (run, machine, phase, dtype, device) group that has the
    baseline: what the report's speed-up column and pair-summary table show. Each pair's cells are exactly
    :func:`compare_cells` of its group. ``fallback`` (the baseline was not asked for): a group without it takes
    its own, DEFAULT_BASELINE or else its first runtime (phase data: its first loader)."""
    jobs: list[tuple[tuple[Any, ...], str, str, RowPairs]] = []
    for group, rows in split_groups(results).items():
        present = runtimes_in(rows)
        if baseline not in present:
            if not fallback or not present:
                continue
            group_baseline = DEFAULT_BASELINE if DEFAULT_BASELINE in present else present[0]
            jobs.extend(
                (group, runtime, group_baseline, _row_pairs(rows, group_baseline, runtime))
                for runtime in present
                if runtime != group_baseline
            )
            continue
        for runtime in present:
            if runtime != baseline:
                jobs.append((group, runtime, baseline, _row_pairs(rows, baseline, runtime)))
    out = []
    for (run_id, hardware_id, phase, dtype, device), runtime, base, pairs in jobs:
        cells = _comparisons(pairs, estimates(pairs), base, runtime)
        out.append(GroupedPair(run_id, hardware_id, phase, dtype, device, cells, pair_summary(cells, base, runtime)))
    return out


def resolve_baseline(results: Sequence[ResultRecord], requested: str | None) -> str | None:
    """The baseline runtime: ``requested`` (ValueError naming the runtimes present when it is absent from
    ``results``), else DEFAULT_BASELINE when present, else the first runtime; None for no results."""
    present = runtimes_in(results)
    if requested is not None:
        if requested not in present:
            raise ValueError(
                f"--baseline {requested} is not in these results; runtimes there: {', '.join(present) or 'none'}"
            )
        return requested
    if DEFAULT_BASELINE in present:
        return DEFAULT_BASELINE
    return present[0] if present else None
