"""One distributed cell across machines (``fwbench run --nnodes M``): the control channel between node 0's manager
and the managers of the other nodes.

Node 0's manager plans, times and stores, as on one machine. Before the sweep it listens at ``--master-addr
--master-port`` (:class:`Cluster`) until the M − 1 other managers (``fwbench run --nnodes M --node-rank R
--master-addr HOST --master-port P``, :func:`serve`) have joined, then stops listening. A cell of N processes puts
N / M of them on each machine: ranks [R·N/M, (R+1)·N/M) on node R. Node 0's
:class:`~fwbench.runner.rankset.RankSet` starts its own share as local workers and asks each other node for its
share: the node chooses free ports on its machine, starts the ranks as workers pinned to its own cores (fresh
processes that die with that node's manager), relays node 0's commands to them, and sends back every message, a
rank's failure (its status and last line) and the ranks' resident peaks. On node 0 a remote rank is a
:class:`RemoteRank`, which answers like a local :class:`~fwbench.runner.process.WorkerProcess`; so a block still
lasts as long as the slowest rank of every machine, and a rank that dies anywhere ends the cell. A node whose
connection is lost raises :class:`NodeLost` instead: the sweep stops, the round in progress is not stored, and
``--resume`` runs its group again, from its first round, once the node is back.

The frameworks meet through their own launcher conventions, built from the rank's identity
(:class:`fwbench.ranks.RankInfo`): torchrun's variables with a TCP store at the master address, ``TF_CONFIG`` with
every worker's host and port, JAX's coordinator at the master address.

The protocol is JSON lines over one TCP connection per node (node 0's ``type`` → node R: ``welcome``/``refused``,
``ports``, ``spawn``, ``command``, ``wait_exit``, ``kill``, ``close``, ``bye``; node R → node 0: ``hello``,
``ports``, ``message``, ``failure``, ``memory``). It is for machines that trust each other, as torchrun's store is:
anyone who reaches the master port before the other nodes could join in their place.
"""

from __future__ import annotations

import collections
import hashlib
import json
import select
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from fwbench.messages import Job
from fwbench.ranks import free_ports, gloo_interface
from fwbench.runner.process import POLL_INTERVAL_S, WorkerFailure, WorkerProcess, ended_early, worker_cpus
from fwbench.spec import Plan, processes_per_node

CONNECT_RETRY_S = 0.5  # a node retries the master this often until it listens
MEMORY_REPORT_S = 0.5  # how often a node sends its ranks' resident peaks
RECEIVE_BYTES = 1 << 16
MESSAGE_KINDS = {"stage", "ready", "calibrated", "block", "result"}
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES = 5, 2, 5  # probes after 5 s of silence, every 2 s
KEEPALIVE_GIVE_UP_S = 15  # unanswered probes or unacknowledged data for this long: the peer is gone
HELLO_TIMEOUT_S = 10.0  # how long node 0 waits for a new connection's hello before dropping it
CLOSE_DRAIN_S = 2.0  # on closing, how long to read what the peer still sends (so the last message is not reset)


GONE = " is gone: "  # in a failure's reason: a whole node was lost (a cause, not a peer that lost its connection)


class ClusterError(Exception):
    """The nodes could not be joined into one cluster (one line: which node, why)."""


class NodeLost(Exception):
    """A node's connection is gone mid-sweep (its reason names the node). Not a cell's failure: the sweep stops
    (the round in progress is not stored) so that ``--resume`` runs its group again once the node is back;
    every later cell of several processes would fail the same way."""


