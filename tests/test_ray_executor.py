"""`fwbench run --executor ray` on a real local Ray cluster (benchmarks/ray_cluster.py: a head and one-CPU nodes, node i
pinned to CPU i, everything on 127.0.0.1): the driver killed and resumed, a node lost mid-group, groups spread over
the nodes, nothing listening off loopback, and the one-line refusals. The executor is under test, not a framework:
the groups run the test plugin's numpy runtime (fake:sleep), and a node whose workers never end a call stands for a
group that is still running. The cluster test needs two CPUs in its affinity (serial)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from conftest import REPO_DIR, ended_on_exit, listening_off_loopback
from fwbench.cli import main
from fwbench.store import ResultRecord, Store, StoreError
from ray_cluster import LocalCluster, local_cluster, processes_mentioning

GRID = ["--models", "mlp", "--runtimes", "torch:eager", "--threads", "1", "--rounds", "1"]
# What the cluster tests run: the executor is under test, not a framework, so a worker that imports none (the test
# plugin's numpy runtime, which the nodes load through $FWBENCH_PLUGINS and $PYTHONPATH as the driver does).
FAKE_GRID = ["--models", "mlp", "--runtimes", "fake:sleep", "--threads", "1", "--rounds", "1"]
HANG = {"FAKE_SLEEP_S": "3600"}  # a node's fake:sleep workers never end a call: its group runs until it is ended
WORKER = "fwbench.runner.worker"
TWO_CPUS = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two nodes pinned to two different CPUs")


def cluster_workers(cluster: LocalCluster) -> list[psutil.Process]:
    """The fwbench workers of ``cluster``'s groups (their environment names its folder, as every process of the
    cluster's does), not those of other fwbench runs on the machine."""
    found = []
    for process in processes_mentioning(WORKER):
        try:
            if process.environ().get("RAY_TMPDIR") == cluster.temp:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def hung_workers(cluster: LocalCluster) -> list[psutil.Process]:
    """``cluster``'s running workers that never end a call: those of the node started with HANG."""
    found = []
    for process in cluster_workers(cluster):
        try:
            if process.environ().get("FAKE_SLEEP_S") == HANG["FAKE_SLEEP_S"] and _running(process):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def node_cpu(node: int) -> str:
    """The CPU benchmarks/ray_cluster.py pins node ``node`` (1-based) to: the (node − 1)-th of this process's, cyclic."""
    cpus = sorted(os.sched_getaffinity(0))
    return str(cpus[(node - 1) % len(cpus)])


def cpus_argument(worker: psutil.Process) -> str | None:
    """The ``--cpus`` a worker was started with (its node's pinning), None where it has none."""
    try:
        cmdline = worker.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return cmdline[cmdline.index("--cpus") + 1] if "--cpus" in cmdline else None


def _wait_gone(cluster: LocalCluster, seconds: float) -> list[psutil.Process]:
    """``cluster``'s workers still alive after up to ``seconds`` (zombies do not count)."""
    deadline = time.monotonic() + seconds
    while True:
        alive = [p for p in cluster_workers(cluster) if _running(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.5)


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def fwbench(cluster: LocalCluster, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "fwbench", "run", *args, "--executor", "ray", "--ray-address", cluster.address],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cluster.env,
        cwd=REPO_DIR,
        start_new_session=True,
    )


@contextmanager
def sweep(cluster: LocalCluster, *args: str) -> Iterator[subprocess.Popen[str]]:
    """``fwbench(cluster, *args)``, killed whole on the way out if still running (also when the test fails)."""
    with ended_on_exit(fwbench(cluster, *args)) as driver:
        yield driver


def finish(driver: subprocess.Popen[str], timeout: float = 300) -> tuple[int, str]:
    try:
        _, err = driver.communicate(timeout=timeout)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    return driver.returncode, err


def rows(db: Path) -> list[ResultRecord]:
    """The results stored in ``db`` so far (none while the driver is still creating it)."""
    try:
        with Store.open(db, readonly=True) as store:
            return store.results()
    except StoreError:
        return []


