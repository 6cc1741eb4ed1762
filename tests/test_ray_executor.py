"""`fwbench run --executor ray` on a real local Ray cluster (benchmarks/ray_cluster.py: a head and one-CPU nodes, node i
pinned to CPU i, everything on 127.0.0.1): groups spread over the nodes, a node lost mid-group, the driver killed
and resumed, nothing listening off loopback, and the one-line refusals. The cluster tests need the machine's cores
to themselves (serial)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from conftest import REPO_DIR, listening_off_loopback
from fwbench.cli import main
from fwbench.store import ResultRecord, Store, StoreError
from ray_cluster import LocalCluster, local_cluster, processes_mentioning

GRID = ["--models", "mlp", "--runtimes", "torch:eager", "--threads", "1", "--rounds", "1"]
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


@pytest.mark.slow
@pytest.mark.serial
@TWO_CPUS
@pytest.mark.usefixtures("no_default_ray_folder")
def test_groups_spread_over_the_nodes_on_loopback_and_a_killed_driver_resumes(tmp_path: Path) -> None:
    with local_cluster(2) as cluster:
        db = tmp_path / "ray.db"
        driver = fwbench(cluster, *GRID, "--batch-sizes", "1,2,3,4", "--max-time", "0.3", "--db", str(db))
        off_loopback: set[str] = set()
        while driver.poll() is None:  # every process of the cluster and the sweep, while cells run
            pids = {p.pid for p in _tree(cluster.helper.pid) + _tree(driver.pid)}
            pids |= {p.pid for p in processes_mentioning(cluster.temp)}
            off_loopback.update(listening_off_loopback(pids))
            time.sleep(0.5)
        code, err = finish(driver)
        assert code == 0, err
        assert not off_loopback, off_loopback
        stored = rows(db)
        assert len(stored) == 4 and all(r.status == "ok" for r in stored), [(r.status, r.reason) for r in stored]
        assert len({r.details["ray"]["node_id"] for r in stored}) == 2  # both nodes ran groups
        assert len({r.hardware_id for r in stored}) == 1 and all(r.details["ray"]["attempt"] == 1 for r in stored)

        # the driver killed while groups run: what it stored stays, --resume runs the rest on the cluster
        db = tmp_path / "killed.db"
        driver = fwbench(cluster, *GRID, "--batch-sizes", "1,2,3,4,5,6", "--max-time", "2", "--db", str(db))
        deadline = time.monotonic() + 240
        while not (db.exists() and rows(db)) and time.monotonic() < deadline and driver.poll() is None:
            time.sleep(0.5)
        while not cluster_workers(cluster) and time.monotonic() < deadline and driver.poll() is None:
            time.sleep(0.1)  # a later group's worker runs: the check below has one to see end
        assert cluster_workers(cluster), "no worker of the cluster was seen running before the driver was killed"
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
        before = {r.case_key: r.id for r in rows(db)}
        assert 0 < len(before) < 6
        assert _wait_gone(cluster, 30) == []  # the dead driver's groups ended on the nodes, workers included
        resumed = subprocess.run(
            [sys.executable, "-m", "fwbench", "run", "--resume", "1", "--db", str(db), "--executor", "ray",
             "--ray-address", cluster.address],
            capture_output=True, text=True, env=cluster.env, cwd=REPO_DIR, timeout=300,
        )  # fmt: skip
        assert resumed.returncode == 0, resumed.stderr
        after = rows(db)
        assert len(after) == 6 and all(r.status == "ok" for r in after)
        assert {r.case_key: r.id for r in after if r.case_key in before} == before  # untouched


@pytest.mark.slow
@pytest.mark.serial
@TWO_CPUS
@pytest.mark.usefixtures("no_default_ray_folder")
def test_a_group_on_a_lost_node_is_retried_on_another_of_the_same_hardware_and_no_node_is_refused(
    tmp_path: Path,
) -> None:
    with local_cluster(2) as cluster:
        db = tmp_path / "lost.db"
        driver = fwbench(cluster, *GRID, "--batch-sizes", "1,2", "--max-time", "4", "--db", str(db))
        node_cpu = sorted(os.sched_getaffinity(0))[1 % len(os.sched_getaffinity(0))]
        deadline = time.monotonic() + 120
        seen = False
        while time.monotonic() < deadline and driver.poll() is None:  # node 2's group has a worker: kill the node
            workers = cluster_workers(cluster)
            seen = any(p.info["cmdline"][p.info["cmdline"].index("--cpus") + 1] == str(node_cpu) for p in workers)
            if seen:
                break
            time.sleep(0.2)
        assert seen, "no worker ran on node 2 before it was to be removed"
        cluster.remove(2)
        code, err = finish(driver)
        assert code == 0, err
        stored = rows(db)
        assert len(stored) == 2 and all(r.status == "ok" for r in stored), [(r.status, r.reason) for r in stored]
        assert sorted(r.details["ray"]["attempt"] for r in stored) == [1, 2]  # one group ran again
        assert len({r.details["ray"]["node_id"] for r in stored}) == 1  # both on the node that is left
        assert _wait_gone(cluster, 30) == []

        cluster.remove(1)  # no fwbench node left: refused before anything is written
        db = tmp_path / "none.db"
        code, err = finish(fwbench(cluster, *GRID, "--db", str(db)), timeout=120)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "fwbench_node" in err and not db.exists()


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
