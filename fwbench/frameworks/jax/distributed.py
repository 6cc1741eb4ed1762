"""jax:distributed: one of N processes of a data-parallel training step, multi-controller JAX.

``jax.distributed.initialize`` joins the processes through the coordinator at rank 0's free port; CPU collectives
are gloo (``jax_cpu_collectives_implementation``). On one machine the coordinator binds 127.0.0.1 only
(``coordinator_bind_address``; by default it binds every interface) and gloo's sockets are created on 127.0.0.1:
jaxlib's gloo factory takes the address (``make_gloo_tcp_collectives(hostname=...)``), which no public option sets,
so fwbench passes it by wrapping that private factory before the CPU backend starts (without it gloo binds whatever
the host name resolves to, often 127.0.1.1, which another machine cannot reach). Across machines the address given
is the process's own machine's, as node 0 reaches it (``RankInfo.host``); the coordinator binds every interface.

The step is a *sharded jit* (GSPMD), not an explicit ``psum``: one mesh axis ``data`` over every process's device,
the global batch an array sharded along it (each process gives its rows:
``jax.make_array_from_process_local_data``), parameters, optimizer state and model state replicated. The loss is the
1-process loss of the global array (Σ w·CE / Σ w over all rows), so XLA inserts the all-reduces its gradient needs
(and, for ResNet, those of batch norm's batch statistics: the normalisation is over the global batch, synchronised).
"""

from __future__ import annotations

import functools
import time
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from fwbench.ranks import RankInfo

AXIS = "data"


def initialize() -> RankInfo:
    """Join this process's cell (once, before any JAX backend starts); RuntimeError outside a distributed cell."""
    info = RankInfo.current()
    if info is None:
        raise RuntimeError("jax:distributed runs as one process of a distributed cell (fwbench run --procs N)")
    from jax._src.lib import _jax  # the only place gloo's address can be given (see the module docstring)

    _jax.make_gloo_tcp_collectives = functools.partial(_jax.make_gloo_tcp_collectives, hostname=info.host(info.rank))
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    address = f"{info.master_addr}:{info.master_port}"
    jax.distributed.initialize(
        coordinator_address=address,
        num_processes=info.world_size,
        process_id=info.rank,
        coordinator_bind_address=address if info.loopback else None,
    )
    return info


def mesh() -> Mesh:
    """One axis over every process's first device of the default backend."""
    first: dict[int, Any] = {}
    for device in jax.devices():
        first.setdefault(device.process_index, device)
    return Mesh(np.array([first[index] for index in sorted(first)]), (AXIS,))


def batch_sharding() -> NamedSharding:
    """Arrays split along their first axis over the processes."""
    return NamedSharding(mesh(), PartitionSpec(AXIS))


def replicated() -> NamedSharding:
    """Arrays every process holds whole."""
    return NamedSharding(mesh(), PartitionSpec())


def global_batch(local: np.ndarray) -> jax.Array:
    """The global array whose rows ``[r·b, (r+1)·b)`` are process r's ``local`` rows."""
    return jax.make_array_from_process_local_data(batch_sharding(), np.asarray(local))


def replicate(tree: Any) -> Any:
    """``tree`` (the same values on every process) as arrays every process holds whole."""
    sharding = replicated()
    return jax.tree_util.tree_map(lambda leaf: jax.device_put(np.asarray(leaf), sharding), tree)


def local_copy(tree: Any) -> Any:
    """This process's copy of every replicated leaf (numpy-readable without the other processes)."""
    return jax.tree_util.tree_map(lambda leaf: leaf.addressable_data(0), tree)


def allreduce_seconds(elements: int, repeats: int) -> list[float]:
    """Seconds of ``repeats`` all-reduces (sum) of ``elements`` float32 values over the processes, each after a
    barrier: the jitted sum over the process axis of an array sharded along it, replicated out (compiled once,
    untimed)."""
    values = global_batch(np.zeros((1, elements), dtype=np.float32))
    reduce = jax.jit(lambda x: x.sum(axis=0), out_shardings=replicated())
    jax.block_until_ready(reduce(values))
    seconds = []
    for index in range(repeats):
        multihost_utils.sync_global_devices(f"fwbench-allreduce-{index}")
        start = time.perf_counter()
        jax.block_until_ready(reduce(values))
        seconds.append(time.perf_counter() - start)
    return seconds
