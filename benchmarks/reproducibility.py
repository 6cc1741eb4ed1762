"""Do verdicts survive a rerun? Compares back-to-back runs of the same plan stored in one database.

For each pair of runs (A, B), over the cells both ran ok, against the baseline runtime (torch:eager):

- each runtime's geometric-mean speed-up in A and in B, and how far apart they are (goal: within 3%);
- the share of cells whose two speed-ups are consistent with their CIs:
  |log r_B − log r_A| ≤ 1.96 · √(se_A² + se_B²) (goal: ≥ 90%; a CI that is too narrow fails it);
- the median relative CI half-width of the per-cell speed-ups (goal: ≤ 5%, so the check is not passed by
  inflating CIs).

``se`` is a speed-up CI's half-width on the log scale over its quantile: the round-level CI fwbench prints
(Student t, R − 1 degrees of freedom) for runs with ≥ 3 rounds; for runs of one round (``--interleave off
--rounds 1``, today's mode before rounds) the within-process percentile bootstrap of the ratio of medians that
fwbench printed then (2000 seeded resamples, each side resampled independently).

    python benchmarks/reproducibility.py --db DB --pair 1 2 --pair 3 4
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

from fwbench.report.summary import compare_cells, pair_summaries, runtimes_in
from fwbench.store import ResultRecord, Store

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


Speedup = tuple[float, float | None, float | None]


def speedups(rows: Sequence[ResultRecord]) -> dict[tuple[object, ...], Speedup]:
    """(runtime, model, phase, batch, seq, dtype, device) → (speed-up over the baseline, its log-scale SE, the
    relative half-width of the CI printed for it)."""
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
                quantile = float(stats.t.ppf(0.975, cell.rounds - 1))
                se: float | None = math.log(cell.ci_high / cell.ci_low) / (2 * quantile)
                half: float | None = math.sqrt(cell.ci_high / cell.ci_low) - 1
            else:
                base = by_key[(BASELINE, *key[1:])]
                se = bootstrap_ratio_se(base, by_key[key])
                half = None if se is None else math.expm1(1.96 * se)
            out[key] = (cell.ratio, se, half)
    return out


def compare_pair(store: Store, run_a: int, run_b: int) -> None:
    rows_a, rows_b = store.results([run_a]), store.results([run_b])
    print(f"runs {run_a} and {run_b}:")
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
    consistent, widths = 0, []
    for key in common:
        (r1, se1, half1), (r2, se2, half2) = first[key], second[key]
        if se1 is None or se2 is None or half1 is None or half2 is None:
            continue
        consistent += abs(math.log(r2) - math.log(r1)) <= 1.96 * math.hypot(se1, se2)
        widths += [half1, half2]
    print(
        f"  cells with consistent CIs: {consistent} of {len(common)} ({consistent / max(1, len(common)):.0%}; goal ≥ 90%); "
        f"median speed-up CI half-width ±{np.median(widths):.1%} (goal ≤ 5%)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--pair", nargs=2, type=int, action="append", required=True, metavar=("RUN_A", "RUN_B"))
    args = parser.parse_args()
    with Store.open(args.db, readonly=True) as store:
        for run_a, run_b in args.pair:
            compare_pair(store, run_a, run_b)


if __name__ == "__main__":
    main()
