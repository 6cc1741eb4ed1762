"""Worker isolation: every way a cell can end gets its status, and the sweep goes on."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO_DIR, run_args
from fwbench.cli import main
from fwbench.measure.environment import cpus_one_per_core
from fwbench.runner.manager import execute, run_worker
from fwbench.spec import Case, Plan, Settings
from fwbench.store import Store

FAST = Settings(threads=1, max_time_s=0.2, timeout_s=60)


def cell(mode: str, batch_size: int = 1) -> Case:
    return Case("mlp", f"fake:{mode}", batch_size=batch_size)


def test_well_behaved_fake_runtime_is_timed(plugin_env: dict[str, str]) -> None:
    outcome = run_worker(cell("sleep"), FAST)
    assert outcome.status == "ok", outcome.reason
    assert outcome.samples and outcome.fields["median_s"] >= 0.002
    assert outcome.details["parity"]["ok"] is True
    assert outcome.details["threads_effective"] == {"intra_op": 1, "inter_op": 1}
    assert outcome.details["cpus"] == [cpus_one_per_core()[0]]
    assert outcome.details["thread_cpu_lists"] == [str(cpus_one_per_core()[0])]  # numpy's threads pinned too


def test_crash_is_an_error_with_the_signal(plugin_env: dict[str, str]) -> None:
    outcome = run_worker(cell("crash"), FAST)
    assert outcome.status == "error"
    assert outcome.reason is not None and "SIGSEGV during first_call" in outcome.reason


def test_hang_is_a_timeout(plugin_env: dict[str, str]) -> None:
    start = time.monotonic()
    # The fake backend hangs in build; the timeout leaves a loaded machine time to start the worker before it.
    outcome = run_worker(cell("hang"), Settings(threads=1, max_time_s=1, timeout_s=10))
    assert outcome.status == "timeout"
    assert outcome.reason == "exceeded --timeout 10 s during build"
    assert time.monotonic() - start < 40


def test_memory_over_the_limit_is_oom(plugin_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_HOG_BYTES", str(600 * 2**20))
    outcome = run_worker(cell("hog"), Settings(threads=1, timeout_s=60, memory_limit_bytes=400 * 2**20))
    assert outcome.status == "oom"
    assert outcome.reason is not None and "exceeded --memory-limit 419430400 B during build" in outcome.reason


def test_a_short_memory_spike_over_the_limit_is_oom(
    plugin_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The spike is freed long before the manager's next poll: the high-water mark still catches it."""
    monkeypatch.setenv("FAKE_HOG_BYTES", str(500 * 2**20))
    outcome = run_worker(cell("spike"), Settings(threads=1, max_time_s=0.2, memory_limit_bytes=400 * 2**20))
    assert outcome.status == "oom", outcome.reason
    assert outcome.reason is not None and "exceeded --memory-limit 419430400 B" in outcome.reason


