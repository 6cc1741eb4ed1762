"""Data-parallel training (``--procs``): a distributed cell runs as N ranks on disjoint cores that answer the manager
as one (fwbench.runner.rankset), N processes take the 1-process step on the global batch (verify --procs), faults
end the cell with the rank named and no process left, nothing listens off loopback, and bad input is one line.

The tests that start ranks need two CPUs in their affinity (serial); the refusals and the rank-set arithmetic run in
the parallel part."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from conftest import REPO_DIR, listening_off_loopback, run_args, run_cli
from fwbench.frameworks import distributed_runtimes, get_runtime
from fwbench.models import get_model
from fwbench.ranks import ENV_PREFIX, rank_rows
from fwbench.runner.interleave_start import start_order
from fwbench.runner.rankset import RankSet, combine, combine_results
from fwbench.runner.scheduler import run_group
from fwbench.runner.verify import TrainingCheck, distributed_parity_unsupported, verify_training
from fwbench.spec import Case, Scaling, Settings, SpecError, group_key
from fwbench.store import Store

TWO_CPUS = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two ranks on two different CPUs")
TRAINING = ["run", "--phase", "training", "--models", "mlp", "--runtimes", "torch:ddp", "--rounds", "1"]


def rank_processes(root: int) -> dict[int, psutil.Process]:
    """The live rank workers under process ``root``, by rank (read from their environment)."""
    found = {}
    for process in psutil.Process(root).children(recursive=True):
        try:
            env = process.environ()
            if f"{ENV_PREFIX}RANK" in env and process.status() != psutil.STATUS_ZOMBIE:
                found[int(env[f"{ENV_PREFIX}RANK"])] = process
        except psutil.NoSuchProcess:
            continue
    return found


# -- no rank started ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--procs", "0", "--threads", "1"], "--procs '0': every value must be a positive integer"),
        (["--procs", "2", "--threads", "1"], "--threads 1 is a cell's total budget and 2 processes do not divide it"),
        (["--procs", "64", "--rank-threads", "1"], "--procs 64 with 1 thread(s) each needs 64 CPUs"),
        (
            ["--procs", "2", "--phase", "inference"],
            "--procs runs phases training and fit as several processes, not phase inference",
        ),
        (["--procs", "2", "--runtimes", "torch:eager"], "torch:eager runs as one process"),
        (["--runtimes", "torch:ddp"], "torch:ddp runs as several processes: give --procs"),
        (["--procs", "2", "--scaling", "linear"], "unknown scaling 'linear'; allowed: weak, strong"),
        (["--procs", "2", "--scaling", "strong", "--batch-sizes", "3"], "strong scaling splits the global batch 3"),
        (["--procs", "2", "--runtimes", "horovod:torch"], "runtime horovod:torch is not available: Horovod"),
        (
            ["--procs", "2", "--phase", "fit", "--rank-threads", "1", "--batch-sizes", "32", "--fit-samples", "96"],
            "phase fit: the global batch 64 (2 processes) does not divide the 96 fit samples",
        ),
    ],
)
def test_bad_distributed_input_is_one_line_and_writes_nothing(tmp_path: Path, flags: list[str], message: str) -> None:
    db = tmp_path / "x.db"
    args = [*TRAINING, "--db", str(db)]
    for flag, value in zip(flags[::2], flags[1::2]):  # a flag given here replaces the default one
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    result = run_cli(*args, timeout=60)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not db.exists()


def test_verify_procs_refusals() -> None:
    base = ["verify", "--phase", "training", "--models", "mlp"]
    for extra, message in [
        (["--runtimes", "torch:ddp", "--procs", "1"], "--procs 1: give 2 or more"),
        (["--runtimes", "torch:eager", "--procs", "2"], "torch:eager runs as one process"),
        (["--runtimes", "torch:ddp"], "torch:ddp runs as several processes: give --procs"),
        (["--runtimes", "torch:ddp", "--procs", "2", "--batch-size", "3"], "does not divide mlp's global batch 3"),
    ]:
        result = run_cli(*base, *extra, timeout=60)
        assert result.returncode == 2 and message in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


def test_cases_read_the_batch_by_their_scaling_and_share_a_group_across_process_counts() -> None:
    weak = [Case("bert-tiny", "torch:ddp", "training", 4, 16, procs=n, scaling="weak") for n in (1, 2)]
    strong = [Case("bert-tiny", "torch:ddp", "training", 4, 16, procs=n, scaling="strong") for n in (1, 2)]
    assert [c.global_batch for c in weak] == [4, 8] and [c.rank_batch for c in weak] == [4, 4]
    assert [c.global_batch for c in strong] == [4, 4] and [c.rank_batch for c in strong] == [4, 2]
    assert len({group_key(c) for c in weak}) == 1 and len({group_key(c) for c in strong}) == 1  # interleaved together
    assert group_key(weak[0]) != group_key(strong[0])
    assert len({c.key for c in weak + strong}) == 4
    assert (
        group_key(Case("mlp", "torch:eager"))
        == "model=mlp|phase=inference|batch_size=1|seq_len=None|dtype=fp32|device=cpu"
    )
    with pytest.raises(SpecError, match="both a process count and a scaling"):
        Case("mlp", "torch:ddp", "training", procs=2)
    assert [rank_rows(r, 2, 8) for r in (0, 1)] == [slice(0, 4), slice(4, 8)]


def test_a_rounds_start_order_keeps_each_runtimes_process_counts_together() -> None:
    """A split of the round for memory cuts the start order: a runtime's 1- and 2-process cells are adjacent in it,
    whatever the seed, so they are measured in one sub-group and their blocks pair."""
    runtimes = ["torch:ddp", "jax:distributed", "tensorflow:multiworker"]
    cases = [Case("bert-tiny", r, "training", 8, 16, procs=n, scaling="weak") for r in runtimes for n in (1, 2)]
    orders = set()
    for seed in range(20):
        order = [case.runtime for case in start_order(cases, np.random.default_rng(seed))]
        assert all(order[i] == order[i + 1] for i in (0, 2, 4)), order
        orders.add(tuple(order[::2]))
    assert len(orders) > 1  # the runtimes' order is still the seed's
    single = [Case("mlp", r, "inference", 1) for r in ("torch:eager", "jax:jit", "tensorflow:function")]
    assert sorted(c.runtime for c in start_order(single, np.random.default_rng(0))) == sorted(c.runtime for c in single)


def test_another_worker_fits_by_its_own_process_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """A live 2-process cell's peak is its processes' sum: what a 1-process cell needs next is one process's share
    of it (× the headroom), what a 2-process cell needs is the sum."""
    from fwbench.runner import interleave_start

    two = Case("bert-base", "torch:ddp", "training", 8, 128, procs=2, scaling="weak")
    # no worker process (None): what fits reads only a live cell's case and peak
    live = [interleave_start.LiveWorker(two, None, 1, 1.0, 8 * 2**30)]  # type: ignore[arg-type]
    monkeypatch.setattr(interleave_start, "memory_available_bytes", lambda: 11 * 2**30)
    assert interleave_start._fits_another(live, Settings(), procs=1)  # 1.5 × 4 GiB < 11 GiB
    assert not interleave_start._fits_another(live, Settings(), procs=2)  # 1.5 × 8 GiB > 11 GiB
    # a runtime's cells start in one sub-group or the next: memory for all of them before its first one starts
    jax = [Case("bert-base", "jax:distributed", "training", 8, 128, procs=n, scaling="weak") for n in (1, 2)]
    assert interleave_start._processes_needed(jax, live, Settings()) == 3
    started = [*live, interleave_start.LiveWorker(jax[0], None, 1, 1.0, 4 * 2**30)]  # type: ignore[arg-type]
    assert interleave_start._processes_needed(jax[1:], started, Settings()) == 2
    single = [Case("mlp", "torch:eager", "inference", 1)]
    assert interleave_start._processes_needed(single, [], Settings()) == 1


def test_a_rank_set_answers_as_its_slowest_rank_and_sums_memory() -> None:
    blocks = [{"seconds": 0.10, "calls": 4, "start_unix_s": 5.0}, {"seconds": 0.12, "calls": 4, "start_unix_s": 4.9}]
    assert combine("block", blocks) == {"seconds": 0.12, "calls": 4, "start_unix_s": 4.9, "rank_seconds": [0.10, 0.12]}
    assert combine("ready", [{"peak_memory_bytes": 3}, {"peak_memory_bytes": 4}]) == {"peak_memory_bytes": 7}
    results = [
        {"status": "ok", "peak_memory_bytes": 10, "cpus": [0], "thread_cpu_lists": ["0"], "first_call_s": 1.0},
        {"status": "error", "reason": "boom", "peak_memory_bytes": 20, "cpus": [1], "thread_cpu_lists": ["1"]},
    ]
    combined = combine_results(results)
    assert combined["status"] == "error" and combined["reason"] == "rank 1 of 2: boom"
    assert combined["peak_memory_bytes"] == 30 and combined["cpus"] == [0, 1]
    assert [r["rank"] for r in combined["ranks"]] == [0, 1] and combined["thread_cpu_lists"] == ["0", "1"]


# -- ranks started (two CPUs in the affinity) ---------------------------------------------------------------
@pytest.mark.serial
@TWO_CPUS
def test_two_ranks_are_stored_as_one_interleaved_cell_and_listen_only_on_loopback(tmp_path: Path) -> None:
    db = tmp_path / "ddp.db"
    args = [*TRAINING, "--procs", "1,2", "--threads", "2", "--batch-sizes", "4", "--max-time", "0.3", "--db", str(db)]
    run = subprocess.Popen(
        [sys.executable, "-m", "fwbench", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=REPO_DIR, start_new_session=True,
    )  # fmt: skip
    off_loopback: set[str] = set()
    seen_ranks = 0
    try:
        while run.poll() is None:  # the whole sweep's processes, every half second while it runs
            try:
                tree = [psutil.Process(run.pid), *psutil.Process(run.pid).children(recursive=True)]
            except psutil.NoSuchProcess:
                break
            seen_ranks = max(seen_ranks, len(rank_processes(run.pid)))
            off_loopback.update(listening_off_loopback({p.pid for p in tree}))
            time.sleep(0.5)
        _, err = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    assert run.returncode == 0, err
    assert not off_loopback, off_loopback
    assert seen_ranks == 2
    with Store.open(db, readonly=True) as store:
        rows = {row.procs: row for row in store.results()}
    assert set(rows) == {1, 2} and all(row.status == "ok" for row in rows.values()), rows
    one, two = rows[1], rows[2]
    assert one.schedule == two.schedule == "interleaved" and one.group_key == two.group_key
    assert (one.global_batch, two.global_batch) == (4, 8) and two.threads == 2
    ranks = two.details["ranks"]
    assert [r["cpus"] for r in ranks] in ([[0], [1]], [[1], [0]]) or len({tuple(r["cpus"]) for r in ranks}) == 2
    assert two.peak_memory_bytes == sum(r["peak_memory_bytes"] for r in ranks)
    assert two.details["training"]["samples_per_step"] == 8
    assert two.details["distributed"]["allreduce_elements"] > 0 and len(two.details["distributed"]["allreduce_s"]) == 10
    assert two.parity is not None and two.parity.passed  # the global loss of both ranks' rows is the reference's
    # the two cells' rank sets were started one after the other: each chose its own free ports
    assert set(one.details["rendezvous"]["ports"]).isdisjoint(two.details["rendezvous"]["ports"])
    assert rank_processes(os.getpid()) == {}


@pytest.mark.serial
@TWO_CPUS
@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_a_killed_or_hung_rank_ends_the_cell_and_leaves_no_process(fault: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 faulted once the ranks step (the set's first timed block sent: every rank imported, built, warmed up).
    SIGKILL: rank 1 dies, rank 0 loses its peer in the all-reduce: the cell is ``error`` naming rank 1. SIGSTOP: rank
    1 stops answering, rank 0 waits for it in its all-reduce: the cell is ``timeout``. Either way no rank survives.
    The manager runs here (run_group), so the fault lands at that point of the manager's own calls, whatever the
    machine's speed."""
    case = Case("mlp", "torch:ddp", "training", 8, procs=2, scaling="weak")
    # stop: the cell can only time out once rank 1 stops, so a shorter --timeout keeps the test short
    settings = (
        Settings(threads=2, max_time_s=20, timeout_s=40)
        if fault == "kill"
        else Settings(threads=2, max_time_s=4, timeout_s=8)
    )
    faulted: list[int] = []
    command = RankSet.command

    def command_then_fault(self: RankSet, name: str, **fields: Any) -> None:
        command(self, name, **fields)
        if name == "block" and not faulted:  # the first timed block (the set's calibration): the ranks step
            (pid,) = self.ranks[1].pids
            os.kill(pid, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
            faulted.append(pid)

    monkeypatch.setattr(RankSet, "command", command_then_fault)
    started = time.monotonic()
    (outcome,) = run_group([case], settings, {case.key: False})
    assert faulted, "the rank was never seen"
    if fault == "kill":
        assert outcome.status == "error", outcome.reason
        assert outcome.reason is not None and outcome.reason.startswith("rank 1 of 2: worker killed by SIGKILL")
    else:
        assert outcome.status == "timeout", outcome.reason
        assert outcome.reason is not None and "exceeded --timeout 8 s during " in outcome.reason
    assert time.monotonic() - started < 120
    assert rank_processes(os.getpid()) == {}
    assert not psutil.pid_exists(faulted[0]) or psutil.Process(faulted[0]).status() == psutil.STATUS_ZOMBIE


@pytest.mark.serial
@TWO_CPUS
def test_a_fit_of_two_processes_is_the_fit_of_one_and_keras_fit_is_skipped_with_its_reason(tmp_path: Path) -> None:
    """--phase fit --procs 1,2 --scaling strong: torch:ddp's DistributedSampler loop over 2 processes trains what 1
    process does (the same epoch losses and final loss); keras:tensorflow's model.fit under MultiWorkerMirroredStrategy
    is stored skipped with keras-team/keras#20585's reason."""
    db = tmp_path / "fit.db"
    result = run_cli(
        *run_args(
            "--phase", "fit", "--models", "mlp", "--runtimes", "torch:ddp,keras:tensorflow", "--procs", "1,2",
            "--scaling", "strong", "--rank-threads", "1", "--batch-sizes", "32", "--epochs", "2",
            "--fit-samples", "256", db=db, threads=None,
        )
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    with Store.open(db, readonly=True) as store:
        rows = {(row.runtime, row.procs): row for row in store.results()}
    assert {key: row.status for key, row in rows.items()} == {
        ("torch:ddp", 1): "ok", ("torch:ddp", 2): "ok", ("keras:tensorflow", 1): "skipped",
        ("keras:tensorflow", 2): "skipped",
    }  # fmt: skip
    assert "keras-team/keras#20585" in (rows[("keras:tensorflow", 2)].reason or "")
    one, two = rows[("torch:ddp", 1)].details["fit"], rows[("torch:ddp", 2)].details["fit"]
    assert one["steps_per_epoch"] == two["steps_per_epoch"] == 8 and two["global_batch"] == 32
    assert two["epoch_loss"] == pytest.approx(one["epoch_loss"], rel=1e-5)
    assert two["final_loss"] == pytest.approx(one["final_loss"], rel=1e-5)


@pytest.mark.serial
@TWO_CPUS
def test_two_processes_take_the_one_process_step() -> None:
    """verify --procs 2: after 3 AdamW steps, torch:ddp's 2 processes on rows of bert-tiny's global batch hold the
    parameters of 1 process on all of it (the masked-LM loss's weight sum is the global one). Every other runtime:
    the matrix."""
    settings = Settings(threads=2, rank_threads=1, timeout_s=300)
    checks = verify_training("bert-tiny", ["torch:ddp"], settings, steps=3, batch_size=4, procs=2)
    assert_takes_the_one_process_step(checks, "torch:ddp")


def test_per_process_batch_norm_is_not_parity_checked_with_its_reason() -> None:
    """torch:ddp and tensorflow:multiworker normalise each process's rows on their own: their ResNet step is not
    the 1-process step (verify --procs skips it, saying why); the JAX runtimes normalise over the global batch."""
    assert distributed_parity_unsupported(get_model("resnet-tiny")) is not None
    assert "batch norm" in (distributed_parity_unsupported(get_model("resnet-tiny")) or "")
    assert distributed_parity_unsupported(get_model("bert-tiny")) is None
    assert {name for name in distributed_runtimes() if get_runtime(name).global_batch_norm} == {
        "jax:distributed",
        "keras:jax-dataparallel",
    }


def assert_takes_the_one_process_step(checks: list[TrainingCheck], runtime: str) -> None:
    assert [(c.procs, c.status) for c in checks] == [(1, "ok"), (2, "ok")], [(c.status, c.reason) for c in checks]
    assert all(c.passed for c in checks), [c.failure() for c in checks]
    assert checks[1].against == f"{runtime} in 1 process"
    assert checks[1].params_rel_l2 is not None and checks[1].params_rel_l2 < 1e-3
    assert checks[1].loss_rel is not None and checks[1].loss_rel < 1e-5


@pytest.mark.matrix
@pytest.mark.serial
@TWO_CPUS
@pytest.mark.parametrize(
    ("model", "runtime"),
    [
        ("mlp", "torch:ddp-compile"),
        ("resnet-tiny", "keras:jax-dataparallel"),
        ("bert-tiny", "tensorflow:multiworker"),
        # batch norm over the global batch; jax:distributed's masked-LM loss over the global weight sum: bert-tiny's
        # loss parity in test_every_distributed_runtime_is_timed_beside_its_one_process_cell
        ("resnet-tiny", "jax:distributed"),
    ],
)
def test_every_distributed_runtime_takes_the_one_process_step(model: str, runtime: str) -> None:
    settings = Settings(threads=2, rank_threads=1, timeout_s=600)
    checks = verify_training(model, [runtime], settings, steps=3, batch_size=4, procs=2)
    assert_takes_the_one_process_step(checks, runtime)


@pytest.mark.matrix
@pytest.mark.serial
@TWO_CPUS
@pytest.mark.parametrize("runtime", ["tensorflow:multiworker", "jax:distributed", "keras:jax-dataparallel"])
def test_every_distributed_runtime_is_timed_beside_its_one_process_cell(runtime: str) -> None:
    """1 and 2 processes of bert-tiny interleaved in one group: both ok, parity passed, the bare all-reduce timed."""
    cases = [Case("bert-tiny", runtime, "training", 4, 16, procs=n, scaling="weak") for n in (1, 2)]
    settings = Settings(threads=2, rank_threads=1, max_time_s=1, timeout_s=300)
    outcomes = run_group(cases, settings, {case.key: True for case in cases})
    assert [o.status for o in outcomes] == ["ok", "ok"], [o.reason for o in outcomes]
    for outcome in outcomes:
        assert outcome.details["parity"]["ok"] is True
        assert outcome.details["distributed"]["procs"] == outcome.case.procs
        assert len(outcome.details["distributed"]["allreduce_s"]) == 10
        # the barrier before each block traces/compiles once (JAX), before the timed loop's counters
        assert outcome.details["compile_health"]["recompiled_in_timed_loop"] is False, outcome.details["compile_health"]
    assert len(outcomes[1].details["ranks"]) == 2 and outcomes[1].fields["schedule"] == "interleaved"


def test_reports_keep_process_counts_apart_and_show_scaling(tmp_path: Path) -> None:
    """Stored 1- and 2-process cells (weak and strong): the efficiency is t₁/t₂ (weak) and t₁/(2·t₂) (strong) of
    the paired blocks, samples/s counts the global batch, and every table, comparison and export keeps the process
    counts apart."""
    from fwbench.report.compare import compare_results
    from fwbench.report.export import spreadsheet_tables, to_csv
    from fwbench.report.scaling import scaling_rows
    from fwbench.report.throughput import throughput
    from report_store import Cell, add_run, timed

    def cell(procs: int, scaling: Scaling, seconds: float) -> Cell:
        case = Case("mlp", "torch:ddp", "training", 8, procs=procs, scaling=scaling)
        return Cell(case, timed(seconds, seed=procs), details={"distributed": {"allreduce_median_s": 0.001}})

    cells = [cell(1, "weak", 0.010), cell(2, "weak", 0.0125), cell(1, "strong", 0.010), cell(2, "strong", 0.0100)]
    with Store.open(tmp_path / "r.db") as store:
        first = add_run(store, cells)
        second = add_run(store, cells)
        rows = store.results([first])
        later = store.results([second])
    by_key = {(row.procs, row.scaling): row for row in rows}
    weak, strong = by_key[(2, "weak")], by_key[(2, "strong")]
    assert weak.median_s is not None and throughput(weak)[0] == pytest.approx(16 / weak.median_s)
    assert strong.median_s is not None and throughput(strong)[0] == pytest.approx(8 / strong.median_s)
    scaled = {item.row.scaling: item for item in scaling_rows(rows)}
    assert set(scaled) == {"weak", "strong"}
    assert scaled["weak"].efficiency is not None and scaled["weak"].efficiency[0] == pytest.approx(0.8, rel=0.02)
    assert scaled["strong"].efficiency is not None and scaled["strong"].efficiency[0] == pytest.approx(0.5, rel=0.02)
    assert scaled["weak"].single.procs == 1 and scaled["weak"].single.scaling == "weak"
    changes = compare_results(rows, later, first, second)
    assert len(changes.cells) == 4 and {(c.procs, c.scaling) for c in changes.cells} == set(by_key)
    assert set(spreadsheet_tables(rows)) == {
        "mlp_torch_ddp_p1_weak.csv", "mlp_torch_ddp_p2_weak.csv", "mlp_torch_ddp_p1_strong.csv",
        "mlp_torch_ddp_p2_strong.csv",
    }  # fmt: skip
    header = to_csv(rows).splitlines()[0].split(",")
    assert header[6:9] == ["workers", "procs", "scaling"]