def _keep_alive(sock: socket.socket) -> None:
    """Have the kernel notice a peer machine that vanished without closing (powered off, network cut): keepalive
    probes after KEEPALIVE_IDLE_S of silence, and unacknowledged data given up after KEEPALIVE_GIVE_UP_S; the
    connection then reads as lost."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE_S),
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
        ("TCP_KEEPCNT", KEEPALIVE_PROBES),
        ("TCP_USER_TIMEOUT", KEEPALIVE_GIVE_UP_S * 1000),
    ):
        if hasattr(socket, option):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


class _Channel:
    """One end of a node connection: JSON lines out (:meth:`send`), JSON lines in (:meth:`receive`)."""

    def __init__(self, sock: socket.socket, peer: str) -> None:
        _keep_alive(sock)
        self.sock = sock
        self.peer = peer
        self.lost: str | None = None  # why the connection ended, once it has
        self._buffer = b""
        self._pending: collections.deque[dict[str, Any]] = collections.deque()  # read, not yet handed out

    def send(self, kind: str, **fields: Any) -> None:
        """Send one message; a connection that is gone is marked :attr:`lost` (the next receive says so)."""
        if self.lost is not None:
            return
        try:
            self.sock.sendall(json.dumps({"type": kind, **fields}).encode() + b"\n")
        except OSError as exc:
            self.lost = f"{self.peer}{GONE}connection lost ({exc.strerror or exc})"

    def receive(self, wait_s: float) -> list[dict[str, Any]]:
        """The whole messages that arrive within ``wait_s`` seconds (none: an empty list); first those read
        earlier and not handed out."""
        if self._pending:
            pending = list(self._pending)
            self._pending.clear()
            return pending
        if self.lost is not None:
            return []
        try:
            ready, _, _ = select.select([self.sock], [], [], wait_s)
            if not ready:
                return []
            chunk = self.sock.recv(RECEIVE_BYTES)
        except OSError as exc:
            self.lost = f"{self.peer}{GONE}connection lost ({exc.strerror or exc})"
            return []
        if not chunk:
            self.lost = f"{self.peer}{GONE}it closed the connection"
            return []
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        messages = []
        for line in lines:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if isinstance(message, dict) and "type" in message:
                messages.append(message)
        return messages

    def await_reply(self, kind: str, timeout_s: float) -> dict[str, Any]:
        """The next message of ``kind`` (others are dropped) within ``timeout_s``; ClusterError otherwise."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            messages = self.receive(min(POLL_INTERVAL_S, max(0.0, deadline - time.monotonic())))
            for index, message in enumerate(messages):
                if message["type"] in (kind, "refused"):
                    self._pending.extend(messages[index + 1 :])  # what came with it is the next receive's
                    return message
            if self.lost is not None:
                raise ClusterError(self.lost)
        raise ClusterError(f"{self.peer}: no {kind} message within {timeout_s:g} s")

    def close(self) -> None:
        """Close after the peer has read everything sent: stop sending, read until it closes (at most
        CLOSE_DRAIN_S; closing with unread data would reset the connection and lose the last message)."""
        try:
            self.sock.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + CLOSE_DRAIN_S
            while time.monotonic() < deadline:
                ready, _, _ = select.select([self.sock], [], [], max(0.0, deadline - time.monotonic()))
                if ready and not self.sock.recv(RECEIVE_BYTES):
                    break
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass


class NodeLink:
    """Node 0's connection to node ``node_rank``: it sends commands and sorts what arrives by rank set and rank."""

    def __init__(self, channel: _Channel, hello: Mapping[str, Any]) -> None:
        self.channel = channel
        self.node_rank = int(hello["node_rank"])
        self.address = str(hello["address"])
        self.hello = dict(hello)
        self.inbox: dict[tuple[int, int], collections.deque[dict[str, Any]]] = collections.defaultdict(
            collections.deque
        )
        self.memory: dict[tuple[int, int], int] = {}
        self.replies: dict[int, dict[str, Any]] = {}
        self.closed: set[tuple[int, int]] = set()  # ranks node 0 is done with: what still arrives for them is dropped

    @property
    def name(self) -> str:
        return f"node {self.node_rank} ({self.address})"

    def pump(self, wait_s: float) -> None:
        """Read what has arrived (waiting up to ``wait_s``) into the ranks' inboxes."""
        for message in self.channel.receive(wait_s):
            key = (int(message.get("set", -1)), int(message.get("rank", -1)))
            if key in self.closed:
                continue
            if message["type"] == "memory":
                self.memory[key] = int(message["peak"])
            elif message["type"] == "ports":
                self.replies[key[0]] = message
            elif message["type"] == "message":
                self.inbox[key].append(message["message"])
            elif message["type"] == "failure":
                self.inbox[key].append(message)

    def request_ports(self, set_id: int, count: int, timeout_s: float) -> tuple[str, list[int]]:
        """``count`` ports free on this node's machine, and its address; WorkerFailure when it does not answer."""
        self.channel.send("ports", set=set_id, count=count)
        deadline = time.monotonic() + timeout_s
        while set_id not in self.replies:
            self.pump(POLL_INTERVAL_S)
            if self.channel.lost is not None:
                raise NodeLost(self.channel.lost)
            if time.monotonic() > deadline:  # a node that does not answer is given up
                self.channel.lost = f"{self.name}{GONE}it chose no ports within {timeout_s:g} s"
                raise NodeLost(self.channel.lost)
        reply = self.replies.pop(set_id)
        return str(reply["host"]), [int(port) for port in reply["ports"]]

    def spawn(self, set_id: int, job: Job, threads: int, ranks: Mapping[int, Mapping[str, str]]) -> list[RemoteRank]:
        """Start ``ranks`` (rank → its environment) of rank set ``set_id`` on this node, ``threads`` each."""
        self.channel.send(
            "spawn",
            set=set_id,
            job=job.to_json(),
            threads=threads,
            ranks=[{"rank": rank, "env": dict(env)} for rank, env in ranks.items()],
        )
        return [RemoteRank(self, set_id, rank) for rank in ranks]


