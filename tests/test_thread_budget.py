"""Every native framework obeys the thread budget: the gemm cell in a real worker (pinning, thread
variables, the framework's own thread API, exactly as `fwbench run` does) gets the two threads asked, on two
CPUs, and the stored ``threads_effective`` says so. Whether the second thread makes it faster is a timing, so
a benchmark's: ``python benchmarks/thread_scaling.py``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fwbench.frameworks import get_runtime, missing_requirement
from fwbench.measure.environment import cpu_list_set, physical_core_count
from fwbench.runner.manager import execute
from fwbench.spec import Case, Plan, Settings
from fwbench.store import ResultRecord, Store

NATIVE_RUNTIMES = ("torch:eager", "tensorflow:function", "jax:jit")
# Two threads need two CPUs in the affinity: the serial pass's (after make test's xdist processes, each pinned to one).
pytestmark = pytest.mark.serial


def _gemm_cell(store: Store, runtime: str, threads: int, batch: int, max_time_s: float) -> ResultRecord:
    """The gemm cell at ``threads`` in a real worker; asserts that the framework was given exactly that budget."""
    plan = Plan(
        (Case("gemm", runtime, batch_size=batch),),
        Settings(threads=threads, max_time_s=max_time_s, timeout_s=180),
        suite="thread-budget",
    )
    run_id = store.create_run(plan, f"test threads={threads}", {}, "0")
    execute(store, run_id, plan)
    (row,) = store.results([run_id])
    assert row.status == "ok", (threads, row.reason)
    effective = row.details["threads_effective"]
    assert effective["intra_op"] == threads and effective["inter_op"] == 1, effective
    assert len(row.details["cpus"]) == threads and row.threads == threads
    cpus = set(row.details["cpus"])
    assert all(cpu_list_set(cpu_list) <= cpus for cpu_list in row.details["thread_cpu_lists"]), row.details
    return row


def _needs_two_cores(runtime: str) -> None:
    missing = missing_requirement(get_runtime(runtime))
    if missing:
        pytest.skip(missing)
    if len(os.sched_getaffinity(0)) < 2 or physical_core_count() < 2:
        pytest.skip(
            f"needs 2 usable CPUs on distinct physical cores; this process may use "
            f"{len(os.sched_getaffinity(0))} CPUs on {physical_core_count()} physical cores"
        )


@pytest.mark.parametrize("runtime", NATIVE_RUNTIMES)
def test_two_threads_reach_the_framework_on_two_cpus(runtime: str, tmp_path: Path) -> None:
    """By construction, whatever the machine's speed: the framework's own API reports the budget of two threads,
    the cell has two CPUs, and every thread of its worker runs on them."""
    _needs_two_cores(runtime)
    with Store.open(tmp_path / "budget.db") as store:
        _gemm_cell(store, runtime, 2, batch=8, max_time_s=0.2)
