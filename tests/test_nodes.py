"""One distributed cell across machines (``fwbench run --nnodes``), tested as the issue asks: two managers on this
machine as two nodes on 127.0.0.1, each pinned to a CPU of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from conftest import REPO_DIR, ended_on_exit, fwbench_here, run_cli
from fwbench.ranks import ENV_PREFIX, RankInfo, free_ports
from fwbench.runner.nodes import node_shares
from fwbench.spec import Case, Settings, SpecError, node_procs, node_threads
from fwbench.store import Store

TWO_CPUS = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU per node")
CPU_A, CPU_B = (sorted(os.sched_getaffinity(0)) * 2)[:2]  # node 0's and node 1's (two of those this process may use)
TRAINING = ["run", "--phase", "training", "--models", "mlp", "--runtimes", "torch:ddp", "--rounds", "1"]


def node_flags(rank: int, port: int, join_timeout: float = 60) -> list[str]:
    return [
        "--nnodes", "2", "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", str(port),
        "--join-timeout", f"{join_timeout:g}",
    ]  # fmt: skip


@contextmanager
def fwbench_process(args: list[str], cpu: int | None = None) -> Iterator[subprocess.Popen[str]]:
    """``python -m fwbench ARGS`` started in a session of its own (pinned to ``cpu``), Ctrl-C (SIGINT) reaching it as
    at a terminal; killed whole on the way out, also when the test fails."""

    def prepare() -> None:
        # An ignored signal stays ignored across exec, and Python then turns no SIGINT into KeyboardInterrupt: where
        # the tests run in the background without job control (`make test &` in a script, some CI runners), SIGINT
        # is ignored here and a node would go on to finish its cell.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})

    process = subprocess.Popen(
        [sys.executable, "-m", "fwbench", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=REPO_DIR, start_new_session=True, preexec_fn=prepare,
    )  # fmt: skip
    with ended_on_exit(process):
        yield process


def ranks_under(root: int) -> list[tuple[int, int]]:
    """The live rank workers under process ``root``: (rank, pid) pairs (the rank read from their environment)."""
    found = []
    try:
        children = psutil.Process(root).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    for process in children:
        try:
            env = process.environ()
            if f"{ENV_PREFIX}RANK" in env and process.status() != psutil.STATUS_ZOMBIE:
                found.append((int(env[f"{ENV_PREFIX}RANK"]), process.pid))
        except psutil.NoSuchProcess:
            continue
    return found


def rank_pids(root: int) -> dict[int, int]:
    """The live rank workers under process ``root``: rank → pid (one of them where two cells' ranks share a rank)."""
    return dict(ranks_under(root))


# -- no rank started ------------------------------------------------------------------------------------------
def test_a_cell_spreads_its_ranks_evenly_over_the_nodes() -> None:
    settings = Settings(nodes=2, rank_threads=1)
    four = Case("mlp", "torch:ddp", "training", 8, procs=4, scaling="weak")
    one = Case("mlp", "torch:ddp", "training", 8, procs=1, scaling="weak")
    assert (node_procs(four, settings), node_threads(four, settings)) == (2, 2)
    assert node_procs(one, settings) == 1  # a cell of one process runs on node 0
    assert [list(share) for share in node_shares(4, 2)] == [[0, 1], [2, 3]]
    assert [list(share) for share in node_shares(1, 2)] == [[0]]
    with pytest.raises(SpecError, match="--procs 3 spreads over --nnodes 2 machines evenly"):
        node_procs(Case("mlp", "torch:ddp", "training", 9, procs=3, scaling="weak"), settings)


def test_a_rank_across_machines_knows_every_host_and_its_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    info = RankInfo(3, 4, "10.0.0.1", (5000, 5001, 5002, 6001, 6002), None, ("10.0.0.1",) * 2 + ("10.0.0.2",) * 2, 1)
    env = info.environ()
    assert (env["RANK"], env["LOCAL_RANK"], env["MASTER_ADDR"], env["MASTER_PORT"]) == ("3", "1", "10.0.0.1", "5000")
    assert "GLOO_SOCKET_IFNAME" not in env and f"{ENV_PREFIX}RENDEZVOUS_FILE" not in env
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert RankInfo.current() == info
    assert [info.rank_address(r) for r in range(4)] == [
        "10.0.0.1:5001",
        "10.0.0.1:5002",
        "10.0.0.2:6001",
        "10.0.0.2:6002",
    ]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--procs", "2", "--nnodes", "2"], "give --master-addr HOST and --master-port P"),
        (["--procs", "1", "--master-addr", "127.0.0.1"], "--master-addr go(es) with --nnodes M"),
        (["--procs", "2", *node_flags(2, 29500)], "--node-rank 2 is not one of 0..1"),
        (["--procs", "3", "--batch-sizes", "3", *node_flags(0, 29500)], "--procs 3 spreads over --nnodes 2"),
        (["--procs", "1", *node_flags(0, 29500)], "the plan has none (give --procs)"),
        (["--procs", "2", "--executor", "ray", *node_flags(0, 29500)], "--executor ray spreads whole groups"),
    ],
)
def test_bad_node_flags_are_one_line_and_write_nothing(tmp_path: Path, flags: list[str], message: str) -> None:
    db = tmp_path / "x.db"
    result = run_cli(*TRAINING, "--rank-threads", "1", "--db", str(db), *flags, timeout=60)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not db.exists()


