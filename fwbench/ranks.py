"""The processes of a distributed cell (``Case.procs``) as each of them sees itself: its rank, the world size and
where the processes meet. Framework-free: the manager writes it into each process's environment
(:meth:`RankInfo.environ`) and the framework backends read it back (:meth:`RankInfo.current`).

On one machine the processes meet on 127.0.0.1 only: free ports chosen by fwbench (:func:`free_ports`) and, for
torch, a rendezvous file in a temporary folder (nothing listens for it); ``GLOO_SOCKET_IFNAME=lo`` keeps gloo's
sockets on the loopback interface.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

LOOPBACK = "127.0.0.1"
ENV_PREFIX = "FWBENCH_DIST_"


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
    (``ports``: the free ports fwbench chose there, the first for the coordinator, one per rank after it where a
    framework wants a port per process) and, on one machine, through ``rendezvous_file`` (a path in a temporary
    folder the manager removes)."""

    rank: int
    world_size: int
    master_addr: str
    ports: tuple[int, ...]
    rendezvous_file: str | None = None

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
            "LOCAL_RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }
        if self.rendezvous_file is not None:
            env[f"{ENV_PREFIX}RENDEZVOUS_FILE"] = self.rendezvous_file
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
        )


def rank_rows(rank: int, world_size: int, rows: int) -> slice:
    """Rank ``rank``'s rows of a global batch of ``rows``: ``[r·b, (r+1)·b)`` with ``b = rows / world_size``."""
    if rows % world_size:
        raise ValueError(f"a global batch of {rows} does not split evenly over {world_size} processes")
    size = rows // world_size
    return slice(rank * size, (rank + 1) * size)
