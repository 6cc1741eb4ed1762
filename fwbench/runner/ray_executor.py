"""``fwbench run --executor ray``: a plan's comparison groups as Ray tasks, one group per node at a time.

Fairness first: every task needs the node's whole ``fwbench_node`` resource (1 per node, given to ``ray start``), and
the driver itself sends each group to a node that is idle (node affinity), so a node never runs two groups at
once. On the node the task runs :func:`fwbench.runner.manager.run_comparison_group`, the local scheduler itself:
fresh worker processes, interleaving, pinning, thread budget, timeout and memory cap. A node started with
``FWBENCH_NODE_CPUS`` (e.g. ``0-7``) pins its groups' workers to those CPUs. The task returns the outcomes and the
node's machine record; the driver stores each group as it arrives, in one transaction.

Faults: a node that dies mid-group has its group retried once on another live node with the same hardware
fingerprint, else its cells are stored as ``error`` ("node lost: ..."); a task that fails otherwise stores its
cells as ``error`` with the exception's last line. The driver dying loses no stored group: ``--resume`` runs the
rest. Ray is imported only here (an optional extra), never by a worker.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fwbench.measure.environment import machine_record, physical_core_count
from fwbench.runner.manager import (
    Listener,
    Parity,
    Recorder,
    Settled,
    pending_groups,
    run_comparison_group,
    settle_parity,
    skipped_outcomes,
    stored_parity,
)
from fwbench.runner.outcome import CellOutcome
from fwbench.spec import Case, Plan, Settings, SkippedCase, SpecError, cell_threads
from fwbench.store import Store

NODE_RESOURCE = "fwbench_node"
NODE_CPUS_ENV = "FWBENCH_NODE_CPUS"
CONNECT_TIMEOUT_S = 5.0
PROBE_TIMEOUT_S = 120.0  # a node's first task starts a Ray worker process: seconds, more on a loaded machine
START_LINE = (
    f"FWBENCH_NODE_CPUS=<cpus> ray start --address <head:port> --resources='{{\"{NODE_RESOURCE}\": 1}}' "
    "--num-cpus <cores>"
)


class ExecutorError(SpecError):
    """The cluster cannot be used (Ray missing, address unreachable, no fwbench node): one line, exit 2."""


def parse_cpus(text: str) -> set[int]:
    """``'0-3,6'`` → {0, 1, 2, 3, 6} (the ``taskset -c`` / cpuset list syntax)."""
    cpus: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def pin_to_node_cpus() -> None:
    """Restrict this process (and so the workers it starts) to the node's ``FWBENCH_NODE_CPUS``, if set."""
    text = os.environ.get(NODE_CPUS_ENV)
    if text:
        os.sched_setaffinity(0, parse_cpus(text))


def group_task(
    cases: Sequence[Case], skipped: Sequence[SkippedCase], settings: Settings, parity: Parity
) -> dict[str, Any]:
    """What a node runs for one group: its outcomes (wall seconds each) and the node's machine record."""
    started = time.monotonic()
    pin_to_node_cpus()
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "":  # Ray hides the GPUs from a task without num_gpus
        del os.environ["CUDA_VISIBLE_DEVICES"]  # the group has the whole node
    settled = skipped_outcomes(skipped)
    cores = physical_core_count()
    needed = max((cell_threads(case, settings) for case in cases), default=0)
    if cases and needed > cores:
        reason = f"the group's cells need {needed} cores (--threads, processes); this node has {cores} physical cores"
        settled += [(CellOutcome(case, "error", reason), 0.0) for case in cases]
    elif cases:
        settled += run_comparison_group(cases, settings, parity)
    return {"settled": settled, "machine": machine_record(), "group_s": time.monotonic() - started}


def node_probe() -> dict[str, Any]:
    """What a node reports before any group: its machine record, with its CPUs pinned as its groups will be."""
    pin_to_node_cpus()
    return machine_record()


def _reachable(address: str) -> None:
    """ExecutorError unless a TCP connection to ``host:port`` opens within CONNECT_TIMEOUT_S (ray.init would retry
    an unreachable address for minutes)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=CONNECT_TIMEOUT_S):
            return
    except ValueError:
        raise ExecutorError(f"--ray-address {address!r}: want HOST:PORT (the head node's GCS address)") from None
    except OSError as exc:
        raise ExecutorError(
            f"--ray-address {address}: cannot reach a Ray cluster there ({exc.strerror or exc})"
        ) from None


def _loopback(address: str | None) -> bool:
    host = (address or "127.0.0.1").rpartition(":")[0] or "127.0.0.1"
    return host in ("127.0.0.1", "localhost", "::1", "[::1]")


@dataclass
class Node:
    """A Ray node that runs fwbench groups: its id, machine record and hardware fingerprint."""

    node_id: str
    machine: dict[str, Any]
    busy: bool = False

    @property
    def hardware_id(self) -> str:
        return str(self.machine["hardware_id"])


@dataclass
class Job:
    """One group's task: what it runs, the node it runs on, and, once it lost a node, the hardware its retry needs."""

    cases: list[Case]
    skipped: list[SkippedCase]
    node: Node | None = None
    ref: Any = None
    attempts: int = 1
    hardware_id: str | None = None  # a retry: the fingerprint of the node it lost
    machine: dict[str, Any] | None = None  # a retry: the machine record of the node it lost
    submitted: float = 0.0  # time.monotonic() when sent to its node

    def failed(self, reason: str, status: str = "error") -> Settled:
        """The group's cells with ``status`` and ``reason`` (its skipped cells stay ``skipped``)."""
        return [(CellOutcome(case, status, reason), 0.0) for case in self.cases] + skipped_outcomes(self.skipped)

    def lost(self, why: str) -> Settled:
        return self.failed(f"node lost: {why}" + (" (after one retry)" if self.attempts > 1 else ""))