class RemoteRank:
    """A rank that runs on another node, as node 0's rank set sees it: the same methods as a local
    :class:`~fwbench.runner.process.WorkerProcess` (commands relayed, messages and failures relayed back)."""

    def __init__(self, link: NodeLink, set_id: int, rank: int) -> None:
        self.link = link
        self.set_id = set_id
        self.rank = rank
        self.stage = "start"
        self._closed = False

    @property
    def node(self) -> int:
        return self.link.node_rank

    @property
    def pids(self) -> tuple[int, ...]:
        """No process of this machine (its counters are the other node's)."""
        return ()

    def peak_rss_bytes(self) -> int | None:
        """The rank's resident high-water mark as its node last reported it, bytes."""
        return self.link.memory.get((self.set_id, self.rank))

    def command(self, name: str, **fields: Any) -> None:
        self.link.channel.send("command", set=self.set_id, rank=self.rank, name=name, fields=fields)

    def poll(self, kinds: set[str], wait_s: float = POLL_INTERVAL_S) -> dict[str, Any] | None:
        """As :meth:`WorkerProcess.poll`: the next message of ``kinds`` relayed from the node within ``wait_s``,
        stage messages updating :attr:`stage`; WorkerFailure when the rank failed there or the node is gone."""
        inbox = self.link.inbox[(self.set_id, self.rank)]
        if not inbox:
            self.link.pump(wait_s)
        while inbox:
            message = inbox.popleft()
            kind = message["type"]
            if kind == "failure":
                raise WorkerFailure(str(message["status"]), str(message["reason"]))
            if kind in kinds:
                return message
            if kind == "stage":
                self.stage = message["stage"]
            elif kind == "result":
                raise ended_early(message, self.stage)
        if self.link.channel.lost is not None:
            raise NodeLost(self.link.channel.lost)
        return None

    def check_alive(self) -> None:
        """WorkerFailure if the rank's node reported it dead (or the node is gone)."""
        self.link.pump(0.0)
        inbox = self.link.inbox[(self.set_id, self.rank)]
        failure = next((message for message in inbox if message["type"] == "failure"), None)
        if failure is not None:
            inbox.remove(failure)
            raise WorkerFailure(str(failure["status"]), str(failure["reason"]))
        if self.link.channel.lost is not None:
            raise NodeLost(self.link.channel.lost)

    def wait_exit(self, timeout_s: float = 10.0) -> None:
        self.link.channel.send("wait_exit", set=self.set_id, rank=self.rank, timeout_s=timeout_s)

    def kill(self) -> None:
        self.link.channel.send("kill", set=self.set_id, rank=self.rank)

    def close(self) -> None:
        """Have the node kill what is left of the rank and forget it; a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        key = (self.set_id, self.rank)
        self.link.channel.send("close", set=self.set_id, rank=self.rank)
        self.link.closed.add(key)
        self.link.inbox.pop(key, None)
        self.link.memory.pop(key, None)


class Cluster:
    """Node 0's side: the other nodes' links, joined at ``address:port``; use as a context manager (the cluster the
    rank sets of this process use, :func:`active`; the nodes are told to finish on exit)."""

    def __init__(self, address: str, port: int, nodes: int, timeout_s: float, plan: Plan, version: str) -> None:
        try:  # a host name once, to the IPv4 address every rank is given (gloo binds what it is given)
            address = socket.gethostbyname(address)
        except OSError as exc:
            raise ClusterError(f"--master-addr {address}: cannot resolve it ({exc.strerror or exc})") from None
        self.address = address
        self.port = port
        self.nodes = nodes
        self.links: list[NodeLink] = []
        self._next_set = 0
        self._join(timeout_s, plan_fingerprint(plan), version)

    def _join(self, timeout_s: float, plan_digest: str, version: str) -> None:
        """Listen until every other node has said hello (ClusterError, one line, if one does not in ``timeout_s``
        or is refused), then stop listening."""
        try:
            listener = socket.create_server((self.address, self.port))
        except OSError as exc:
            raise ClusterError(
                f"--master-addr {self.address} --master-port {self.port}: cannot listen there: {exc.strerror or exc}"
            ) from None
        print(
            f"node 0 of {self.nodes}: waiting for {self.nodes - 1} node(s) at {self.address}:{self.port}",
            file=sys.stderr,
            flush=True,
        )
        deadline = time.monotonic() + timeout_s
        try:
            while len(self.links) < self.nodes - 1:
                ready, _, _ = select.select([listener], [], [], max(0.0, min(1.0, deadline - time.monotonic())))
                if not ready:
                    if time.monotonic() >= deadline:
                        missing = sorted(set(range(1, self.nodes)) - {link.node_rank for link in self.links})
                        raise ClusterError(
                            f"node(s) {', '.join(map(str, missing))} of {self.nodes} did not join at "
                            f"{self.address}:{self.port} within {timeout_s:g} s"
                        )
                    continue
                sock, peer = listener.accept()
                channel = _Channel(sock, f"node at {peer[0]}")
                try:
                    hello = channel.await_reply("hello", timeout_s=HELLO_TIMEOUT_S)
                except ClusterError:
                    channel.close()
                    continue  # not a node (a port scan, a node that gave up): keep listening
                refusal = self._refusal(hello, plan_digest, version)
                if refusal is not None:
                    channel.send("refused", reason=refusal)
                    channel.close()
                    self.close(f"refused a node: {refusal}")
                    raise ClusterError(refusal)
                hello["address"] = peer[0]
                channel.peer = f"node {hello['node_rank']} ({peer[0]})"
                channel.send("welcome")
                self.links.append(NodeLink(channel, hello))
        except BaseException:
            self.close()
            raise
        finally:
            listener.close()
        self.links.sort(key=lambda link: link.node_rank)

    def _refusal(self, hello: Mapping[str, Any], plan_digest: str, version: str) -> str | None:
        """Why node ``hello`` cannot join this cluster; None when it can."""
        rank, nodes = hello.get("node_rank"), hello.get("nodes")
        if nodes != self.nodes:
            return f"node {rank} was started with --nnodes {nodes}, node 0 with --nnodes {self.nodes}"
        if not isinstance(rank, int) or not 1 <= rank < self.nodes or rank in {link.node_rank for link in self.links}:
            return f"node rank {rank} is not one of 1..{self.nodes - 1} still free"
        if hello.get("version") != version:
            return f"node {rank} runs fwbench {hello.get('version')}, node 0 fwbench {version}"
        if hello.get("plan") not in (None, plan_digest):
            return (
                f"node {rank} was given another plan ({str(hello['plan'])[:12]}) than node 0 ({plan_digest[:12]}): "
                "give every node the same plan flags, or none"
            )
        return None

    def new_set_id(self) -> int:
        self._next_set += 1
        return self._next_set

    def machines(self) -> list[dict[str, Any]]:
        """Every other node's environment record (``fwbench env``'s facts), with its node rank and address."""
        return [
            {"node_rank": link.node_rank, "address": link.address, **(link.hello.get("machine") or {})}
            for link in self.links
        ]

    def __enter__(self) -> Cluster:
        global _ACTIVE
        _ACTIVE = self
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        global _ACTIVE
        _ACTIVE = None
        if kind is None:
            self.close("finished the sweep", ok=True)
        else:
            self.close(f"stopped the sweep ({kind.__name__})", ok=False)

    def close(self, why: str = "stopped", ok: bool = False) -> None:
        """Tell every node the sweep is over (``why``; ``ok``: it ended normally) and close the connections; a
        second call does nothing."""
        for link in self.links:  # every node told first, then each connection closed
            link.channel.send("bye", why=why, ok=ok)
        for link in self.links:
            link.channel.close()
        self.links = []


_ACTIVE: Cluster | None = None


def active() -> Cluster | None:
    """The cluster this process's distributed cells span (inside ``with Cluster(...)``); None on one machine."""
    return _ACTIVE


