"""Report time on a large store: generate N synthetic results, then time each `fwbench report` format.

The store is written through :class:`fwbench.store.Store` exactly as runs write it: one run whose plan
is every cell, each cell with seeded lognormal samples around a synthetic per-call time (runtimes
differ by a fixed factor, time grows with batch × sequence length), and a realistic mix of fates: oom
at the largest shapes of some runtimes, a few errors whose reasons hold HTML, compile-health flags,
noisy cells, parity details on the first cell of each model × runtime. Then each format runs as a user runs it (`python -m fwbench report ... --out FILE`,
a fresh interpreter, imports included) and its wall time and output size are printed.

    .venv/bin/python benchmarks/report_scale.py [--results 10000] [--db PATH] [--formats table,json,csv,html]
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from fwbench.spec import Case, Plan, Settings
from fwbench.store import Store

MODELS = ("bert-tiny", "bert-base", "distilbert-base", "gpt2-tiny", "gpt2")
RUNTIMES = (
    "torch:eager",
    "torch:script",
    "torch:compile",
    "tensorflow:eager",
    "tensorflow:function",
    "tensorflow:xla",
    "jax:jit",
    "keras:tensorflow",
    "keras:jax",
    "keras:torch",
)
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)


def grid(n_results: int) -> list[Case]:
    """``n_results`` cases: every model × runtime × batch, with as many sequence lengths as it takes."""
    per_seq = len(MODELS) * len(RUNTIMES) * len(BATCHES)
    seqs = [16 * (k + 1) for k in range(math.ceil(n_results / per_seq))]
    cases = [
        Case(model, runtime, batch_size=b, seq_len=s)
        for model in MODELS
        for runtime in RUNTIMES
        for b in BATCHES
        for s in seqs
    ]
    return cases[:n_results]


def generate(path: Path, n_results: int, seed: int = 0) -> None:
    """Write one run of ``n_results`` synthetic cells into a new store at ``path``."""
    rng = np.random.default_rng(seed)
    cases = grid(n_results)
    settings = Settings(threads=2)
    plan = Plan(cases=tuple(cases), settings=settings, suite="synthetic")
    environment = {"cpu_model": "synthetic", "physical_cores": 2, "cpu_simd_flags": "avx2", "version_fwbench": "0"}
    factor = {rt: 0.5 + 0.15 * i for i, rt in enumerate(RUNTIMES)}
    size = {m: 1e-5 * 4**i for i, m in enumerate(MODELS)}
    with Store.open(path) as store:
        run_id = store.create_run(plan, "benchmarks/report_scale.py", environment, "synthetic")
        store.conn.execute("BEGIN")
        checked: set[tuple[str, str]] = set()
        for case in cases:
            work = case.batch_size * (case.seq_len or 1)
            median = size[case.model] * factor[case.runtime] * (1 + work / 64)
            details: dict[str, object] = {}
            if (case.model, case.runtime) not in checked:  # parity is checked once per model × runtime
                checked.add((case.model, case.runtime))
                details["parity"] = {
                    "ok": True,
                    "outputs": {"last_hidden_state": {"rel_l2": 1e-7, "max_abs": 1e-6}},
                    "reference": "numpy-float64",
                    "tolerance_rel_l2": 1e-4,
                    "shape": [2, 16],
                }
            fields: dict[str, object] = {
                "threads": 2,
                "interop_threads": 1,
                "protocol": "adaptive",
                "flops": int(2e6 * work),
                "peak_memory_bytes": int(3e8 + 4e5 * work),
            }
            samples: list[float] = []
            if case.runtime.startswith("keras") and work >= 4096:
                fields.update(status="oom", reason="resident memory over --memory-limit")
            elif rng.random() < 0.01:
                fields.update(status="error", reason="RuntimeError: <script>alert(1)</script> & co")
            else:
                noise = 0.08 if rng.random() < 0.05 else 0.01
                samples = list(median * rng.lognormal(0.0, noise, int(rng.integers(20, 60))))
                ordered = np.sort(samples)
                k = max(0, int(len(samples) / 2 - 1.96 * math.sqrt(len(samples)) / 2))
                fields.update(
                    status="ok",
                    calls_per_sample=1,
                    median_s=float(np.median(ordered)),
                    ci_low_s=float(ordered[k]),
                    ci_high_s=float(ordered[-k - 1]),
                    mean_s=float(np.mean(ordered)),
                    stdev_s=float(np.std(ordered, ddof=1)),
                    min_s=float(ordered[0]),
                    first_call_s=median * 40,
                    wall_s=1.0,
                )
                if case.runtime == "torch:compile" and rng.random() < 0.05:
                    details["compile_health"] = {"flags": ["graph breaks 1"]}
            store.add_result(run_id, case, fields, samples, details)
        store.conn.execute("COMMIT")
        store.finish_run(run_id)


def time_report(db: Path, fmt: str, out: Path) -> tuple[float, int]:
    """Wall seconds and output bytes of one ``fwbench report`` in a fresh interpreter."""
    args = ["--html", str(out)] if fmt == "html" else ["--format", fmt, "--out", str(out)]
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "fwbench", "report", "--db", str(db), *args],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - started, out.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=int, default=10_000)
    parser.add_argument("--db", type=Path, help="store to create (default: a temporary one); must not exist")
    parser.add_argument("--formats", default="table,json,csv,html")
    args = parser.parse_args()
    # the reports beside a given store (named after it), else in a new temporary folder kept for the reader
    folder = args.db.parent if args.db else Path(tempfile.mkdtemp(prefix="fwbench-report-scale-"))
    db = args.db or folder / "scale.db"
    if db.exists():
        parser.error(f"{db} exists; give a new path")
    started = time.perf_counter()
    generate(db, args.results)
    print(
        f"generated {args.results} results in {db} ({db.stat().st_size / 2**20:.1f} MiB) in "
        f"{time.perf_counter() - started:.1f} s"
    )
    for fmt in args.formats.split(","):
        out = folder / f"{db.stem}-report.{fmt}"
        seconds, size = time_report(db, fmt, out)
        print(
            f"fwbench report --format {fmt}: {seconds:.2f} s, {size / 2**20:.2f} MiB ({out})"
            if fmt != "html"
            else f"fwbench report --html: {seconds:.2f} s, {size / 2**20:.2f} MiB ({out})"
        )


if __name__ == "__main__":
    main()