def test_synchronisation_is_inside_the_timed_region(
    plugin_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Calls of ``slowsync`` return at once and their 5 ms happen in ``sync``: the median must show them."""
    monkeypatch.setenv("FAKE_SLEEP_S", "0.005")
    outcome = run_worker(cell("slowsync"), FAST)
    assert outcome.status == "ok", outcome.reason
    assert outcome.fields["median_s"] >= 0.005


def test_peak_memory_does_not_grow_with_the_number_of_samples(
    plugin_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thousands of samples (a target that is never met) must not inflate the measured peak."""
    monkeypatch.setenv("FAKE_SLEEP_S", "0")
    settings = Settings(threads=1, max_time_s=3, target_rel_ci=1e-9, min_block_s=1e-4)
    outcome = run_worker(cell("sleep"), settings)
    assert outcome.status == "ok" and len(outcome.samples) > 2000
    growth = outcome.fields["peak_memory_bytes"] - outcome.details["rss_before_timing_bytes"]
    assert growth < 8 * 2**20, growth


def test_allocation_error_is_oom_with_its_message(plugin_env: dict[str, str]) -> None:
    outcome = run_worker(cell("oom"), FAST)
    assert outcome.status == "oom"
    assert outcome.reason == "MemoryError during first_call: fake allocation failure"
    assert "Traceback" in outcome.details["traceback"]


def test_wrong_outputs_are_a_mismatch_and_not_timed(plugin_env: dict[str, str]) -> None:
    outcome = run_worker(cell("wrong"), FAST)
    assert outcome.status == "mismatch"
    assert outcome.samples == []
    assert outcome.reason is not None and outcome.reason.startswith("outputs differ from the reference: logits")


def test_sweep_goes_on_after_failures_and_stores_everything(plugin_env: dict[str, str], db_path: Path) -> None:
    cases = (cell("crash"), cell("oom"), cell("sleep"), Case("mlp", "missing:eager"))
    plan = Plan(cases, FAST)
    with Store.open(db_path) as store:
        run_id = store.create_run(plan, "test", {}, "0")
        execute(store, run_id, plan)
        statuses = {r.runtime: (r.status, r.reason) for r in store.results([run_id])}
    assert statuses["fake:crash"][0] == "error"
    assert statuses["fake:oom"][0] == "oom"
    assert statuses["fake:sleep"] == ("ok", None)
    assert statuses["missing:eager"][0] == "skipped"
    assert "fwbench_no_such_framework is not installed" in (statuses["missing:eager"][1] or "")


def test_parity_is_checked_once_per_pair_and_a_failure_stops_the_pair(
    plugin_env: dict[str, str], db_path: Path
) -> None:
    cases = (cell("wrong", 1), cell("wrong", 2), cell("sleep", 1), cell("sleep", 2))
    plan = Plan(cases, FAST)
    with Store.open(db_path) as store:
        run_id = store.create_run(plan, "test", {}, "0")
        outcomes = execute(store, run_id, plan)
    wrong_first, wrong_second, sleep_first, sleep_second = outcomes
    assert wrong_first.status == "mismatch" and "relative L2 error" in (wrong_first.reason or "")
    assert wrong_second.status == "mismatch" and "failed the parity check earlier" in (wrong_second.reason or "")
    assert wrong_second.details == {}  # never ran
    assert sleep_first.details["parity"]["ok"] and "parity_checked_by" not in sleep_first.details
    assert "parity" not in sleep_second.details
    assert sleep_second.details["parity_checked_by"] == sleep_first.case.key


def _worker_pids(marker: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes()
                environ = (proc / "environ").read_bytes()
            except OSError:
                continue
            if b"fwbench.runner.worker" in cmdline and marker.encode() in environ:
                pids.append(int(proc.name))
    return pids


def test_kill_9_mid_sweep_then_resume(
    plugin_env: dict[str, str], db_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The manager, a process of its own, killed with SIGKILL once 2 cells are stored: its worker dies with it, the
    store stays whole; the resumes (run here: what they do is the store's and the manager's) run the rest, then
    nothing."""
    marker = f"FWBENCH_TEST_MARKER={os.getpid()}-{time.time_ns()}"
    env = {**plugin_env, "FAKE_SLEEP_S": "0.01", marker.split("=")[0]: marker.split("=")[1]}
    cells = 5  # killed once 2 are stored (each later cell takes a worker's start and 0.3 s): the resume runs the rest
    batch_sizes = ",".join(str(b) for b in range(1, cells + 1))
    args = run_args(
        "--models", "mlp", "--runtimes", "fake:sleep", "--batch-sizes", batch_sizes, db=db_path, max_time=0.3
    )
    manager = subprocess.Popen(
        [sys.executable, "-m", "fwbench", *args],
        env=env,
        cwd=REPO_DIR,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        stored = 0
        while stored < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
            if db_path.exists():
                try:
                    with sqlite3.connect(db_path, timeout=5) as conn:
                        stored = conn.execute("SELECT COUNT(*) FROM results").fetchone()[0]
                except sqlite3.OperationalError:
                    stored = 0
        assert stored >= 2, "the sweep stored fewer than 2 cells in time"
    finally:  # also when the wait fails: no manager outlives the test
        manager.send_signal(signal.SIGKILL)
        manager.wait()
    deadline = time.monotonic() + 1.0  # the worker gets its parent-death signal at once, reaped a moment later
    while _worker_pids(marker.split("=")[1]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _worker_pids(marker.split("=")[1]) == [], "a worker outlived its manager"

    with Store.open(db_path) as store:
        assert store.integrity_ok()
        before = len(store.results())
        assert 2 <= before < cells
        run = store.get_run(1)
        assert run is not None and run.finished is None

    monkeypatch.setenv("FAKE_SLEEP_S", "0.01")
    capsys.readouterr()
    resumed = main(["run", "--resume", "1", "--db", str(db_path)])
    err = capsys.readouterr().err
    assert resumed == 0, err
    assert f"{cells - before} of {cells} cells to run" in err
    with Store.open(db_path) as store:
        rows = store.results()
        assert sorted(r.batch_size for r in rows) == list(range(1, cells + 1))
        assert all(r.status == "ok" for r in rows)
        run = store.get_run(1)
        assert run is not None and run.finished is not None
        assert len(store.runs()) == 1

    again = main(["run", "--resume", "1", "--db", str(db_path)])
    err = capsys.readouterr().err
    assert again == 0 and f"0 of {cells} cells to run" in err, err


def test_each_phase_is_found_by_name_in_its_own_module() -> None:
    from fwbench.runner.phases import PHASES, get_phase
    from fwbench.spec import PHASES as NAMES

    assert tuple(PHASES) == NAMES  # every name of spec.Phase has its phase object, in the same order
    for name in NAMES:
        phase = get_phase(name)
        assert phase.name == name
        assert type(phase).__module__ == f"fwbench.runner.phases.{name}"


def test_an_unknown_phase_is_a_clear_error() -> None:
    from fwbench.runner.phases import UnknownPhase, get_phase

    expected = (
        r"^phase 'ddp' is not implemented; implemented phases: inference, training, fit, data, serving, generate$"
    )
    with pytest.raises(UnknownPhase, match=expected):
        get_phase("ddp")
    assert issubclass(UnknownPhase, NotImplementedError)  # in a worker: status error, with this reason


def test_a_fit_sample_counts_the_flops_of_one_epoch() -> None:
    from fwbench.models import get_model
    from fwbench.runner.phases import get_phase

    settings = Settings(fit_samples=64)
    description = get_model("mlp")
    step = 3 * description.forward_flops(8, None)  # forward + backward of the MLP (it trains what it infers with)
    assert get_phase("fit").flops_per_call(description, Case("mlp", "torch:eager", "fit", 8), settings) == 8 * step
    training = Case("mlp", "torch:eager", "training", 8)
    assert get_phase("training").flops_per_call(description, training, settings) == step