def _connect(address: str, port: int, timeout_s: float) -> socket.socket:
    """A connection to node 0, retried until it listens (ClusterError after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            sock = socket.create_connection((address, port), timeout=max(1.0, deadline - time.monotonic()))
            if sock.getsockname() == sock.getpeername():  # the kernel connected a retry to itself: not node 0
                sock.close()
                raise ConnectionRefusedError(111, "Connection refused")
            return sock
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise ClusterError(
                    f"node 0 at {address}:{port} did not answer within {timeout_s:g} s ({exc.strerror or exc})"
                ) from None
            time.sleep(CONNECT_RETRY_S)


class _Served:
    """A node's share of one rank set: rank → its worker, the ranks still relayed (not yet ended or failed), the
    ranks node 0 has closed, when an ended rank must have exited, and the resident peak last reported."""

    def __init__(self, size: int) -> None:
        self.size = size  # ranks node 0 asked this node for
        self.workers: dict[int, WorkerProcess] = {}
        self.relayed: set[int] = set()
        self.closed: set[int] = set()
        self.exit_deadlines: dict[int, float] = {}
        self.reported: dict[int, int] = {}

    def pipes(self) -> list[int]:
        """The result pipes of the relayed ranks that are still open (to wait on)."""
        return [fd for fd in (self.workers[rank].fileno() for rank in self.relayed) if fd is not None]


def serve(
    address: str,
    port: int,
    node_rank: int,
    nodes: int,
    timeout_s: float,
    plan_digest: str | None,
    version: str,
    machine: Mapping[str, Any],
) -> int:
    """Node ``node_rank``'s manager: join node 0 at ``address:port`` and serve its ranks until node 0 says the sweep
    is over (0 when it ended normally, 1 when node 0 stopped it), or the connection is lost (1); every rank it
    started is killed on the way out. ClusterError (one line) when it cannot join."""
    sock = _connect(address, port, timeout_s)
    sock.settimeout(None)
    channel = _Channel(sock, f"node 0 at {address}:{port}")
    channel.send("hello", node_rank=node_rank, nodes=nodes, version=version, plan=plan_digest, machine=dict(machine))
    reply = channel.await_reply("welcome", timeout_s)
    if reply["type"] == "refused":
        channel.close()
        raise ClusterError(str(reply["reason"]))
    here = sock.getsockname()[0]  # this machine's address on the interface that reaches node 0
    print(f"node {node_rank} of {nodes}: joined node 0 at {address}:{port} as {here}", file=sys.stderr, flush=True)
    sets: dict[int, _Served] = {}
    served: list[str] = []  # the cell of each rank set started here (one per round)
    last_memory = 0.0
    try:
        while True:
            pipes = [fd for share in sets.values() for fd in share.pipes()]
            select.select([sock.fileno(), *pipes], [], [], POLL_INTERVAL_S)  # whichever speaks first: node 0 or a rank
            for message in channel.receive(0.0):
                if message["type"] == "bye":
                    print(
                        f"node {node_rank} of {nodes}: node 0 {message.get('why', 'stopped')}; served {len(served)} "
                        f"rank set(s) of {len(set(served))} cell(s)",
                        file=sys.stderr,
                        flush=True,
                    )
                    return 0 if message.get("ok") else 1
                if message["type"] == "spawn":
                    served.append(Job.from_json(str(message["job"])).case.key)
                _handle(channel, message, sets, here, node_rank)
            if channel.lost is not None:
                print(f"fwbench: {channel.lost}; the ranks this node started are killed", file=sys.stderr)
                return 1
            _relay(channel, sets)
            _reap(sets)
            if time.monotonic() - last_memory > MEMORY_REPORT_S:
                last_memory = time.monotonic()
                _report_memory(channel, sets)
    finally:
        for share in sets.values():
            for worker in share.workers.values():
                worker.close()
        channel.close()


def _handle(channel: _Channel, message: Mapping[str, Any], sets: dict[int, _Served], here: str, node: int) -> None:
    """Carry out one of node 0's messages (none of them waits: the loop keeps relaying the other ranks)."""
    kind, set_id = message["type"], int(message.get("set", -1))
    share = sets.get(set_id)
    rank = int(message.get("rank", -1))
    worker = share.workers.get(rank) if share is not None else None
    if kind == "ports":
        channel.send("ports", set=set_id, host=here, ports=free_ports(int(message["count"]), here))
    elif kind == "spawn":
        sets[set_id] = _spawn(channel, message, node, here)
    elif kind == "command" and worker is not None:
        worker.command(str(message["name"]), **message.get("fields", {}))
    elif kind == "wait_exit" and share is not None and worker is not None:
        share.exit_deadlines[rank] = time.monotonic() + float(message.get("timeout_s", 10.0))
    elif kind == "kill" and worker is not None:
        worker.kill()
    elif kind == "close" and share is not None:
        if worker is not None:
            worker.close()
        share.workers.pop(rank, None)
        share.relayed.discard(rank)
        share.exit_deadlines.pop(rank, None)
        share.closed.add(rank)
        if len(share.closed) == share.size:
            sets.pop(set_id, None)


