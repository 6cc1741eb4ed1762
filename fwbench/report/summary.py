"""Runtime-vs-baseline comparisons of stored cells: per-cell speed-ups with CIs and significance, and a
summary per runtime pair. Framework-free; statistics with scipy.

Semantics (each is tested):

- Cells match across runtimes by ``(run_id, model, phase, batch_size, seq_len, dtype, device)``: a
  ratio never mixes two runs (absolute times from different runs are not comparable).
- Speed-up of runtime R over baseline B in one cell: ``median(B samples) / median(R samples)`` (> 1: R
  is faster). Its 95% CI is a seeded percentile bootstrap of that ratio of medians, each side
  resampled independently (``scipy.stats.bootstrap``, two samples, ``paired=False``).
- Significance: two-sided Mann–Whitney U on the raw samples (``scipy.stats.mannwhitneyu``, its default
  ``method='auto'``), then Holm's step-down correction over the cells of the pair that both sides completed
  (see :func:`holm`).
- Speed: cells with the same sample counts go through one vectorised scipy call (bootstrap and Mann–Whitney
  U), also across the pairs of :func:`grouped_pairs`; each cell gets exactly the numbers it gets alone.
  ``per_cell_ci=False`` skips the per-cell bootstrap (the costly part; ``ci_low``/``ci_high`` None) and
  changes nothing else: ratios, p-values, significance and pair summaries (their CI over cells included).
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
from scipy import stats

from fwbench.store import ResultRecord

ALPHA = 0.05  # family-wise error rate of the per-pair significance claims
CONFIDENCE = 0.95
N_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
KEY_FIELDS = ("run_id", "model", "phase", "batch_size", "seq_len", "dtype", "device")
GROUP_FIELDS = ("run_id", "phase", "dtype", "device")  # a pair summary never pools across these
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
    """``ratio`` = median(numerator) / median(denominator) with its bootstrap CI (None below 2 samples on a
    side) and the two-sided Mann–Whitney U p-value of the two samples (None without samples)."""

    ratio: float
    ci_low: float | None
    ci_high: float | None
    p_value: float | None


def _median(data: np.ndarray, axis: int = -1) -> np.ndarray:
    """The sample median along ``axis``, by a full sort (several times faster than ``np.median``'s partition on
    the (resamples, n) arrays a bootstrap makes; the same values)."""
    data = np.sort(np.moveaxis(data, axis, -1), axis=-1)
    n = data.shape[-1]
    return data[..., n // 2] if n % 2 else (data[..., n // 2 - 1] + data[..., n // 2]) / 2


def _median_ratio(numerator: np.ndarray, denominator: np.ndarray, axis: int = -1) -> np.ndarray:
    return _median(numerator, axis) / _median(denominator, axis)


MAX_BATCH_ELEMENTS = 4_000_000  # resampled values per side held at once when cells are bootstrapped together


def mann_whitney_p_many(numerators: np.ndarray, denominators: np.ndarray) -> np.ndarray:
    """Two-sided Mann–Whitney U p-values of stacked cells, row k of ``numerators`` (cells × n_a) against row k
    of ``denominators`` (cells × n_b), each exactly what ``scipy.stats.mannwhitneyu(x, y,
    alternative="two-sided")`` gives that cell alone; NaN (every sample equal) becomes 1.0.

    scipy's default ``method='auto'`` picks the exact test or the normal approximation once per call, from the
    sample counts (the same for every row here) and whether the *whole call* has ties (scipy: the exact test
    when a side has at most 8 samples and there are no ties). So the cells with ties and those without go
    through separate vectorised calls: within each, 'auto' chooses for every cell what it chooses for that cell
    alone, whatever scipy's size threshold."""
    numerators = np.asarray(numerators, dtype=np.float64)
    denominators = np.asarray(denominators, dtype=np.float64)
    pooled = np.sort(np.concatenate([numerators, denominators], axis=-1), axis=-1)
    tied = np.any(pooled[:, 1:] == pooled[:, :-1], axis=-1)
    p_values = np.empty(len(numerators))
    for rows in (tied, ~tied):
        if rows.any():
            p_values[rows] = stats.mannwhitneyu(
                numerators[rows], denominators[rows], alternative="two-sided", axis=-1
            ).pvalue
    return np.where(np.isnan(p_values), 1.0, p_values)  # all samples equal: no evidence of a difference


