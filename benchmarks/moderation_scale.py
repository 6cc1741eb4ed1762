"""What moderation costs when a run is read: ``fwbench.store.moderation.moderate`` over a synthetic run of
interleaved cells (GROUPS comparison groups of RUNTIMES cells, 3 rounds × 5 blocks each), in memory.

    python benchmarks/moderation_scale.py --groups 1000 --runtimes 10
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from fwbench.measure.rounds import Block
from fwbench.store.moderation import moderate
from fwbench.store.records import ResultRecord


def synthetic_run(groups: int, runtimes: int, seed: int = 0) -> list[ResultRecord]:
    """``groups`` × ``runtimes`` ok cells of one run, each with 3 rounds of 5 paired blocks (5% noise)."""
    rng = np.random.default_rng(seed)
    rows: list[ResultRecord] = []
    for group in range(groups):
        for runtime in range(runtimes):
            per_call = 1e-4 * (1 + runtime)
            blocks = tuple(
                Block(r, i, r * 100 + i, None, 10, 10 * per_call * float(np.exp(rng.normal(0, 0.05))))
                for r in range(3)
                for i in range(5)
            )
            rows.append(
                ResultRecord(
                    id=len(rows) + 1,
                    run_id=1,
                    case_key=f"{group}-{runtime}",
                    created="",
                    model="mlp",
                    runtime=f"runtime{runtime}",
                    phase="inference",
                    batch_size=group + 1,
                    seq_len=None,
                    dtype="fp32",
                    device="cpu",
                    status="ok",
                    median_s=per_call,
                    ci_low_s=0.9 * per_call,
                    ci_high_s=1.1 * per_call,
                    blocks=blocks,
                    schedule="interleaved",
                    group_key=f"group{group}",
                    hardware_id="machine",
                    hostname="host",
                )  # fmt: skip
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--runtimes", type=int, default=10)
    args = parser.parse_args()
    rows = synthetic_run(args.groups, args.runtimes)
    start = time.perf_counter()
    read = moderate(rows)
    seconds = time.perf_counter() - start
    priors = read[0].priors
    assert priors is not None and priors.times is not None and priors.pairs is not None
    print(
        f"moderated {len(rows)} cells in {args.groups} groups of {args.runtimes}: {seconds:.2f} s "
        f"(time prior over {priors.times.cells} cells, pair prior over {priors.pairs.cells} pairs)"
    )


if __name__ == "__main__":
    main()
