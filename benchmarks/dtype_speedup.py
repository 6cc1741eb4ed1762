"""What bf16 buys in each runtime: fp32 time / bf16 time per cell, from one database (e.g. the bf16 and
bf16-training suites), as a Markdown table.

For every model × runtime × phase × shape with an ok fp32 row and an ok bf16 row: both times (geometric mean
of round medians), fp32/bf16 (above 1: bf16 is faster) with its 95% CI from both sides' round-level spreads
(fwbench.measure.rounds.unpaired_ratio, Welch: the two dtypes ran in different comparison groups, so their
blocks are not paired), the bf16 cell's parity error against the float64 reference and the CPU's bf16 units as
the bf16 cell stored them.

    python benchmarks/dtype_speedup.py --db bf16.db [--run ID]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from fwbench.measure.rounds import unpaired_ratio
from fwbench.store import ResultRecord, Store
from fwbench.units import format_seconds

Key = tuple[str, str, str, int, int | None]


def key(row: ResultRecord) -> Key:
    return (row.model, row.runtime, row.phase, row.batch_size, row.seq_len)


def rows_table(results: Sequence[ResultRecord]) -> list[str]:
    """The Markdown lines: a header and one row per cell with both dtypes ok, in stored order."""
    by_dtype: dict[str, dict[Key, ResultRecord]] = {"fp32": {}, "bf16": {}}
    for row in results:
        if row.status == "ok" and row.dtype in by_dtype:
            by_dtype[row.dtype][key(row)] = row
    lines = [
        "| model | phase | runtime | fp32 | bf16 | fp32/bf16 (95% CI) | bf16 parity error | bf16 units |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for cell, fp32 in by_dtype["fp32"].items():
        bf16 = by_dtype["bf16"].get(cell)
        if bf16 is None:
            continue
        ratio = unpaired_ratio(fp32.round_samples, bf16.round_samples)
        ci = f" ({ratio.ci_low:.2f}–{ratio.ci_high:.2f})" if ratio and ratio.ci_low and ratio.ci_high else ""
        error = bf16.parity.worst_rel_l2 if bf16.parity is not None and bf16.parity.ok is not None else None
        units = bf16.cpu_units.bf16 if bf16.cpu_units is not None else None
        model, runtime, phase, batch, seq = cell
        shape = f"b{batch}" + (f" s{seq}" if seq is not None else "")
        lines.append(
            f"| {model} {shape} | {phase} | {runtime} | {format_seconds(fp32.median_s)} | "
            f"{format_seconds(bf16.median_s)} | {f'{ratio.value:.2f}{ci}' if ratio else '—'} | "
            f"{f'{error:.1e}' if error is not None else '—'} | {', '.join(units) if units else 'none'} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--run", type=int, help="one run (default: every benchmark run in the database)")
    args = parser.parse_args()
    with Store.open(args.db, create=False) as store:  # migrates a database of an older schema
        results = store.results(None if args.run is None else [args.run])
    print("\n".join(rows_table(results)))


if __name__ == "__main__":
    main()