def ratio_of_medians_many(
    pairs: Sequence[tuple[Sequence[float], Sequence[float]]],
    confidence: float = CONFIDENCE,
    *,
    per_cell_ci: bool = True,
) -> list[RatioEstimate]:
    """:func:`ratio_of_medians` of many (numerator, denominator) sample pairs, each result exactly what the
    pair gives alone: cells with the same sample counts go through one ``scipy.stats.bootstrap`` call along the
    last axis (scipy draws one resampling index matrix per side, shared by the batch, from the same seeded
    generator a single cell would use) and :func:`mann_whitney_p_many`. ``per_cell_ci=False``: no bootstrap
    (``ci_low``/``ci_high`` None), the same ratios and p-values."""
    arrays = [(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)) for a, b in pairs]
    if any(a.size == 0 or b.size == 0 for a, b in arrays):
        raise ValueError("ratio_of_medians needs at least one sample on each side")
    out: list[RatioEstimate | None] = [None] * len(arrays)
    by_shape: dict[tuple[int, int], list[int]] = {}
    for index, (a, b) in enumerate(arrays):
        by_shape.setdefault((a.size, b.size), []).append(index)
    for (n_a, n_b), indices in by_shape.items():
        chunk = max(1, MAX_BATCH_ELEMENTS // (N_RESAMPLES * max(n_a, n_b))) if per_cell_ci else len(indices)
        for start in range(0, len(indices), chunk):
            batch = indices[start : start + chunk]
            num = np.stack([arrays[i][0] for i in batch])
            den = np.stack([arrays[i][1] for i in batch])
            with np.errstate(divide="ignore", invalid="ignore"):  # a zero median: an infinite or NaN ratio, reported
                ratios = _median_ratio(num, den)
            p_values = mann_whitney_p_many(num, den)
            if not per_cell_ci or n_a < 2 or n_b < 2:
                lows = highs = [None] * len(batch)
            else:
                interval = stats.bootstrap(
                    (num, den),
                    _median_ratio,
                    paired=False,
                    vectorized=True,
                    confidence_level=confidence,
                    axis=-1,
                    n_resamples=N_RESAMPLES,
                    method="percentile",
                    rng=np.random.default_rng(BOOTSTRAP_SEED),
                ).confidence_interval
                lows, highs = np.atleast_1d(interval.low).tolist(), np.atleast_1d(interval.high).tolist()
            for k, index in enumerate(batch):
                low, high = lows[k], highs[k]
                out[index] = RatioEstimate(
                    float(ratios[k]),
                    None if low is None else float(low),
                    None if high is None else float(high),
                    float(p_values[k]),
                )
    return [estimate for estimate in out if estimate is not None]


def ratio_of_medians(
    numerator: Sequence[float], denominator: Sequence[float], confidence: float = CONFIDENCE
) -> RatioEstimate:
    """median(numerator) / median(denominator) of two independent samples (seconds per call), its seeded
    percentile-bootstrap ``confidence`` interval (each sample resampled on its own, ``scipy.stats.bootstrap``
    with ``paired=False``, 2000 resamples; None below 2 samples on a side), and the two-sided Mann–Whitney U
    p-value (``scipy.stats.mannwhitneyu``; 1.0 when every sample is equal)."""
    return ratio_of_medians_many([(numerator, denominator)], confidence)[0]


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


def samples_of(row: ResultRecord) -> list[float] | None:
    """The raw samples (seconds per call) of an ``ok`` row, or None when it has no time to compare."""
    if row.status != "ok":
        return None
    return list(row.samples) or None


def sample_median(row: ResultRecord) -> float | None:
    """The median of an ``ok`` row's raw samples (seconds per call), or None."""
    samples = samples_of(row)
    return float(np.median(samples)) if samples else None


RowPairs = Sequence[tuple[ResultRecord, ResultRecord]]


def estimates_many(
    families: Sequence[RowPairs], *, per_cell_ci: bool = True
) -> list[list[tuple[RatioEstimate | None, float | None]]]:
    """:func:`estimates` of each family of row pairs (each its own Holm family), with one
    :func:`ratio_of_medians_many` over the cells of all of them, so cells with the same sample counts share
    scipy calls across families; each family gets exactly what it gets alone."""
    samples = [[(samples_of(top), samples_of(bottom)) for top, bottom in pairs] for pairs in families]
    usable = [
        (f, i)
        for f, family in enumerate(samples)
        for i, (top, bottom) in enumerate(family)
        if top is not None and bottom is not None
    ]
    found = dict(
        zip(
            usable,
            ratio_of_medians_many(
                [samples[f][i] for f, i in usable],  # type: ignore[misc]
                per_cell_ci=per_cell_ci,
            ),
        )
    )
    out = []
    for f, pairs in enumerate(families):
        raw: list[RatioEstimate | None] = [found.get((f, i)) for i in range(len(pairs))]
        tested = [
            (i, estimate.p_value)
            for i, estimate in enumerate(raw)
            if estimate is not None and estimate.p_value is not None
        ]
        by_index = dict(zip((i for i, _ in tested), holm([p for _, p in tested])))
        out.append([(estimate, by_index.get(i)) for i, estimate in enumerate(raw)])
    return out


def estimates(pairs: RowPairs, *, per_cell_ci: bool = True) -> list[tuple[RatioEstimate | None, float | None]]:
    """For each (numerator, denominator) row pair: :func:`ratio_of_medians` of their samples (no CI with
    ``per_cell_ci=False``) and its Holm-adjusted p-value, the family being the pairs where both rows are ``ok``
    with samples; (None, None) for the others."""
    return estimates_many([pairs], per_cell_ci=per_cell_ci)[0]


def _row_pairs(results: Sequence[ResultRecord], baseline: str, runtime: str) -> list[tuple[ResultRecord, ResultRecord]]:
    """(baseline row, runtime row) for every cell key both have, in the baseline's stored order."""
    others = {cell_key(row): row for row in results if row.runtime == runtime}
    return [(row, others[cell_key(row)]) for row in results if row.runtime == baseline and cell_key(row) in others]


def compare_cells(
    results: Sequence[ResultRecord], baseline: str, runtime: str, *, per_cell_ci: bool = True
) -> list[CellComparison]:
    """Every cell key that both ``baseline`` and ``runtime`` have in ``results`` (store rows), in the
    baseline's stored order; the Holm family is this list's comparable cells. ``per_cell_ci=False``: no
    per-cell bootstrap (``ci_low``/``ci_high`` None), everything else the same."""
    pairs = _row_pairs(results, baseline, runtime)
    return _comparisons(pairs, estimates(pairs, per_cell_ci=per_cell_ci), baseline, runtime)


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
        pair_summary(compare_cells(results, baseline, runtime, per_cell_ci=False), baseline, runtime)
        for runtime in runtimes_in(results)
        if runtime != baseline
    ]  # a summary uses no per-cell CI


