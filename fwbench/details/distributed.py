"""A distributed cell's processes (--procs, --nnodes): ``details.distributed`` (its scaling and all-reduces),
``details.ranks`` (each rank's figures) and ``details.rendezvous`` (where its ranks met)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fwbench.details.compile import StageSeconds
from fwbench.details.parse import all_fields, as_float, as_int, as_str, each, floats, ints


@dataclass(frozen=True)
class DistributedDetails:
    """``details.distributed`` of a distributed cell (``runner.launchers.RankMember.after_steps``, rank 0's): its
    processes and scaling, the global batch and each process's rows, this rank, and ALLREDUCE_REPEATS bare
    all-reduces of the trained parameters' size (float32: ``allreduce_elements`` values, ``allreduce_bytes``), each
    one's seconds and their median."""

    procs: int | None = None
    scaling: str | None = None
    global_batch: int | None = None
    rank_batch: int | None = None
    rank: int | None = None
    allreduce_elements: int | None = None
    allreduce_bytes: int | None = None
    allreduce_s: tuple[float, ...] = ()
    allreduce_median_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Every key, as the rank writes it."""
        return all_fields(self)

    @classmethod
    def parse(cls, raw: Any) -> DistributedDetails | None:
        """None for a cell that stored none (absent, or not a JSON object)."""
        if not isinstance(raw, dict):
            return None
        return cls(
            procs=as_int(raw.get("procs")),
            scaling=as_str(raw.get("scaling")),
            global_batch=as_int(raw.get("global_batch")),
            rank_batch=as_int(raw.get("rank_batch")),
            rank=as_int(raw.get("rank")),
            allreduce_elements=as_int(raw.get("allreduce_elements")),
            allreduce_bytes=as_int(raw.get("allreduce_bytes")),
            allreduce_s=floats(raw.get("allreduce_s")) or (),
            allreduce_median_s=as_float(raw.get("allreduce_median_s")),
        )


@dataclass(frozen=True)
class RankDetail:
    """One rank of a distributed cell, in ``details.ranks`` (``runner.rankset.combine_results``): its node, CPUs,
    the threads its framework reported, its resident peak, first call, stage seconds and status."""

    rank: int | None = None
    node: int | None = None
    cpus: tuple[int, ...] | None = None
    threads_effective: Mapping[str, Any] | int | None = None
    peak_memory_bytes: int | None = None
    first_call_s: float | None = None
    stage_seconds: StageSeconds | None = None
    status: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Every key, as the rank set writes it."""
        return all_fields(self)

    @classmethod
    def parse(cls, raw: Any) -> RankDetail | None:
        if not isinstance(raw, dict):
            return None
        threads = raw.get("threads_effective")
        return cls(
            rank=as_int(raw.get("rank")),
            node=as_int(raw.get("node")),
            cpus=ints(raw.get("cpus")),
            threads_effective=threads if isinstance(threads, dict) else as_int(threads),
            peak_memory_bytes=as_int(raw.get("peak_memory_bytes")),
            first_call_s=as_float(raw.get("first_call_s")),
            stage_seconds=StageSeconds.parse(raw.get("stage_seconds")),
            status=as_str(raw.get("status")),
        )

    @classmethod
    def parse_all(cls, raw: Any) -> tuple[RankDetail, ...]:
        """``details.ranks``: every rank's record (empty for a cell of one process or an older row)."""
        return each(cls.parse, raw)


@dataclass(frozen=True)
class RendezvousNode:
    """One machine of a distributed cell: its node index (0: the one that ran fwbench run), host and ranks."""

    node: int | None = None
    host: str | None = None
    ranks: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return all_fields(self)

    @classmethod
    def parse(cls, raw: Any) -> RendezvousNode | None:
        if not isinstance(raw, dict):
            return None
        return cls(as_int(raw.get("node")), as_str(raw.get("host")), ints(raw.get("ranks")) or ())


@dataclass(frozen=True)
class Rendezvous:
    """``details.rendezvous`` of a distributed cell (``runner.rankset.RankSet.rendezvous``): where its ranks met —
    the master address, the ports, torch's store (``file`` on one machine, ``tcp`` across machines) — and each
    node's host and ranks."""

    address: str | None = None
    ports: tuple[int, ...] = ()
    store: str | None = None
    nodes: tuple[RendezvousNode, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Every key, as the rank set writes it."""
        return all_fields(self)

    @classmethod
    def parse(cls, raw: Any) -> Rendezvous | None:
        """None for a cell that stored none (absent, or not a JSON object)."""
        if not isinstance(raw, dict):
            return None
        return cls(
            address=as_str(raw.get("address")),
            ports=ints(raw.get("ports")) or (),
            store=as_str(raw.get("store")),
            nodes=each(RendezvousNode.parse, raw.get("nodes")),
        )