def test_a_node_that_never_comes_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    db = tmp_path / "x.db"
    node0 = run_cli(*TRAINING, "--procs", "2", "--rank-threads", "1", "--db", str(db), *node_flags(0, port, 1))
    assert node0.returncode == 2 and not db.exists(), node0.stderr
    assert node0.stderr.strip().splitlines() == [  # its progress line, then the one line that says why
        f"node 0 of 2: waiting for 1 node(s) at 127.0.0.1:{port}",
        f"fwbench: error: node(s) 1 of 2 did not join at 127.0.0.1:{port} within 1 s",
    ]
    node1 = run_cli("run", *node_flags(1, port, 1))
    assert node1.returncode == 2, node1.stderr
    assert node1.stderr.strip().splitlines() == [
        f"fwbench: error: node 0 at 127.0.0.1:{port} did not answer within 1 s (Connection refused)"
    ]


def test_a_node_given_another_plan_is_refused_on_both_sides(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    db = tmp_path / "x.db"
    plan = [*TRAINING, "--procs", "2", "--rank-threads", "1"]
    with fwbench_process([*plan, "--db", str(db), *node_flags(0, port, 30)]) as node0:
        node1 = run_cli(*plan, "--batch-sizes", "4", *node_flags(1, port, 30), timeout=60)
        _, err0 = node0.communicate(timeout=60)
    assert node0.returncode == 2 and node1.returncode == 2, (err0, node1.stderr)
    for err in (err0, node1.stderr):
        assert "node 1 was given another plan" in err.splitlines()[-1], err
    assert not db.exists()


# -- two managers, one cell across them -----------------------------------------------------------------------
def assert_one_cell_across_two_managers(
    db: Path, seen: set[int], node0: tuple[int | None, str], node1: tuple[int | None, str]
) -> None:
    """What node 0 stored of a ``--procs 1,2`` sweep across two managers (node 0 on CPU_A, node 1 on CPU_B), and how
    both managers ended; ``seen``: every rank either started."""
    assert len(seen) >= 3, seen  # 1-process cell's rank 0, the 2-process cell's rank 0 and, on node 1, rank 1
    assert all(not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE for pid in seen)
    assert node0[0] == 0, node0[1]
    assert node1[0] == 0, node1[1]
    assert "node 1 of 2: node 0 finished the sweep; served 1 rank set(s) of 1 cell(s)" in node1[1]
    with Store.open(db, readonly=True) as store:
        rows = {row.procs: row for row in store.results()}
        (run,) = store.runs()
    assert set(rows) == {1, 2} and all(row.status == "ok" for row in rows.values()), rows
    one, two = rows[1], rows[2]
    assert one.schedule == two.schedule == "interleaved" and one.group_key == two.group_key
    assert one.details["rendezvous"]["store"] == "file" and [n["node"] for n in one.details["rendezvous"]["nodes"]] == [
        0
    ]
    meeting = two.details["rendezvous"]
    assert meeting["store"] == "tcp" and meeting["address"] == "127.0.0.1"
    assert meeting["nodes"] == [
        {"node": 0, "host": "127.0.0.1", "ranks": [0]},
        {"node": 1, "host": "127.0.0.1", "ranks": [1]},
    ]
    assert [(r["rank"], r["node"], r["cpus"]) for r in two.details["ranks"]] == [(0, 0, [CPU_A]), (1, 1, [CPU_B])]
    assert two.details["cpus"] == [CPU_A]  # this machine's CPUs only; node 1's are in its rank's entry
    assert two.peak_memory_bytes == sum(r["peak_memory_bytes"] for r in two.details["ranks"])
    assert two.global_batch == 8 and two.parity is not None and two.parity.passed
    assert len(two.details["distributed"]["allreduce_s"]) == 10
    assert [node["node_rank"] for node in run.environment["cluster_nodes"]] == [1]
    assert (one.nodes, two.nodes) == (1, 2)


@pytest.mark.serial
@TWO_CPUS
def test_a_node_lost_mid_cell_stops_the_sweep_and_two_managers_resume_it_across_them_and_node_0_stores_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Node 1's manager (started with the same plan flags) SIGKILLed, as a machine goes down, while its rank of the
    2-process cell starts: node 0 kills its own ranks, stores nothing of the group, says how to resume and exits 1.
    Resumed with a new node 1 (started bare): node 0 (its CPU) runs the 1-process cell alone and rank 0 of the
    2-process cell, node 1 (another CPU) rank 1. Both cells ok, interleaved, stored once by node 0; no rank is left.
    One sweep for both (a cell across two managers takes seconds to run)."""
    (port,) = free_ports(1)
    db = tmp_path / "nodes.db"
    plan = [*TRAINING, "--procs", "1,2", "--rank-threads", "1", "--batch-sizes", "4", "--max-time", "0.3"]
    with (
        fwbench_process([*plan, "--db", str(db), *node_flags(0, port)], cpu=CPU_A) as node0,
        fwbench_process([*plan, *node_flags(1, port)], cpu=CPU_B) as node1,
    ):
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not (rank_pids(node0.pid) and rank_pids(node1.pid)):
            time.sleep(0.1)
        local, remote = ranks_under(node0.pid), ranks_under(node1.pid)  # node 0: the cells' ranks 0 started so far
        assert ({rank for rank, _ in local}, [rank for rank, _ in remote]) == ({0}, [1]), (local, remote)
        os.killpg(node1.pid, signal.SIGKILL)  # node 1's manager and its rank
        _, err0 = node0.communicate(timeout=120)
    assert node0.returncode == 1, err0
    assert err0.strip().splitlines()[-1] == (
        "fwbench: node 1 (127.0.0.1) is gone: it closed the connection; the sweep stops; finished cells are stored; "
        f"continue with `fwbench run --resume 1 --db {db} --master-addr 127.0.0.1 --master-port {port} (and the "
        "other nodes)`"
    )
    for _, pid in local + remote:  # node 0 killed its own ranks; node 1's died with its manager
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    with Store.open(db, readonly=True) as store:
        assert store.results() == []  # not an error to keep: the group is still to run

    (port,) = free_ports(1)
    resume = ["run", "--resume", "1", "--db", str(db), "--master-addr", "127.0.0.1", "--master-port", str(port)]
    seen: set[int] = set()
    with (
        fwbench_process(resume, cpu=CPU_A) as node0,
        fwbench_process(["run", *node_flags(1, port)], cpu=CPU_B) as node1,
    ):
        deadline = time.monotonic() + 300
        while node0.poll() is None and time.monotonic() < deadline:  # every rank either node starts
            seen.update(pid for _, pid in ranks_under(node0.pid) + ranks_under(node1.pid))
            time.sleep(0.2)
        _, err0 = node0.communicate(timeout=60)
        _, err1 = node1.communicate(timeout=60)
    assert_one_cell_across_two_managers(db, seen, (node0.returncode, err0), (node1.returncode, err1))
    code, report, err = fwbench_here(capsys, "report", "--db", str(db), "--format", "markdown")  # no interpreter start
    assert code == 0, err
    assert "| 2 weak/2 nodes |" in report, report


@pytest.mark.serial
@TWO_CPUS
def test_an_interrupted_node_0_stops_the_other_nodes_with_status_1(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    plan = [*TRAINING, "--procs", "2", "--rank-threads", "1", "--batch-sizes", "8", "--max-time", "30"]
    with (
        fwbench_process([*plan, "--db", str(tmp_path / "x.db"), *node_flags(0, port)], cpu=CPU_A) as node0,
        fwbench_process(["run", *node_flags(1, port)], cpu=CPU_B) as node1,
    ):
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not rank_pids(node1.pid):
            time.sleep(0.2)
        remote = rank_pids(node1.pid)
        assert list(remote) == [1], remote
        # The cell's ranks have only just started: timing alone takes at least 20 s (--max-time 30: up to 400
        # blocks of at least 50 ms, or 5 longer ones), so node 0 is still running it when the signal lands.
        assert node0.poll() is None, node0.communicate()[1]
        os.kill(node0.pid, signal.SIGINT)  # Ctrl-C on node 0
        _, err0 = node0.communicate(timeout=60)
        _, err1 = node1.communicate(timeout=60)
    assert node0.returncode == 130, err0
    assert f"--master-addr 127.0.0.1 --master-port {port} (and the other nodes)" in err0
    assert node1.returncode == 1, err1
    assert "node 1 of 2: node 0 was interrupted; served 1 rank set(s) of 1 cell(s)" in err1
    assert not psutil.pid_exists(remote[1]) or psutil.Process(remote[1]).status() == psutil.STATUS_ZOMBIE