def _default_ray_folder() -> Path:
    """Where Ray puts its files when given no folder (ray._common.utils.get_default_ray_temp_dir)."""
    return Path(os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp") / "ray"


@pytest.fixture
def no_default_ray_folder() -> Iterator[None]:
    """The cluster keeps every file in its own folder: Ray's default one (/tmp/ray) is neither needed nor made."""
    folder = _default_ray_folder()
    existed = folder.exists()
    yield
    assert existed or not folder.exists(), f"{folder} was created"


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _kill_the_driver_while_node_3_runs_a_group(cluster: LocalCluster, db: Path) -> dict[str, int]:
    """A sweep of a group per node, its driver SIGKILLed while node 3's group runs: the groups nodes 1 and 2 stored
    stay (returned: case key → row id), and the dead driver's groups end on the nodes, workers included."""
    with sweep(cluster, *FAKE_GRID, "--batch-sizes", "1,2,3", "--max-time", "0.3", "--db", str(db)) as driver:
        deadline = time.monotonic() + 240
        while not (rows(db) and hung_workers(cluster)) and time.monotonic() < deadline and driver.poll() is None:
            time.sleep(0.2)  # node 1 or 2 stored its group; node 3's worker runs (the check below sees it end)
        assert hung_workers(cluster), "no worker of node 3 was seen running before the driver was killed"
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    before = {r.case_key: r.id for r in rows(db)}
    assert 0 < len(before) < 3
    assert _wait_gone(cluster, 30) == []
    return before


def _lose_node_3_mid_group_on_loopback(cluster: LocalCluster, db: Path) -> None:
    """A sweep of a group per node, node 3 removed while its group runs: that group runs again on a node of the same
    hardware, the sweep is stored whole; every process of the cluster and the sweep listens on loopback only."""
    off_loopback: set[str] = set()
    lost = False
    with sweep(cluster, *FAKE_GRID, "--batch-sizes", "1,2,3", "--max-time", "0.3", "--db", str(db)) as driver:
        deadline = time.monotonic() + 300
        while driver.poll() is None and time.monotonic() < deadline:  # while cells run
            pids = {p.pid for p in _tree(cluster.helper.pid) + _tree(driver.pid)}
            pids |= {p.pid for p in processes_mentioning(cluster.temp)}
            off_loopback.update(listening_off_loopback(pids))
            hung = hung_workers(cluster)
            if not lost and hung:  # node 3's group has a worker: kill the node
                assert {cpus_argument(worker) for worker in hung} == {node_cpu(3)}  # FWBENCH_NODE_CPUS pinned it
                cluster.remove(3)
                lost = True
            time.sleep(0.2)
        assert lost, "no worker ran on node 3 before it was to be removed"
        code, err = finish(driver)
    assert code == 0, err
    assert not off_loopback, off_loopback
    stored = rows(db)
    assert len(stored) == 3 and all(r.status == "ok" for r in stored), [(r.status, r.reason) for r in stored]
    assert sorted(r.details["ray"]["attempt"] for r in stored) == [1, 1, 2]  # one group ran again
    assert len({r.details["ray"]["node_id"] for r in stored}) == 2  # all on the nodes that are left
    assert len({r.hardware_id for r in stored}) == 1
    assert _wait_gone(cluster, 30) == []


@pytest.mark.slow
@pytest.mark.serial
@TWO_CPUS
@pytest.mark.usefixtures("no_default_ray_folder", "plugin_env")
def test_groups_spread_over_the_nodes_a_killed_driver_resumes_a_lost_nodes_group_is_retried_and_no_node_refuses(
    tmp_path: Path,
) -> None:
    """One cluster for every step (each start of one takes seconds): nodes 1 and 2, and node 3 (HANG), whose
    workers never end a call: its group is still running whenever a step needs one to be, until node 3 is lost. (On
    two CPUs node 3 shares node 1's: its workers only sleep.)"""
    with local_cluster(3, node_env={3: HANG}) as cluster:
        killed = tmp_path / "killed.db"
        before = _kill_the_driver_while_node_3_runs_a_group(cluster, killed)
        _lose_node_3_mid_group_on_loopback(cluster, tmp_path / "lost.db")

        resumed = subprocess.run(  # the killed sweep's rest, on nodes 1 and 2
            [sys.executable, "-m", "fwbench", "run", "--resume", "1", "--db", str(killed), "--executor", "ray",
             "--ray-address", cluster.address],
            capture_output=True, text=True, env=cluster.env, cwd=REPO_DIR, timeout=300,
        )  # fmt: skip
        assert resumed.returncode == 0, resumed.stderr
        after = rows(killed)
        assert len(after) == 3 and all(r.status == "ok" for r in after)
        assert {r.case_key: r.id for r in after if r.case_key in before} == before  # untouched
        # Groups spread over the idle nodes: each node got one group of the killed sweep, and the resumed one sent
        # its groups to nodes 1 and 2 (two of them where one of those two nodes had not stored its own).
        assert len({r.details["ray"]["node_id"] for r in after}) == 2  # both nodes ran groups
        assert len({r.hardware_id for r in after}) == 1 and all(r.details["ray"]["attempt"] == 1 for r in after)

        cluster.remove(1)
        cluster.remove(2)  # no fwbench node left: refused before anything is written
        none = tmp_path / "none.db"
        code, err = finish(fwbench(cluster, *FAKE_GRID, "--db", str(none)), timeout=120)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "fwbench_node" in err and not none.exists()


def test_an_unreachable_address_or_no_ray_is_one_line_and_nothing_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # free once closed: nothing listens there
    db = tmp_path / "r.db"
    args = ["run", *GRID, "--db", str(db), "--executor", "ray"]
    assert main([*args, "--ray-address", f"127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot reach" in err and not db.exists()
    assert main([*args, "--ray-address", "nonsense"]) == 2 and not db.exists()
    monkeypatch.setitem(sys.modules, "ray", None)  # Ray not installed
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "fwbench[ray]" in err.splitlines()[-1] and not db.exists()
    assert main(["run", *GRID, "--db", str(db), "--ray-address", "127.0.0.1:1"]) == 2  # without --executor ray
