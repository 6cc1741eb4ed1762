"""Do verdicts survive a rerun? Compares back-to-back runs of the same plan stored in one database.

For each pair of runs (A, B), over the cells both ran ok, against the baseline runtime (torch:eager), for each
way of making the CIs (``moderated``: fwbench's, the round-level variances moderated over the run's cells;
``own``: each cell's own rounds alone, Student t on R − 1 degrees of freedom, as before issue 34), from the same
blocks:

- each runtime's geometric-mean speed-up in A and in B, and how far apart they are (goal: within 3%);
- the share of cells whose two speed-ups are consistent with their CIs,
  |log r_B − log r_A| ≤ t · √(se_A² + se_B²) (t: the 97.5% quantile on the Welch degrees of freedom of the two CIs'),
  and agree within 10% (goal: ≥ 90%; a CI that is too narrow
  fails it);
- the median relative CI half-width of the per-cell speed-ups and of the cells' times (goal: ≤ 5% each, so the
  check is not passed by inflating CIs).

And per run: its wall time (created → finished) and the share of its comparison groups' wall time inside timed
blocks (goals: ≤ 8 min, ≥ 40%).

``se`` is a speed-up CI's half-width on the log scale over its t quantile (the CI's own degrees of freedom); for
runs of one round (``--interleave off --rounds 1``, the mode before rounds) the within-process percentile
bootstrap of the ratio of medians that fwbench printed then (2000 seeded resamples, each side independently).

With ``--first-rounds N`` each pair is also read as its first N rounds alone: for runs that had extra rounds
(``--budget``), what the same runs would have said without them.

    python benchmarks/reproducibility.py --db DB --pair 1 2 --pair 3 4 [--first-rounds 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Sequence
from datetime import datetime

import numpy as np
from scipy import stats

from fwbench.measure.rounds import blocks_by_round, time_estimate
from fwbench.report.walltime import wall_time
from fwbench.speedups import compare_cells, pair_summaries, rel_half_width, runtimes_in
from fwbench.store import ResultRecord, Store
from fwbench.store.moderation import moderate

METHODS = ("moderated", "own")

BASELINE = "torch:eager"


def bootstrap_ratio_se(base: ResultRecord, other: ResultRecord) -> float | None:
    """Log-scale SE of median(base) / median(other) from a within-process percentile bootstrap (the CI fwbench
    printed before rounds)."""
    a, b = np.asarray(base.samples), np.asarray(other.samples)
    if a.size < 2 or b.size < 2:
        return None
    interval = stats.bootstrap(
        (a, b),
        lambda x, y, axis=-1: np.median(x, axis=axis) / np.median(y, axis=axis),
        paired=False,
        vectorized=True,
        n_resamples=2000,
        method="percentile",
        rng=np.random.default_rng(0),
    ).confidence_interval
    return math.log(interval.high / interval.low) / (2 * 1.96)


Speedup = tuple[float, float | None, float | None, float]


def speedups(rows: Sequence[ResultRecord]) -> dict[tuple[object, ...], Speedup]:
    """(runtime, model, phase, batch, seq, dtype, device) → (speed-up over the baseline, its log-scale SE, the
    relative half-width of the CI printed for it, the CI's degrees of freedom: inf for a bootstrap)."""
    out: dict[tuple[object, ...], Speedup] = {}
    by_key = {(r.runtime, r.model, r.phase, r.batch_size, r.seq_len, r.dtype, r.device): r for r in rows}
    for runtime in runtimes_in(rows):
        if runtime == BASELINE:
            continue
        for cell in compare_cells(rows, BASELINE, runtime):
            if cell.ratio is None:
                continue
            key = (runtime, cell.model, cell.phase, cell.batch_size, cell.seq_len, cell.dtype, cell.device)
            if cell.ci_low is not None and cell.ci_high is not None and cell.rounds and cell.rounds >= 3:
                dof = cell.dof or float(cell.rounds - 1)
                se: float | None = math.log(cell.ci_high / cell.ci_low) / (2 * float(stats.t.ppf(0.975, dof)))
                half: float | None = math.sqrt(cell.ci_high / cell.ci_low) - 1
            else:
                base = by_key[(BASELINE, *key[1:])]
                se, dof = bootstrap_ratio_se(base, by_key[key]), math.inf
                half = None if se is None else math.expm1(1.96 * se)
            out[key] = (cell.ratio, se, half, dof)
    return out


def welch_quantile(se1: float, dof1: float, se2: float, dof2: float) -> float:
    """The 97.5% t quantile for the difference of two log speed-ups with these SEs and degrees of freedom
    (Welch–Satterthwaite; 1.96 when both are infinite)."""
    terms = [se**4 / dof for se, dof in ((se1, dof1), (se2, dof2)) if math.isfinite(dof) and dof > 0]
    total = (se1**2 + se2**2) ** 2
    dof = total / sum(terms) if terms and total > 0 else math.inf
    return float(stats.t.ppf(0.975, dof))


def own_intervals(rows: Sequence[ResultRecord]) -> list[ResultRecord]:
    """``rows`` as before moderation: no priors, each cell's own interval."""
    out = []
    for row in rows:
        row = dataclasses.replace(row, priors=None)
        if row.interval is not None:
            row = dataclasses.replace(row, ci_low_s=row.interval.own_low_s, ci_high_s=row.interval.own_high_s)
        out.append(row)
    return out


def first_rounds(rows: Sequence[ResultRecord], count: int) -> list[ResultRecord]:
    """``rows`` as their first ``count`` rounds alone would have given them (a run with extra rounds, read as if it
    had stopped at its minimum rounds): later rounds' blocks dropped, times and intervals recomputed, the run's
    priors fitted again over what is left."""
    out = []
    for row in rows:
        row = dataclasses.replace(row, priors=None, interval=None)
        blocks = tuple(block for block in row.blocks if block.round < count)
        estimate = time_estimate(blocks_by_round(blocks)) if row.status == "ok" and blocks else None
        if estimate is not None:
            row = dataclasses.replace(
                row,
                blocks=blocks,
                samples=tuple(block.per_call_s for block in blocks),
                median_s=estimate.value,
                ci_low_s=estimate.ci_low,
                ci_high_s=estimate.ci_high,
                rounds=min(count, row.rounds or count),
            )
        out.append(row)
    return moderate(out)


def time_half_widths(rows: Sequence[ResultRecord]) -> list[float]:
    """Each ok cell's relative time CI half-width."""
    return [width for row in rows if row.status == "ok" and (width := rel_half_width(row)) is not None]


def consistent_times(rows_a: Sequence[ResultRecord], rows_b: Sequence[ResultRecord]) -> tuple[int, int]:
    """(cells whose times in the two runs agree within their CIs, cells with a CI in both): agreeing means
    |log t₂ − log t₁| ≤ √(h₁² + h₂²), h the half-width of each 95% CI in log units (log(high / low) / 2)."""
    second = {row.case_key: row for row in rows_b}
    agree = total = 0
    for row in rows_a:
        other = second.get(row.case_key)
        if other is None or row.status != "ok" or other.status != "ok":
            continue
        values = (row.median_s, row.ci_low_s, row.ci_high_s, other.median_s, other.ci_low_s, other.ci_high_s)
        if any(value is None or value <= 0 for value in values):
            continue
        h1 = math.log(row.ci_high_s / row.ci_low_s) / 2  # type: ignore[operator]
        h2 = math.log(other.ci_high_s / other.ci_low_s) / 2  # type: ignore[operator]
        total += 1
        agree += abs(math.log(other.median_s / row.median_s)) <= math.hypot(h1, h2)  # type: ignore[operator]
    return agree, total


def machine_speed(rows_a: Sequence[ResultRecord], rows_b: Sequence[ResultRecord]) -> str:
    """How the second run's cell times compare with the first's: the geometric mean of the per-cell time ratios
    and their range (a machine that changed state between the runs moves them all)."""
    first = {row.case_key: row.median_s for row in rows_a if row.status == "ok" and row.median_s}
    ratios = [row.median_s / first[row.case_key] for row in rows_b if row.case_key in first and row.median_s]
    if not ratios:
        return "no cell time in both runs"
    mean = float(np.exp(np.mean(np.log(ratios))))
    return f"second run's cell times {mean:.2f}× the first's (geomean; cells {min(ratios):.2f}–{max(ratios):.2f}×)"


def median_width(widths: Sequence[float]) -> str:
    """``±4.2%``, or ``no CI`` when there is none (fewer than 3 rounds)."""
    return f"±{np.median(widths):.1%}" if widths else "no CI"


def compare_pair(store: Store, run_a: int, run_b: int, method: str, first_count: int | None = None) -> None:
    rows_a, rows_b = store.results([run_a]), store.results([run_b])
    if first_count is not None:
        rows_a, rows_b = first_rounds(rows_a, first_count), first_rounds(rows_b, first_count)
    if method == "own":
        rows_a, rows_b = own_intervals(rows_a), own_intervals(rows_b)
    scope = "" if first_count is None else f", their first {first_count} rounds only"
    print(f"runs {run_a} and {run_b}{scope}, {method} intervals:")
    geo_a = {s.runtime: s.geomean_ratio for s in pair_summaries(rows_a, BASELINE)}
    geo_b = {s.runtime: s.geomean_ratio for s in pair_summaries(rows_b, BASELINE)}
    worst = 0.0
    for runtime, a in geo_a.items():
        b = geo_b.get(runtime)
        if a is None or b is None:
            continue
        gap = abs(b / a - 1)
        worst = max(worst, gap)
        print(f"  {runtime:22s} geomean speed-up {a:.3f} → {b:.3f} ({gap:+.1%} apart)")
    print(f"  largest geomean gap: {worst:.1%} (goal ≤ 3%)")
    first, second = speedups(rows_a), speedups(rows_b)
    common = [key for key in first if key in second]
    consistent, agreeing, widths = 0, 0, []
    for key in common:
        (r1, se1, half1, dof1), (r2, se2, half2, dof2) = first[key], second[key]
        if se1 is None or se2 is None or half1 is None or half2 is None:
            continue
        within_ci = abs(math.log(r2) - math.log(r1)) <= welch_quantile(se1, dof1, se2, dof2) * math.hypot(se1, se2)
        consistent += within_ci
        agreeing += within_ci and abs(r2 / r1 - 1) <= 0.10
        if not within_ci or abs(r2 / r1 - 1) > 0.10:
            cell = " ".join(str(part) for part in key if part is not None)
            print(f"  apart: {cell}: {r1:.3f} ±{half1:.1%} → {r2:.3f} ±{half2:.1%}")
        widths += [half1, half2]
    share = agreeing / max(1, len(common))
    times = time_half_widths(rows_a) + time_half_widths(rows_b)
    print(
        f"  cells consistent with their CIs: {consistent} of {len(common)}; consistent and within 10%: {agreeing} "
        f"({share:.0%}; goal ≥ 90%); median CI half-width: speed-up {median_width(widths)}, cell time "
        f"{median_width(times)} (goals ≤ 5%)"
    )
    agree, total = consistent_times(rows_a, rows_b)
    print(f"  cell times consistent with their CIs: {agree} of {total}; {machine_speed(rows_a, rows_b)}")


def run_line(store: Store, run_id: int) -> str:
    """A run's wall time and the share of its groups' wall time inside timed blocks."""
    run = store.get_run(run_id)
    if run is None:
        return f"run {run_id}: not in the database"
    wall = wall_time(store.results([run_id]))
    total = (
        (datetime.fromisoformat(run.finished) - datetime.fromisoformat(run.created)).total_seconds()
        if run.finished
        else None
    )
    fraction = wall.measured_fraction
    return (
        f"run {run_id}: {'unfinished' if total is None else f'{total / 60:.1f} min'} (goal ≤ 8), timed blocks "
        f"{wall.measured_s:.0f} s of {wall.wall_s or 0:.0f} s of group wall time "
        f"({'?' if fraction is None else f'{fraction:.0%}'}; goal ≥ 40%)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--pair", nargs=2, type=int, action="append", required=True, metavar=("RUN_A", "RUN_B"))
    parser.add_argument(
        "--first-rounds",
        type=int,
        metavar="N",
        help="also read each pair as its first N rounds alone (runs with extra rounds: what they gave without them)",
    )
    args = parser.parse_args()
    with Store.open(args.db, readonly=True) as store:
        for run_a, run_b in args.pair:
            print(run_line(store, run_a))
            print(run_line(store, run_b))
            for method in METHODS:
                compare_pair(store, run_a, run_b, method)
            if args.first_rounds is not None:
                for method in METHODS:
                    compare_pair(store, run_a, run_b, method, args.first_rounds)


if __name__ == "__main__":
    main()