@dataclass(frozen=True)
class GroupedPair:
    """One runtime against the baseline within one (run, phase, dtype, device) group: the cells of
    :func:`compare_cells` (the Holm family) and their :class:`PairSummary`."""

    run_id: int
    phase: str
    dtype: str
    device: str
    cells: list[CellComparison]
    summary: PairSummary


def split_groups(
    results: Sequence[ResultRecord], fields: Sequence[str] = GROUP_FIELDS
) -> dict[tuple[Any, ...], list[ResultRecord]]:
    """``results`` split by the values of ``fields``, groups and rows in stored order."""
    groups: dict[tuple[Any, ...], list[ResultRecord]] = {}
    for row in results:
        groups.setdefault(cell_key(row, fields), []).append(row)
    return groups


def grouped_pairs(results: Sequence[ResultRecord], baseline: str, *, per_cell_ci: bool = True) -> list[GroupedPair]:
    """Every other runtime against ``baseline`` in each (run, phase, dtype, device) group that has the
    baseline: what the report's speed-up column and pair-summary table show. Each pair's cells are exactly
    :func:`compare_cells` of its group (``per_cell_ci`` as there), computed in one batched pass over all pairs."""
    jobs = []
    for (run_id, phase, dtype, device), rows in split_groups(results).items():
        present = runtimes_in(rows)
        if baseline not in present:
            continue
        for runtime in present:
            if runtime != baseline:
                jobs.append(((run_id, phase, dtype, device), runtime, _row_pairs(rows, baseline, runtime)))
    found = estimates_many([pairs for _, _, pairs in jobs], per_cell_ci=per_cell_ci)
    out = []
    for ((run_id, phase, dtype, device), runtime, pairs), family in zip(jobs, found):
        cells = _comparisons(pairs, family, baseline, runtime)
        out.append(GroupedPair(run_id, phase, dtype, device, cells, pair_summary(cells, baseline, runtime)))
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