class RayExecutor:
    """A connection to a Ray cluster (or a local one-node instance) and the fwbench nodes in it."""

    def __init__(self, address: str | None) -> None:
        if address is not None:
            _reachable(address)
        if _loopback(address):  # else Ray swaps 127.0.0.1 for the machine's external address, where nothing listens
            os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        try:
            import ray
        except ImportError:
            raise ExecutorError("--executor ray needs Ray: pip install 'fwbench[ray]'") from None
        self.ray = ray
        options: dict[str, Any] = {"logging_level": logging.ERROR, "log_to_driver": False}
        if address is None:  # a local instance: this machine is the one node, reachable on loopback only
            options.update(
                num_cpus=os.cpu_count(),
                resources={NODE_RESOURCE: 1},
                include_dashboard=False,
                _node_ip_address="127.0.0.1",
            )
        else:
            options.update(address=address)
            if _loopback(address):
                options.update(_node_ip_address="127.0.0.1")
        try:
            ray.init(**options)
        except Exception as exc:  # Ray's many connection errors: one line, exit 2
            raise ExecutorError(
                f"--executor ray: cannot start or join the cluster: {str(exc).splitlines()[0]}"
            ) from None
        self.group_task = ray.remote(group_task)
        self.node_probe = ray.remote(node_probe)
        self.nodes = self._discover()

    def _options(self, node: Node, whole_node: bool = True) -> dict[str, Any]:
        """Task options: on ``node`` only, never retried by Ray; ``whole_node``: holding its fwbench resource (a
        group), else nothing (a probe, which may run beside another driver's group)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return {
            "num_cpus": 0,
            "resources": {NODE_RESOURCE: 1} if whole_node else {},
            "max_retries": 0,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(node.node_id, soft=False),
        }

    def _discover(self) -> list[Node]:
        """The live nodes with the fwbench resource that answer a probe (their machine record) within
        PROBE_TIMEOUT_S; ExecutorError when there is none."""
        ids = [
            n["NodeID"]
            for n in self.ray.nodes()
            if n.get("Alive") and n.get("Resources", {}).get(NODE_RESOURCE, 0) >= 1
        ]
        probes = {
            node_id: self.node_probe.options(**self._options(Node(node_id, {}), False)).remote() for node_id in ids
        }
        nodes = []
        for node_id, ref in probes.items():
            try:
                nodes.append(Node(node_id, self.ray.get(ref, timeout=PROBE_TIMEOUT_S)))
            except Exception:  # a node that died since the listing, or cannot run a task: not used
                self.ray.cancel(ref, force=True)
        if not nodes:
            self.close()
            raise ExecutorError(
                f"--executor ray: no live node of the cluster has the {NODE_RESOURCE} resource; start each node with "
                f"`{START_LINE}`"
            )
        return nodes

    def close(self) -> None:
        self.ray.shutdown()

    def _idle(self, hardware_id: str | None) -> Node | None:
        """An idle node (of ``hardware_id`` when given), or None."""
        for node in self.nodes:
            if not node.busy and (hardware_id is None or node.hardware_id == hardware_id):
                return node
        return None

    def _alive(self) -> set[str]:
        return {n["NodeID"] for n in self.ray.nodes() if n.get("Alive")}

    def run(self, store: Store, run_id: int, plan: Plan, listener: Listener | None) -> list[CellOutcome]:
        """Every group of ``plan`` that run ``run_id`` lacks, over the cluster's nodes; outcomes in plan order."""
        parity = stored_parity(store, run_id, plan.settings.rounds)
        recorder = Recorder(store, run_id, plan, listener)
        queue = [Job(cases, skipped) for cases, skipped in pending_groups(store, run_id, plan)]
        running: dict[Any, Job] = {}
        try:
            while queue or running:
                self._dispatch(queue, running, recorder, plan.settings, parity)
                if not running:
                    continue
                ready, _ = self.ray.wait(list(running), num_returns=1)
                self._collect(running.pop(ready[0]), ready[0], queue, recorder, parity)
        except BaseException:
            for ref in running:
                self.ray.cancel(ref, force=True)
            raise
        return recorder.in_plan_order()

    def _dispatch(
        self, queue: list[Job], running: dict[Any, Job], recorder: Recorder, settings: Settings, parity: Parity
    ) -> None:
        """Send the queued jobs, in queue order, each to an idle node of its hardware (moved to ``running``); a job
        that no node left can run is stored as lost."""
        if queue:  # a node that died while idle gets no group
            alive = self._alive()
            self.nodes = [node for node in self.nodes if node.node_id in alive or node.busy]
        for job in list(queue):  # plan order; a retry (at the front) needs a node of its hardware
            if not any(job.hardware_id in (None, node.hardware_id) for node in self.nodes):
                queue.remove(job)
                why = "no other node of its hardware is left" if job.hardware_id else "no fwbench node is left"
                recorder.record(job.lost(why), job.machine)
                continue
            node = self._idle(job.hardware_id)
            if node is not None:
                queue.remove(job)
                self._submit(job, node, settings, parity)
                running[job.ref] = job

    def _collect(self, job: Job, ref: Any, queue: list[Job], recorder: Recorder, parity: Parity) -> None:
        """The answer of ``job``'s finished task ``ref`` (its node idle again): its group stored, or its cells'
        failure, or, when its node went away, the job queued again at the front (:meth:`_lost`)."""
        from ray.exceptions import (
            NodeDiedError,
            ObjectLostError,
            OutOfMemoryError,
            OwnerDiedError,
            TaskUnschedulableError,
            WorkerCrashedError,
        )

        node_gone = (NodeDiedError, ObjectLostError)  # its node died while (or just after) the task ran

        assert job.node is not None
        job.node.busy = False
        try:
            answer = self.ray.get(ref)
        except TaskUnschedulableError:  # its node went away before the task started: it never ran
            self.nodes.remove(job.node)
            queue.insert(0, job)
            return
        except OutOfMemoryError as exc:  # Ray's memory monitor killed the group's task
            why = str(exc).splitlines()[0]
            reason = (
                f"Ray's memory monitor killed the group ({why}); start the nodes with "
                "RAY_memory_monitor_refresh_ms=0 to leave memory limits to fwbench's --memory-limit"
            )
            recorder.record(job.failed(reason, "oom"), job.node.machine)
            return
        except (*node_gone, WorkerCrashedError, OwnerDiedError) as exc:
            self._lost(job, exc, isinstance(exc, node_gone), queue, recorder)
            return
        except Exception as exc:  # the group's cells record what failed; the sweep goes on
            last = [line for line in str(exc).splitlines() if line.strip()][-1:] or [type(exc).__name__]
            recorder.record(job.failed(f"ray task failed: {last[0]}"), job.node.machine)
            return
        _store_answer(job, answer, recorder, parity)

    def _lost(self, job: Job, exc: Exception, node_gone: bool, queue: list[Job], recorder: Recorder) -> None:
        """``job``'s task ended with its node or its Ray worker (``exc``): the node dropped when it died
        (``node_gone``, or no longer alive), and the job queued once more at the front, else stored as lost."""
        assert job.node is not None
        node, why = job.node, str(exc).splitlines()[0]
        if node_gone or node.node_id not in self._alive():
            self.nodes.remove(node)  # a crashed Ray worker on a live node keeps the node in use
        if job.attempts > 1:
            recorder.record(job.lost(why), job.machine)
        else:  # once more, on a node of the same hardware, before any other group
            job.attempts, job.hardware_id, job.machine = 2, node.hardware_id, node.machine
            queue.insert(0, job)

    def _submit(self, job: Job, node: Node, settings: Settings, parity: Parity) -> None:
        node.busy = True
        job.node = node
        job.submitted = time.monotonic()
        job.ref = self.group_task.options(**self._options(node)).remote(job.cases, job.skipped, settings, dict(parity))


def _store_answer(job: Job, answer: dict[str, Any], recorder: Recorder, parity: Parity) -> None:
    """Store the outcomes ``job``'s node returned (each with the task's Ray details) and settle their parity."""
    assert job.node is not None
    settled = answer["settled"]
    ray_details = {
        "node_id": job.node.node_id,
        "attempt": job.attempts,
        "task_s": time.monotonic() - job.submitted,  # submitted → returned, seen by the driver
        "group_s": answer["group_s"],  # the group's own time on the node
    }
    for outcome, _ in settled:
        outcome.details["ray"] = ray_details
    settle_parity(parity, settled)
    recorder.record(settled, answer["machine"])


def execute_on_ray(
    store: Store, run_id: int, plan: Plan, listener: Listener | None, executor: RayExecutor
) -> list[CellOutcome]:
    """:meth:`RayExecutor.run`, closing the executor (a local instance stops) when it ends."""
    try:
        return executor.run(store, run_id, plan, listener)
    finally:
        executor.close()
