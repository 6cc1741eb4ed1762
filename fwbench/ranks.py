"""The processes of a distributed cell (``Case.procs``) as each of them sees itself: its rank, the world size and
where the processes meet. Framework-free: the manager writes it into each process's environment
(:meth:`RankInfo.environ`) and the framework backends read it back (:meth:`RankInfo.current`).

On one machine the processes meet on 127.0.0.1 only: free ports chosen by fwbench (:func:`free_ports`) and, for
torch, a rendezvous file in a temporary folder (nothing listens for it); ``GLOO_SOCKET_IFNAME=lo`` keeps gloo's
sockets on the loopback interface. A cell across machines (``--nnodes``, :mod:`fwbench.runner.nodes`) meets at the
master address: each process's own host and port in ``hosts`` / ``ports``, torch through a TCP store there.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

LOOPBACK = "127.0.0.1"
ENV_PREFIX = "FWBENCH_DIST_"


def interface_of(address: str) -> str | None:
    """The name of this machine's network interface that holds ``address`` (``lo`` for 127.0.0.1); None when none
    does."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(item.family == socket.AF_INET and item.address == address for item in addresses):
            return name
    return None


def gloo_interface(address: str) -> dict[str, str]:
    """``GLOO_SOCKET_IFNAME`` for ranks that meet at ``address``, this machine's: the interface holding it (torch's
    gloo otherwise takes whatever the host name resolves to, often 127.0.1.1), unless the user set one."""
    name = None if "GLOO_SOCKET_IFNAME" in os.environ else interface_of(address)
    return {"GLOO_SOCKET_IFNAME": name} if name is not None else {}


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """``count`` distinct TCP ports free on ``host`` now: the kernel picks them (bind to port 0; held open together
    while they are chosen, so none repeats), so two cells started back to back get different ports and never a fixed
    one two runs could collide on."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for probe in sockets:
            probe.bind((host, 0))
        return [int(probe.getsockname()[1]) for probe in sockets]
    finally:
        for probe in sockets:
            probe.close()


@dataclass(frozen=True)
class RankInfo:
    """One process of a distributed cell: ``rank`` of ``world_size``; the processes meet at ``master_addr``
    (``ports``: the free ports fwbench chose, the first for the coordinator at ``master_addr``, then one per rank on
    that rank's host, where a framework wants a port per process) and, on one machine, through ``rendezvous_file``
    (a path in a temporary folder the manager removes). Across machines ``hosts`` holds every rank's host (empty: all
    at ``master_addr``) and ``local_rank`` the process's index on its own machine."""

    rank: int
    world_size: int
    master_addr: str
    ports: tuple[int, ...]
    rendezvous_file: str | None = None
    hosts: tuple[str, ...] = ()
    local_rank: int | None = None

    def host(self, rank: int) -> str:
        """The address rank ``rank`` runs at."""
        return self.hosts[rank] if self.hosts else self.master_addr

    def rank_address(self, rank: int) -> str:
        """``host:port`` of rank ``rank``'s own port (TensorFlow's per-worker gRPC server)."""
        return f"{self.host(rank)}:{self.ports[1 + rank]}"

    @property
    def master_port(self) -> int:
        """The coordinator's port (rank 0's)."""
        return self.ports[0]

    @property
    def loopback(self) -> bool:
        return self.master_addr in (LOOPBACK, "localhost")

    def environ(self) -> dict[str, str]:
        """The variables a rank's worker starts with: fwbench's own and the launcher conventions frameworks read
        (torchrun's RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT); gloo on the loopback interface for a
        run on one machine."""
        env = {
            f"{ENV_PREFIX}RANK": str(self.rank),
            f"{ENV_PREFIX}WORLD_SIZE": str(self.world_size),
            f"{ENV_PREFIX}MASTER_ADDR": self.master_addr,
            f"{ENV_PREFIX}PORTS": ",".join(map(str, self.ports)),
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.rank if self.local_rank is None else self.local_rank),
            "WORLD_SIZE": str(self.world_size),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }
        if self.rendezvous_file is not None:
            env[f"{ENV_PREFIX}RENDEZVOUS_FILE"] = self.rendezvous_file
        if self.hosts:
            env[f"{ENV_PREFIX}HOSTS"] = ",".join(self.hosts)
        if self.loopback:
            env["GLOO_SOCKET_IFNAME"] = "lo"
        return env

    @classmethod
    def current(cls) -> RankInfo | None:
        """This process's rank as the manager set it; None outside a distributed cell."""
        if f"{ENV_PREFIX}RANK" not in os.environ:
            return None
        return cls(
            rank=int(os.environ[f"{ENV_PREFIX}RANK"]),
            world_size=int(os.environ[f"{ENV_PREFIX}WORLD_SIZE"]),
            master_addr=os.environ[f"{ENV_PREFIX}MASTER_ADDR"],
            ports=tuple(int(p) for p in os.environ[f"{ENV_PREFIX}PORTS"].split(",")),
            rendezvous_file=os.environ.get(f"{ENV_PREFIX}RENDEZVOUS_FILE"),
            hosts=tuple(filter(None, os.environ.get(f"{ENV_PREFIX}HOSTS", "").split(","))),
            local_rank=int(os.environ["LOCAL_RANK"]) if "LOCAL_RANK" in os.environ else None,
        )


def rank_rows(rank: int, world_size: int, rows: int) -> slice:
    """Rank ``rank``'s rows of a global batch of ``rows``: ``[r·b, (r+1)·b)`` with ``b = rows / world_size``."""
    if rows % world_size:
        raise ValueError(f"a global batch of {rows} does not split evenly over {world_size} processes")
    size = rows // world_size
    return slice(rank * size, (rank + 1) * size)
