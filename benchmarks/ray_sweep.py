"""A suite locally and on a local 2-node Ray cluster (one CPU per node, node i pinned to CPU i), then as two shards
merged: wall times, Ray's per-group scheduling overhead, whether Ray's medians agree with local ones, and whether
the shards reproduce the plan.

    python benchmarks/ray_sweep.py --suite quick --threads 1 --db results/ray-sweep.db

Ray's overhead per group is the driver's submit-to-result time minus the group's own time on its node
(``details.ray``: ``task_s`` − ``group_s``). Agreement is ``fwbench compare``'s B/A (B = Ray) per cell, with the
geometric mean over cells and its bootstrap CI; the two runs share the machine, so no warning applies.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fwbench.report.compare import compare_runs
from fwbench.store import Store
from fwbench.store.merge import merge_stores
from ray_cluster import local_cluster


def timed_run(args: list[str], env: dict[str, str] | None = None) -> float:
    """Run ``fwbench run ARGS``; its wall seconds (exit status must be 0)."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "fwbench", "run", *args], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"fwbench run {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", default="quick")
    parser.add_argument("--threads", default="1")
    parser.add_argument("--db", type=Path, default=Path("results/ray-sweep.db"))
    parser.add_argument("--shard-max-time", default="0.5", help="timing budget of the shard runs (coverage only)")
    args = parser.parse_args()
    # extra rounds (a suite's --budget) are given on the local machine only: both runs keep to their minimum rounds
    grid = ["--suite", args.suite, "--threads", args.threads, "--max-rounds", "1", "--db", str(args.db)]
    local_s = timed_run(grid)
    with local_cluster(2) as cluster:
        ray_s = timed_run([*grid, "--executor", "ray", "--ray-address", cluster.address], cluster.env)
    with Store.open(args.db, readonly=True) as store:
        local_run, ray_run = store.runs()[-2:]
        local_rows, ray_rows = store.results([local_run.id]), store.results([ray_run.id])
    groups = {row.group_key: row.details["ray"] for row in ray_rows if "ray" in row.details}  # one task per group
    overhead = [g["task_s"] - g["group_s"] for g in groups.values()]
    nodes = {g["node_id"] for g in groups.values()}
    print(
        f"suite {args.suite}, --threads {args.threads}: {len(local_rows)} cells in {len({r.group_key for r in local_rows})} groups"
    )
    print(f"local (run {local_run.id}): {local_s:.1f} s wall")
    print(f"ray, 2 nodes (run {ray_run.id}): {ray_s:.1f} s wall, {len(groups)} groups on {len(nodes)} nodes")
    print(
        f"ray overhead per group (task − group on node): median {statistics.median(overhead):.2f} s, "
        f"max {max(overhead):.2f} s; per cell {sum(overhead) / len(ray_rows):.2f} s"
    )
    comparison = compare_runs(local_run, local_rows, ray_run, ray_rows)
    for summary in comparison.summaries:
        print(
            f"ray/local medians, {summary.runtime}: geomean {summary.geomean_ratio:.3f} "
            f"(95% CI {summary.ci_low:.3f}–{summary.ci_high:.3f}) over {summary.n_common} cells"
            if summary.geomean_ratio is not None and summary.ci_low is not None and summary.ci_high is not None
            else f"ray/local medians, {summary.runtime}: {summary.n_common} cells, no CI"
        )
    ratios = [c.ratio for c in comparison.cells if c.ratio is not None]
    print(f"per-cell ray/local: min {min(ratios):.3f}, median {statistics.median(ratios):.3f}, max {max(ratios):.3f}")
    print(f"machine warning: {comparison.machine_warning}")
    with tempfile.TemporaryDirectory() as scratch:
        shards = [Path(scratch) / f"shard{i}.db" for i in (1, 2)]
        shard_grid = [
            "--suite",
            args.suite,
            "--threads",
            args.threads,
            "--max-time",
            args.shard_max_time,
            "--rounds",
            "1",
        ]
        for index, path in enumerate(shards, start=1):
            timed_run([*shard_grid, "--shard", f"{index}/2", "--db", str(path)])
        merged = Path(scratch) / "merged.db"
        merge_stores(shards, merged)
        with Store.open(merged, readonly=True) as store:
            (run,) = store.runs()
            keys = sorted(row.case_key for row in store.results([run.id]))
        planned = sorted([c.key for c in run.plan.cases] + [s.case.key for s in run.plan.skipped])
        local_keys = sorted(row.case_key for row in local_rows)
        print(
            f"shards 1/2 + 2/2 merged: {len(keys)} cells, shard column {run.shard}, keys equal the plan's: "
            f"{keys == planned}, equal the local run's: {keys == local_keys}"
        )


if __name__ == "__main__":
    main()