def _spawn(channel: _Channel, message: Mapping[str, Any], node: int, here: str) -> _Served:
    """Start this node's ranks of a rank set, each pinned to cores of its own on this machine."""
    job = Job.from_json(str(message["job"]))
    threads = int(message["threads"])
    gloo = gloo_interface(here)  # torch's gloo on the interface node 0 reaches this machine at
    ranks = [(int(item["rank"]), {**gloo, **item["env"]}) for item in message["ranks"]]
    share = _Served(len(ranks))
    cpus = worker_cpus(threads * len(ranks))
    print(f"node {node}: rank(s) {', '.join(str(r) for r, _ in ranks)} of {job.case.key}", file=sys.stderr, flush=True)
    for index, (rank, env) in enumerate(ranks):
        if len(cpus) < threads * len(ranks):
            reason = f"node {node} has {len(cpus)} CPUs for {len(ranks)} processes of {threads} thread(s)"
            channel.send("failure", set=message["set"], rank=rank, status="error", reason=reason)
            continue
        try:
            share.workers[rank] = WorkerProcess(job, cpus=cpus[index * threads : (index + 1) * threads], env=env)
            share.relayed.add(rank)
        except WorkerFailure as failure:
            channel.send("failure", set=message["set"], rank=rank, status=failure.status, reason=failure.reason)
    return share


