"""torch:ddp and torch:ddp-compile: one of N ranks of a data-parallel training step.

The process group is gloo on CPU (nccl on CUDA), set up from the rank's identity (fwbench.ranks.RankInfo): on one
machine through a ``FileStore`` in the rank set's temporary folder, so no TCP store listens anywhere (a
``TCPStore`` server binds every interface whatever host it is given); gloo's pair sockets stay on the loopback
interface (``GLOO_SOCKET_IFNAME=lo``, set by the manager).

Each rank runs ``DistributedDataParallel`` on its rows of the global batch. The loss of the global batch is
Σ w·CE / Σ w over all of its rows, so each rank all-reduces ``[Σ_rank w·CE, Σ_rank w]`` (one small all-reduce per
step) and back-propagates ``world_size × Σ_rank w·CE / Σ w``: DDP averages gradients over ranks, so the update is
the 1-process update on the global batch. The step returns the global loss.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from fwbench.frameworks.base import Backend
from fwbench.frameworks.roles import TrainingArch
from fwbench.frameworks.torch.training import make_optimizer, train_epochs
from fwbench.models.fit import EpochEnd, FitDataset, FitResult
from fwbench.models.training import OptimizerSpec
from fwbench.ranks import RankInfo

# The process group's own timeout (a collective waiting for a peer, the store's rendezvous) against the cell's
# --timeout: twice it, so that a peer that hangs is always the manager's timeout (every rank killed, the cell
# ``timeout``, the ranks it waited for named) and never gloo's error in the waiting rank, which at the same length
# raced the manager's deadline (each command's) and won on a loaded machine.
COLLECTIVE_TIMEOUT_FACTOR = 2


def init_process_group(device: str, timeout_s: float) -> RankInfo:
    """Join this rank's process group (once per process); its RankInfo. RuntimeError outside a distributed cell.
    ``timeout_s``: the cell's --timeout (the group's own is :data:`COLLECTIVE_TIMEOUT_FACTOR` times it)."""
    info = RankInfo.current()
    if info is None:
        raise RuntimeError("torch:ddp runs as one rank of a distributed cell (fwbench run --procs N)")
    if not dist.is_initialized():
        timeout = datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_FACTOR * timeout_s)
        if info.rendezvous_file is not None:
            store: dist.Store = dist.FileStore(info.rendezvous_file, info.world_size)
        else:  # across machines: rank 0 serves a TCP store at the master address
            store = dist.TCPStore(info.master_addr, info.master_port, info.world_size, info.rank == 0, timeout=timeout)
        backend = "nccl" if device == "cuda" else "gloo"
        dist.init_process_group(backend, store=store, rank=info.rank, world_size=info.world_size, timeout=timeout)
    return info


class Replicated:
    """The DDP-wrapped model as the arch module's ``training_logits`` uses it: calling it runs DDP's forward (which
    arms the gradient all-reduce), attributes (a tied embedding, ``training``) are the inner module's."""

    def __init__(self, ddp: DistributedDataParallel) -> None:
        self._ddp = ddp

    def __call__(self, *inputs: torch.Tensor) -> Any:
        return self._ddp(*inputs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ddp.module, name)


