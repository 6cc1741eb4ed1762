"""A local Ray cluster on one machine for the Ray executor's tests and benchmarks/ray_sweep.py.

:func:`local_cluster` runs this file as its own process (``python benchmarks/ray_cluster.py TEMP_DIR NODES NODE_ENV``),
which starts a head node without fwbench's resource (it runs no group) and NODES nodes with ``fwbench_node: 1`` and
one CPU each, node i pinned to CPU i (``FWBENCH_NODE_CPUS``; two nodes share a core only where there are more nodes
than CPUs) and given the variables NODE_ENV (JSON: node number → variables) names for it, e.g. what a test wants one
node's workers to see; everything on 127.0.0.1, no dashboard, autoscaler or log monitor, a lost node declared dead
within seconds, Ray's files under TEMP_DIR (``RAY_TMPDIR``, for the helper and for what runs with
:attr:`LocalCluster.env`: nothing goes to /tmp/ray) and its token under a temporary HOME. The process prints
``address HOST:PORT`` when ready, then obeys one command per line on stdin: ``remove I`` (node I, 1-based, dies as a
lost machine would; answers ``removed I``). End of input shuts the cluster down.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

REPO_DIR = Path(__file__).resolve().parent.parent


@dataclass
class LocalCluster:
    """A running local cluster: the head's address, the helper process, the environment to reach it with."""

    address: str
    helper: subprocess.Popen[str]
    env: dict[str, str]
    temp: str  # Ray's files: every process of the cluster names it (or descends from the helper)

    def remove(self, node: int) -> None:
        """Kill node ``node`` (1-based) as a lost machine dies; returns once Ray has removed it."""
        assert self.helper.stdin is not None and self.helper.stdout is not None
        self.helper.stdin.write(f"remove {node}\n")
        self.helper.stdin.flush()
        assert self.helper.stdout.readline().strip() == f"removed {node}"


def processes_mentioning(text: str) -> list[psutil.Process]:
    """Every process whose command line has an argument containing ``text``."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if any(text in part for part in process.info["cmdline"] or ()):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


@contextmanager
def local_cluster(nodes: int, node_env: Mapping[int, Mapping[str, str]] | None = None) -> Iterator[LocalCluster]:
    """A head and ``nodes`` fwbench nodes in a helper process; everything it started ends when the block does.
    ``node_env``: node I (1-based) → variables its processes (its groups' workers included) get besides this
    process's environment."""
    temp = tempfile.mkdtemp(prefix="fwray-", dir="/tmp")  # short: Ray's socket paths must stay under 107 bytes
    home = tempfile.mkdtemp(prefix="fwray-home-")  # Ray's token and caches, never the user's HOME
    env = {**os.environ, "HOME": home, "RAY_USAGE_STATS_ENABLED": "0", "RAY_TMPDIR": temp}
    per_node = json.dumps({str(node): dict(variables) for node, variables in (node_env or {}).items()})
    helper = subprocess.Popen(
        [sys.executable, __file__, temp, str(nodes), per_node],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO_DIR,
        start_new_session=True,
    )
    try:
        assert helper.stdout is not None
        line = helper.stdout.readline()
        if not line.startswith("address "):
            raise RuntimeError(f"the local Ray cluster did not start: {line!r}")
        yield LocalCluster(line.split()[1], helper, env, temp)
    finally:
        if helper.stdin is not None:
            helper.stdin.close()
        try:
            helper.wait(60)
        except subprocess.TimeoutExpired:
            helper.kill()
            helper.wait()
        for process in processes_mentioning(temp):  # whatever Ray left of this cluster
            process.kill()
        shutil.rmtree(temp, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)


def serve(temp: str, count: int, node_env: Mapping[str, Mapping[str, str]] | None = None) -> None:
    """The helper process: start the cluster (``node_env``: node "I" → its extra variables), print its address, obey
    stdin, shut down at its end."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # loopback addresses stay loopback
    # Ray's default folder is $RAY_TMPDIR/ray (else $TMPDIR/ray, else /tmp/ray): Cluster.add_node writes the head's
    # address there (ray_current_cluster) whatever temp_dir it is given, and fails where that folder does not exist.
    # Made the cluster's own folder, for this process and every node process it starts.
    os.environ["RAY_TMPDIR"] = temp
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "include_dashboard": False,
            # no autoscaler and no log monitor: a fixed cluster, and fwbench's driver takes no worker logs
            # (log_to_driver=False); two Python processes fewer to start beside the nodes
            "no_monitor": True,
            "include_log_monitor": False,
            # a lost node is declared dead after 2 failed health checks half a second apart (Ray's default: 5 checks
            # 3 s apart, 15 s in which a test waits); a check fails on an error or after its 10 s RPC timeout, so a
            # live node on a busy machine is not declared dead
            "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 2},
            "node_ip_address": "127.0.0.1",
            "temp_dir": os.path.join(temp, "ray"),  # the default folder above: Ray creates it for the head
        },
    )
    cpus = sorted(os.sched_getaffinity(0))
    added = [
        cluster.add_node(
            num_cpus=1,
            resources={"fwbench_node": 1},
            env_vars={**(node_env or {}).get(str(i + 1), {}), "FWBENCH_NODE_CPUS": str(cpus[i % len(cpus)])},
            node_ip_address="127.0.0.1",
        )
        for i in range(count)
    ]
    cluster.wait_for_nodes()
    print(f"address {cluster.address}", flush=True)
    try:
        for line in sys.stdin:
            command, _, argument = line.strip().partition(" ")
            if command == "remove":
                cluster.remove_node(added[int(argument) - 1], allow_graceful=False)
                print(f"removed {argument}", flush=True)
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]))