def _relay(channel: _Channel, sets: Mapping[int, _Served]) -> None:
    """Send node 0 every message the ranks wrote since the last look (a stage message also updates the worker's
    stage here, which a failure's reason names), and the failure of a rank that died; a rank that sent its result
    is not relayed further (its exit is not a failure)."""
    for set_id, share in sets.items():
        for rank in sorted(share.relayed):
            worker = share.workers[rank]
            try:
                message = worker.poll(MESSAGE_KINDS, 0.0)
                while message is not None:
                    channel.send("message", set=set_id, rank=rank, message=message)
                    if message["type"] == "stage":
                        worker.stage = str(message["stage"])
                    elif message["type"] == "result":
                        share.relayed.discard(rank)
                        break
                    message = worker.poll(MESSAGE_KINDS, 0.0)
            except WorkerFailure as failure:
                channel.send("failure", set=set_id, rank=rank, status=failure.status, reason=failure.reason)
                share.relayed.discard(rank)
                worker.close()


def _reap(sets: Mapping[int, _Served]) -> None:
    """Kill the ended ranks that have not exited by the deadline node 0 gave (``wait_exit``)."""
    now = time.monotonic()
    for share in sets.values():
        for rank, deadline in list(share.exit_deadlines.items()):
            worker = share.workers[rank]
            if worker.proc.poll() is not None or now > deadline:
                worker.kill()  # reaps an exited worker; kills one still running
                del share.exit_deadlines[rank]


def _report_memory(channel: _Channel, sets: Mapping[int, _Served]) -> None:
    """Send node 0 the relayed ranks' resident peaks that grew since the last report."""
    for set_id, share in sets.items():
        for rank in share.relayed:
            peak = share.workers[rank].peak_rss_bytes()
            if peak is not None and peak != share.reported.get(rank):
                share.reported[rank] = peak
                channel.send("memory", set=set_id, rank=rank, peak=peak)


def plan_fingerprint(plan: Plan) -> str:
    """What every node's plan flags must agree on: the SHA-256 (hex) of the cells and the settings but the thread
    count, whose default is each machine's own core count (node 0's settings are the ones its jobs carry)."""
    settings = {name: value for name, value in plan.settings.to_dict().items() if name != "threads"}
    content = {"cases": [case.key for case in plan.cases], "settings": settings}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def node_shares(procs: int, nodes: int) -> Sequence[range]:
    """The ranks each node runs of a cell of ``procs`` processes over ``nodes`` machines, consecutive blocks of
    :func:`~fwbench.spec.processes_per_node` (all on node 0 when the cell is one process)."""
    per_node = processes_per_node(procs, nodes)
    return [range(start, start + per_node) for start in range(0, procs, per_node)]
