"""``fwbench env --peak``: the machine's fp32 matmul peak, measured as gemm at batch = n in each installed
framework's native runtime (each in its own worker, through the manager) and stored as a run of suite ``peak``, with
the memory bandwidth of the same cores (fwbench.measure.bandwidth) in that run's environment record."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from fwbench import __version__
from fwbench.cli.common import terminate_on_sigterm
from fwbench.frameworks import get_runtime, missing_requirement, native_runtimes
from fwbench.measure import environment
from fwbench.measure.bandwidth import ARRAY_BYTES, Bandwidth, copy_bandwidth
from fwbench.models.gemm import GEMM
from fwbench.report.export import to_json
from fwbench.report.peak import BANDWIDTH_KEY, PEAK_SUITE, Peak, achieved_gflops, best_cell
from fwbench.report.peak_table import peak_table
from fwbench.report.table import make_console
from fwbench.runner.manager import execute
from fwbench.runner.planner import build_plan, check_threads_fit
from fwbench.runner.progress import sweep_progress
from fwbench.spec import Settings, SpecError
from fwbench.store import DEFAULT_DB, Store
from fwbench.units import format_gflops


def peak_runtimes() -> tuple[str, ...]:
    """The runtimes the peak is measured in: each framework's native one (RuntimeInfo.native), installed or not."""
    return native_runtimes()


def measured_bandwidth(threads: int) -> Bandwidth | None:
    """The copy bandwidth of ``threads`` cores (one CPU each, as the cells are pinned), with arrays a quarter of the
    memory available at most; None (and a line saying why) where it cannot be measured."""
    cpus = environment.cpus_one_per_core()[:threads]
    available = environment.memory_available_bytes()
    array_bytes = min(ARRAY_BYTES, available // 8) if available else ARRAY_BYTES
    try:
        return copy_bandwidth(cpus, array_bytes)
    except (MemoryError, OSError) as exc:
        print(f"memory bandwidth not measured: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None


def command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Print GFLOP/s per runtime and the best as the peak; exit 1 when no runtime measured one."""
    candidates = peak_runtimes()
    names = [name for name in candidates if missing_requirement(get_runtime(name)) is None]
    if not names:
        raise SpecError(f"env --peak needs one of {', '.join(candidates)}; none is installed")
    settings_data: dict[str, Any] = {"threads": args.threads or environment.physical_core_count()}
    if args.max_time is not None:
        settings_data["max_time_s"] = args.max_time
    settings = Settings.from_dict(settings_data)
    check_threads_fit(settings)
    plan = build_plan([GEMM.name], names, [GEMM.n], [], settings, suite=PEAK_SUITE)
    db = args.db or DEFAULT_DB
    record = environment.collect()
    bandwidth = measured_bandwidth(settings.threads)
    if bandwidth is not None:
        record[BANDWIDTH_KEY] = bandwidth.to_dict()
    store = Store.open(db)
    run_id = store.create_run(plan, shlex.join(["fwbench", *argv]), record, __version__)
    terminate_on_sigterm()
    with store:
        print(
            f"run {run_id} (suite {PEAK_SUITE}): gemm at batch {GEMM.n} in {len(names)} runtimes, "
            f"threads {settings.threads}, database {db}",
            file=sys.stderr,
            flush=True,
        )
        with sweep_progress(plan.size) as listener:
            execute(store, run_id, plan, listener)
        store.finish_run(run_id)
        runs, results = store.runs([run_id]), store.results([run_id])
    best = best_cell(results)
    peak = (
        None
        if best is None
        else Peak(
            achieved_gflops(best) or 0.0, best.runtime, run_id, best.threads or 0, best.dtype, best.device,
            None if bandwidth is None else bandwidth.bytes_per_s,
        )
    )  # fmt: skip
    if args.format == "json":
        print(to_json(runs, results, peak))
        return 0 if peak else 1
    make_console().print(peak_table(results, settings.threads))
    if peak is None:
        print(f"no runtime measured the peak; run {run_id} in {db} says why", file=sys.stderr)
        return 1
    if bandwidth is not None:
        print(
            f"memory bandwidth: {bandwidth.bytes_per_s / 1e9:.1f} GB/s (a STREAM copy over {len(bandwidth.cpus)} "
            f"pinned threads, {bandwidth.array_bytes / 2**20:.0f} MiB arrays)"
        )
    print(
        f"peak: {format_gflops(peak.gflops)} GFLOP/s ({peak.runtime}, threads {peak.threads}), the best of "
        f"{len(results)} runtimes. Stored as run {run_id} (suite {PEAK_SUITE}) in {db}; `fwbench report --db {db}` "
        "shows every cell's % of the latest peak"
    )
    return 0