def make_train_step(
    backend: Backend,
    arch: TrainingArch,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    inputs: Sequence[torch.Tensor],
    targets: Sequence[torch.Tensor],
) -> Callable[[], object]:
    """The rank's timed call: zero_grad, forward on its rows (DDP), the global weighted loss (one all-reduce of two
    numbers), backward (DDP's bucketed gradient all-reduce), optimizer step; returns the global batch's loss.
    ddp-compile: the forward and loss under torch.compile (DDPOptimizer splits the graph at bucket boundaries),
    the optimizer step under its own torch.compile."""
    info = init_process_group(backend.device, backend.settings.timeout_s)
    device_ids = [torch.cuda.current_device()] if backend.device == "cuda" else None
    ddp = DistributedDataParallel(model, device_ids=device_ids)
    replicated = Replicated(ddp)
    labels, weights = targets
    local_weight = weights.sum().reshape(1)
    scale = float(info.world_size)
    autocast = backend.dtype == "bf16"
    device_type = backend.device
    logits_of = arch.training_logits

    def local_loss_sum(*batch: torch.Tensor) -> torch.Tensor:
        """Σ w·CE over this rank's rows, float32."""
        if autocast:
            with torch.autocast(device_type, dtype=torch.bfloat16):
                logits = logits_of(replicated, *batch)
            logits = logits.float()
        else:
            logits = logits_of(replicated, *batch)
        per_position = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
        return (per_position * weights.reshape(-1)).sum()

    def optimizer_step() -> None:
        optimizer.step()

    if backend.mode == "ddp-compile":
        local_loss_sum = torch.compile(local_loss_sum, mode=backend.settings.compile_mode)
        optimizer_step = torch.compile(optimizer_step, fullgraph=False, mode=backend.settings.compile_mode)
    on_cuda = backend.device == "cuda"

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        local = local_loss_sum(*inputs)
        totals = torch.cat([local.detach().reshape(1), local_weight])
        dist.all_reduce(totals)  # [Σ w·CE, Σ w] of the global batch
        (local * (scale / totals[1])).backward()
        optimizer_step()
        if on_cuda:
            torch.cuda.synchronize()
        return totals[0] / totals[1]

    return step


def fit(
    backend: Backend,
    arch: TrainingArch,
    model: torch.nn.Module,
    spec: OptimizerSpec,
    dataset: FitDataset,
    epochs: int,
    batch_size: int,
    epoch_end: EpochEnd,
) -> FitResult:
    """torch:ddp's fit loop: torch:eager's manual loop with the module under DistributedDataParallel and the
    DataLoader over a ``DistributedSampler(shuffle=False)`` of the same dataset, ``batch_size`` rows per process per
    step. The sampler deals rows round-robin, so at step k the processes together hold exactly rows
    ``[k·N·b, (k+1)·N·b)``, the 1-process batch of N·b; DDP's gradient average of the per-process mean losses is the
    mean over that global batch. An epoch's loss is the mean over every process's batches (all-reduced)."""
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    info = init_process_group(backend.device, backend.settings.timeout_s)
    device, on_cuda = backend.device, backend.device == "cuda"
    ddp = DistributedDataParallel(model, device_ids=[torch.cuda.current_device()] if on_cuda else None)
    replicated = Replicated(ddp)
    tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in dataset.inputs.values()]
    rows = TensorDataset(*tensors, torch.from_numpy(dataset.labels.astype(np.int64)))
    sampler: DistributedSampler[Any] = DistributedSampler(
        rows, num_replicas=info.world_size, rank=info.rank, shuffle=False
    )
    loader = DataLoader(rows, batch_size=batch_size, sampler=sampler, pin_memory=on_cuda)
    optimizer = make_optimizer(spec, model.parameters())
    started = time.perf_counter()

    def global_mean(total: torch.Tensor, batches: int) -> float:
        dist.all_reduce(total)  # the epoch's loss over every process's batches (and the epoch's end on each)
        return float(total) / (batches * info.world_size)

    epoch_s, epoch_loss = train_epochs(
        backend, arch, replicated, optimizer, loader, epochs, epoch_end, epoch_mean=global_mean
    )
    total_s = time.perf_counter() - started
    with torch.no_grad():
        inputs = [t.to(device) for t in tensors]
        logits = model.eval()(*inputs)[0].float().cpu().numpy()
    loop = "manual DataLoader loop over a DistributedSampler, DistributedDataParallel"
    return FitResult(loop, epoch_s, epoch_loss, logits, total_s, {"processes": info.world_size})


def allreduce_seconds(elements: int, repeats: int, device: str) -> list[float]:
    """Seconds of ``repeats`` all-reduces (sum) of ``elements`` float32 values over the process group, each after
    a barrier (so every rank starts together)."""
    buffer = torch.zeros(elements, dtype=torch.float32, device=device)
    seconds = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(buffer)
        if device == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return seconds
