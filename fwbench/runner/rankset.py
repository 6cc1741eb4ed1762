"""A distributed cell's processes as the manager sees them: :class:`RankSet`, N workers that answer as one.

Each rank is a :class:`~fwbench.runner.process.WorkerProcess` of its own (fresh interpreter, own process group,
dies with the manager) pinned to cores no other rank has, with ``threads / N`` threads (or ``--rank-threads``) and
its identity in its environment (:class:`fwbench.ranks.RankInfo`: rank, world size, 127.0.0.1 and a free port, a
rendezvous file in a temporary folder). The rank set speaks the worker protocol
(:mod:`fwbench.messages`): a command goes to every rank; a message is awaited from every rank and answered
as one — a block lasts as long as its slowest rank, resident memory is the ranks' sum (``--memory-limit`` applies
to it, polled), a result is rank 0's with every rank's figures beside it.

Ranks step together (each step all-reduces), so they must take the same number of steps: the manager, not each
rank, chooses the calls per block (:meth:`RankSet.await_message` of ``calibrated`` runs the timer's calibration
rule over whole-set blocks), and a distributed cell is always timed in blocks on command, also in a sequential
schedule.

Across machines (``--nnodes``, :mod:`fwbench.runner.nodes`) the set holds this machine's share of the ranks as
local workers and every other node's as :class:`~fwbench.runner.nodes.RemoteRank` (the same methods, relayed), and
the ranks meet at the master address through a TCP store instead of the file.

Faults: a rank that dies, reports an error or exceeds the deadline ends the cell; the others are killed (a rank
waiting in a collective for a dead peer would otherwise hang), and the failure names the rank and its last line.
When several ranks fail at once, the one that died first of a signal (killed, crashed) is named, not the peers
that then lost their connection to it.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fwbench.details import RankDetail, Rendezvous, RendezvousNode, StageSeconds
from fwbench.measure import timer
from fwbench.messages import STAGES, Job
from fwbench.ranks import LOOPBACK, RankInfo, free_ports, gloo_interface
from fwbench.runner import nodes
from fwbench.runner.phases import get_phase
from fwbench.runner.process import POLL_INTERVAL_S, WorkerFailure, WorkerProcess, worker_cpus
from fwbench.spec import rank_threads

SETTLE_FAILURES_S = 2.0  # after a rank fails, how long the others get to fail too (to find the first cause)
SUMMED_FIELDS = ("peak_memory_bytes", "peak_memory_before_timing_bytes", "rss_before_timing_bytes")


class RankSet:
    """The ``job.case.procs`` ranks of a distributed cell, started pinned to disjoint cores; use as a context
    manager (every rank killed, the rendezvous folder removed on exit)."""

    def __init__(self, job: Job) -> None:
        case = job.case
        assert case.procs is not None, "a rank set runs a distributed cell"
        self.job = job
        self.procs = case.procs
        self.threads = rank_threads(case, job.settings)
        self.ranks: list[WorkerProcess | nodes.RemoteRank] = []
        self._set_id = 0
        self._calibrating = False
        self._closed = False
        cluster = nodes.active()
        shares = nodes.node_shares(self.procs, cluster.nodes if cluster is not None else 1)
        here = len(shares[0])
        cpus = worker_cpus(self.threads * here)
        if len(cpus) < self.threads * here:
            raise WorkerFailure(
                "error",
                f"{here} processes of {self.threads} thread(s) need {self.threads * here} CPUs of their "
                f"own; this process may use {len(cpus)}",
            )
        rank_job = dataclasses.replace(job, settings=dataclasses.replace(job.settings, threads=self.threads))
        self._folder = Path(tempfile.mkdtemp(prefix="fwbench-ranks-"))
        self.node_of = [node for node, share in enumerate(shares) for _ in share]  # each rank's node
        hosts: tuple[str, ...] = ()
        try:
            if cluster is None or len(shares) == 1:
                self.address, rendezvous = LOOPBACK, str(self._folder / "rendezvous")
                self.ports = tuple(free_ports(1 + self.procs))  # the coordinator's, then one per rank (TensorFlow's)
            else:
                self.address, rendezvous = cluster.address, None
                hosts, self.ports = self._cluster_ports(cluster, shares, job.settings.timeout_s)
            self.hosts = hosts or (self.address,) * self.procs
            infos = [
                RankInfo(rank, self.procs, self.address, self.ports, rendezvous, hosts, rank - share.start)
                for share in shares
                for rank in share
            ]
            gloo = gloo_interface(self.address) if len(shares) > 1 else {}  # across machines: the master's interface
            for rank in shares[0]:
                pinned = cpus[rank * self.threads : (rank + 1) * self.threads]
                self.ranks.append(WorkerProcess(rank_job, cpus=pinned, env={**gloo, **infos[rank].environ()}))
            if cluster is not None and len(shares) > 1:
                for link, share in zip(cluster.links, shares[1:], strict=True):
                    envs = {rank: infos[rank].environ() for rank in share}
                    self.ranks.extend(link.spawn(self._set_id, rank_job, self.threads, envs))
        except BaseException:  # no rank started so far may outlive a set that could not start
            self.close()
            raise

    def _cluster_ports(
        self, cluster: nodes.Cluster, shares: Sequence[range], timeout_s: float
    ) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """Every rank's host and the ports of a set across machines: the coordinator's and node 0's ranks' free at
        the master address, every other node's chosen free on its machine."""
        self._set_id = cluster.new_set_id()
        own = free_ports(1 + len(shares[0]), cluster.address)
        hosts, ports = [cluster.address] * len(shares[0]), list(own)
        for link, share in zip(cluster.links, shares[1:], strict=True):
            host, theirs = link.request_ports(self._set_id, len(share), timeout_s)
            hosts += [host] * len(share)
            ports += theirs
        return tuple(hosts), tuple(ports)

    def __enter__(self) -> RankSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pids(self) -> tuple[int, ...]:
        """The ranks' process ids on this machine (not another node's)."""
        return tuple(pid for rank in self.ranks for pid in rank.pids)

    def _name(self, rank: int) -> str:
        """``rank 1 of 2``, with its node and host in a set across machines."""
        where = f" (node {self.node_of[rank]}, {self.hosts[rank]})" if self.node_of[-1] else ""
        return f"rank {rank} of {self.procs}{where}"

    @property
    def stage(self) -> str:
        """The earliest stage any rank is in (where the set as a whole is)."""
        return min((rank.stage for rank in self.ranks), key=lambda stage: STAGES.index(stage) if stage in STAGES else 0)

    def command(self, name: str, **fields: Any) -> None:
        """Send every rank ``name``; ``calibrate`` is run by the set itself when ``calibrated`` is awaited, unless
        the phase fixes its blocks (fit: a block is an epoch, which every rank answers alike)."""
        if name == "calibrate" and get_phase(self.job.case.phase).blocks_per_round(self.job.settings) is None:
            self._calibrating = True
            return
        for rank in self.ranks:
            rank.command(name, **fields)

    def await_message(self, kinds: set[str], timeout_s: float) -> dict[str, Any]:
        """Every rank's next message of one of ``kinds``, answered as one (see the module docstring); the
        calibration when ``calibrated`` is awaited after a ``calibrate`` command."""
        if "calibrated" in kinds and self._calibrating:
            self._calibrating = False
            return self._calibrate(timeout_s)
        messages = self._gather(kinds, timeout_s)
        kind = messages[0]["type"]
        if any(message["type"] != kind for message in messages):  # one rank ended early (a result), others did not
            rank, ended = next((i, m) for i, m in enumerate(messages) if m["type"] == "result")
            self.kill()
            raise WorkerFailure(
                str(ended.get("status") or "error"),
                f"{self._name(rank)}: {ended.get('reason') or 'it ended before the others'}",
            )
        for message in messages:
            message.pop("type")
        if kind == "result":
            combined = combine_results(messages, self.node_of)
            combined["rendezvous"] = self.rendezvous()
            return combined
        return combine(kind, messages, self.node_of)

    def rendezvous(self) -> dict[str, Any]:
        """Where the ranks met: the master address, the ports, torch's store (a file on one machine, TCP across
        machines) and each node's host and ranks."""
        return Rendezvous(
            address=self.address,
            ports=tuple(self.ports),
            store="tcp" if self.node_of[-1] else "file",
            nodes=tuple(
                RendezvousNode(
                    node=node,
                    host=self.hosts[self.node_of.index(node)],
                    ranks=tuple(r for r, n in enumerate(self.node_of) if n == node),
                )
                for node in sorted(set(self.node_of))
            ),
        ).to_dict()

    def _gather(self, kinds: set[str], timeout_s: float) -> list[dict[str, Any]]:
        limit = self.job.settings.memory_limit_bytes
        deadline = time.monotonic() + timeout_s
        answers: dict[int, dict[str, Any]] = {}
        wait_s = POLL_INTERVAL_S / self.procs
        while len(answers) < self.procs:
            self._poll_ranks(kinds, wait_s, answers)
            self._check_deadline(deadline, answers)
            if limit is not None:
                self._check_memory(limit)
        return [answers[index] for index in range(self.procs)]

    def _poll_ranks(self, kinds: set[str], wait_s: float, answers: dict[int, dict[str, Any]]) -> None:
        """One pass over the ranks: each that has not answered polled for a message of ``kinds`` (added to
        ``answers``), each that has checked alive unless a result is awaited; a rank's failure, or a failed result
        while others have yet to answer, ends every rank (:meth:`_failure`)."""
        for index, rank in enumerate(self.ranks):
            try:
                if index in answers:
                    if "result" not in kinds:
                        rank.check_alive()  # it answered, then died: its peers will wait for it forever
                    continue
                message = rank.poll(kinds, wait_s)
            except WorkerFailure as failure:
                raise self._failure(index, failure) from None
            if message is None:
                continue
            if message["type"] == "result" and message.get("status") != "ok":
                if len(answers) < self.procs - 1:  # the others may wait for it in a collective: end them now
                    status = str(message.get("status") or "error")
                    raise self._failure(index, WorkerFailure(status, str(message.get("reason") or status)))
            answers[index] = message

    def _check_deadline(self, deadline: float, answers: dict[int, dict[str, Any]]) -> None:
        """A timeout (every rank killed) naming the ranks not yet answered, once ``deadline`` has passed."""
        if time.monotonic() > deadline:
            waiting = [self._name(i) for i in range(self.procs) if i not in answers]
            self.kill()
            raise WorkerFailure(
                "timeout",
                f"exceeded --timeout {self.job.settings.timeout_s:g} s during {self.stage} "
                f"(waiting for {', '.join(waiting)})",
            )

    def _check_memory(self, limit: int) -> None:
        """An oom (every rank killed) once the ranks' summed resident memory exceeds ``limit``."""
        peaks = [rank.peak_rss_bytes() for rank in self.ranks]
        total = sum(peak for peak in peaks if peak is not None)
        if total > limit:
            self.kill()
            raise WorkerFailure(
                "oom",
                f"resident memory of the {self.procs} processes {total} B exceeded --memory-limit {limit} B "
                f"during {self.stage}",
            )

    def _failure(self, index: int, failure: WorkerFailure) -> WorkerFailure:
        """The cell's failure once rank ``index`` failed: the others get SETTLE_FAILURES_S to fail too, then all
        are killed; a rank that died of a signal (or of memory) first is named before peers that lost it."""
        failures = {index: failure}
        settle_until = time.monotonic() + SETTLE_FAILURES_S
        while time.monotonic() < settle_until and len(failures) < self.procs:
            for other, rank in enumerate(self.ranks):
                if other in failures:
                    continue
                try:
                    rank.poll(set(), POLL_INTERVAL_S / self.procs)
                except WorkerFailure as later:
                    failures[other] = later
        self.kill()

        def cause_order(item: tuple[int, WorkerFailure]) -> tuple[int, int]:
            number, found = item
            died = found.status in ("oom", "timeout") or "killed by" in found.reason
            return (0 if died else 1, number)

        first, cause = min(failures.items(), key=cause_order)
        return WorkerFailure(cause.status, f"{self._name(first)}: {cause.reason}")

    def _calibrate(self, timeout_s: float) -> dict[str, Any]:
        """The calls per block, chosen for the whole set by the timer's rule (hf2019: 3) on blocks every rank
        times together (their samples are not kept)."""
        settings = self.job.settings
        set_timer = _SetTimer(self, timeout_s)
        if settings.protocol == "hf2019":
            number, block_s = timer.HF2019_NUMBER, set_timer.timeit(timer.HF2019_NUMBER)
        else:
            number, block_s = timer.calibrate_block(
                set_timer, settings.min_block_s, self.job.budget_s or settings.max_time_s
            )
        return {"calls_per_block": number, "block_s": block_s}

    def wait_exit(self, timeout_s: float = 10.0) -> None:
        for rank in self.ranks:
            rank.wait_exit(timeout_s)

    def kill(self) -> None:
        for rank in self.ranks:
            rank.kill()

    def close(self) -> None:
        """Kill what is left of every rank and remove the rendezvous folder; a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        for rank in self.ranks:
            rank.close()
        shutil.rmtree(self._folder, ignore_errors=True)


class _SetTimer:
    """``timeit(number)`` over a rank set: one block of ``number`` calls on every rank, its slowest rank's
    seconds (the timer's calibration rule takes any object with this method)."""

    def __init__(self, ranks: RankSet, timeout_s: float) -> None:
        self.ranks, self.timeout_s = ranks, timeout_s

    def timeit(self, number: int) -> float:
        self.ranks.command("block", calls=number, calibration=True)
        return float(self.ranks.await_message({"block"}, self.timeout_s)["seconds"])


def combine(kind: str, messages: Sequence[dict[str, Any]], node_of: Sequence[int] | None = None) -> dict[str, Any]:
    """Every rank's message of ``kind`` as one: a ``block`` lasts as long as its slowest rank (each rank's seconds
    kept; it started when the first rank on this machine started it, ``node_of`` giving each rank's node, as other
    machines' clocks are not this one's), ``ready``'s resident peak is the sum, a ``result`` is
    :func:`combine_results`; others are rank 0's."""
    first = dict(messages[0])
    if kind == "block":
        here = [m for m, node in zip(messages, node_of or [0] * len(messages), strict=True) if node == 0]
        first["seconds"] = max(float(m["seconds"]) for m in messages)
        first["start_unix_s"] = min(float(m["start_unix_s"]) for m in here)
        first["rank_seconds"] = [float(m["seconds"]) for m in messages]
    elif kind == "ready":
        first["peak_memory_bytes"] = _sum(m.get("peak_memory_bytes") for m in messages)
    elif kind == "calibrated":
        first["block_s"] = max(float(m["block_s"]) for m in messages)
    elif kind == "result":
        return combine_results(messages, node_of)
    return first


def combine_results(results: Sequence[dict[str, Any]], node_of: Sequence[int] | None = None) -> dict[str, Any]:
    """The cell's result from every rank's: rank 0's, with the first rank's failure if any failed (its reason
    naming the rank), the resident figures summed over ranks, the CPUs and thread lists of the ranks on this
    machine (``node_of``: each rank's node, 0 being this one; default all), and ``ranks``: each rank's own
    figures."""
    rank_nodes = list(node_of) if node_of is not None else [0] * len(results)
    here = [result for result, node in zip(results, rank_nodes, strict=True) if node == 0]
    combined = dict(results[0])
    failed = next((rank for rank, result in enumerate(results) if result.get("status") != "ok"), None)
    if failed is not None:
        result = results[failed]
        combined.update(status=result.get("status"), reason=f"rank {failed} of {len(results)}: {result.get('reason')}")
    for name in SUMMED_FIELDS:
        combined[name] = _sum(result.get(name) for result in results)
    combined["cpus"] = sorted({cpu for result in here for cpu in result.get("cpus") or []})
    combined["thread_cpu_lists"] = [lists for result in here for lists in result.get("thread_cpu_lists") or []]
    combined["ranks"] = [
        RankDetail(
            rank=rank,
            node=rank_nodes[rank],
            cpus=None if result.get("cpus") is None else tuple(result["cpus"]),
            threads_effective=result.get("threads_effective"),
            peak_memory_bytes=result.get("peak_memory_bytes"),
            first_call_s=result.get("first_call_s"),
            stage_seconds=StageSeconds.parse(result.get("stage_seconds")),
            status=result.get("status"),
        ).to_dict()
        for rank, result in enumerate(results)
    ]
    return combined


def _sum(values: Any) -> int | None:
    """The sum of the known values; None when none is known."""
    known = [int(value) for value in values if value is not None]
    return sum(known) if known else None


def start_worker(
    job: Job, start_cpus: Sequence[int] | None = None, env: Mapping[str, str] | None = None
) -> WorkerProcess | RankSet:
    """The worker that runs ``job``: a rank set for a distributed cell, else one worker process (with
    ``start_cpus``: started on those, beside others; a rank set always starts on its ranks' CPUs; ``env``: variables
    added to a single worker's environment)."""
    if job.case.procs is not None:
        return RankSet(job)
    return WorkerProcess(job, env=env, start_cpus=start_cpus)
