"""Phase fit in PyTorch: ``torch:eager`` is the manual DataLoader loop, ``torch:lightning`` Lightning's
``Trainer.fit`` over the same DataLoader and the same nn.Module (fwbench.models.fit says what is trained).
Lightning's logger and checkpointing are off unless ``Settings.fit_logging`` names a directory: then a
``CSVLogger`` (``<dir>/<model>-b<batch>/version_<n>/metrics.csv``: ``train_loss`` per epoch, and per step
every ``log_every_n_steps`` = 50, Lightning's default) and a
``ModelCheckpoint`` into that version's ``checkpoints/`` (the last epoch's ``.ckpt``).
ResNet: the module is in train() mode during the epochs (batch norm on batch statistics, running buffers
updated, momentum 0.1) and in eval() mode for the final logits (the running statistics).

Both build ``DataLoader(TensorDataset(*inputs, labels), batch_size, shuffle=False)`` (single process, the
default collate) and ``torch.optim`` from ``Settings.optimizer``; the loss is ``F.cross_entropy`` (mean).
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from fwbench.frameworks.base import Backend, as_training_arch
from fwbench.frameworks.torch.training import make_optimizer
from fwbench.models.fit import EpochEnd, FitDataset, FitResult, no_pause
from fwbench.models.training import optimizer_spec


def _loader(backend: Backend, dataset: FitDataset, batch_size: int) -> DataLoader[Any]:
    tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in dataset.inputs.values()]
    labels = torch.from_numpy(dataset.labels.astype(np.int64))
    return DataLoader(
        TensorDataset(*tensors, labels), batch_size=batch_size, shuffle=False, pin_memory=backend.device == "cuda"
    )


def _logits(backend: Backend, dataset: FitDataset) -> np.ndarray:
    """(n, classes) logits of the whole dataset with the trained parameters, float32 → numpy (untimed), in
    eval() mode: ResNet's batch norm on the running statistics the epochs left."""
    tensors = [torch.from_numpy(np.ascontiguousarray(a)).to(backend.device) for a in dataset.inputs.values()]
    with torch.no_grad():
        return backend.model.eval()(*tensors)[0].float().cpu().numpy()


def fit(
    backend: Backend, dataset: FitDataset, epochs: int, batch_size: int, epoch_end: EpochEnd = no_pause
) -> FitResult:
    """``epochs`` epochs of ``dataset`` in batches of ``batch_size``: the manual loop (mode eager) or
    Lightning's Trainer.fit (mode lightning); see the module docstring."""
    assert backend.description is not None
    if backend.mode not in ("eager", "lightning"):
        raise NotImplementedError(f"torch:{backend.mode} has no fit phase")
    arch = as_training_arch(backend.arch_module())
    model = backend.model.train()
    spec = optimizer_spec(backend.settings.optimizer)
    run = _lightning if backend.mode == "lightning" else _manual
    return run(backend, arch, model, spec, dataset, epochs, batch_size, epoch_end)


def _manual(
    backend: Backend,
    arch: Any,
    model: torch.nn.Module,
    spec: Any,
    dataset: FitDataset,
    epochs: int,
    batch_size: int,
    epoch_end: EpochEnd,
) -> FitResult:
    device, on_cuda = backend.device, backend.device == "cuda"
    epoch_s: list[float] = []
    epoch_loss: list[float] = []
    started = time.perf_counter()
    loader = _loader(backend, dataset, batch_size)
    optimizer = make_optimizer(spec, model.parameters())
    for _ in range(epochs):
        epoch_start = time.perf_counter()
        total, batches = torch.zeros((), device=device), 0
        for *xs, y in loader:
            xs, y = [x.to(device, non_blocking=True) for x in xs], y.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(arch.training_logits(model, *xs), y)
            loss.backward()
            optimizer.step()
            total += loss.detach()
            batches += 1
        mean = float(total) / batches  # reads the loss: the epoch's work has finished
        if on_cuda:
            torch.cuda.synchronize()
        epoch_s.append(time.perf_counter() - epoch_start)
        epoch_loss.append(mean)
        epoch_end(epoch_s[-1])
    total_s = time.perf_counter() - started
    return FitResult(
        "manual DataLoader loop",
        epoch_s,
        epoch_loss,
        _logits(backend, dataset),
        total_s,
        {"torch_threads_after": torch.get_num_threads()},
    )


def _lightning(
    backend: Backend,
    arch: Any,
    model: torch.nn.Module,
    spec: Any,
    dataset: FitDataset,
    epochs: int,
    batch_size: int,
    epoch_end: EpochEnd,
) -> FitResult:
    import lightning as L

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # no "GPU available: ..." banners
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.losses: list[torch.Tensor] = []

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
            *xs, y = batch
            loss = F.cross_entropy(arch.training_logits(self.model, *xs), y)
            self.losses.append(loss.detach())
            if log_dir is not None:  # only when asked: self.log costs time in every step
                self.log("train_loss", loss, on_step=True, on_epoch=True)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return make_optimizer(spec, self.model.parameters())

    epoch_s: list[float] = []
    epoch_loss: list[float] = []

    class EpochClock(L.Callback):
        """Wall time and mean loss of each training epoch (Lightning's own hooks)."""

        def on_train_epoch_start(self, trainer: Any, module: Any) -> None:
            module.losses.clear()
            self.start = time.perf_counter()

        def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
            epoch_loss.append(float(torch.stack(module.losses).mean()))
            if backend.device == "cuda":
                torch.cuda.synchronize()
            epoch_s.append(time.perf_counter() - self.start)
            epoch_end(epoch_s[-1])

    log_dir = backend.settings.fit_logging
    started = time.perf_counter()
    module = Module()
    callbacks: list[Any] = [EpochClock()]
    logger: Any = False
    if log_dir is not None:  # Settings.fit_logging: a CSVLogger and a ModelCheckpoint under it
        from lightning.pytorch.callbacks import ModelCheckpoint
        from lightning.pytorch.loggers import CSVLogger

        assert backend.description is not None
        logger = CSVLogger(log_dir, name=f"{backend.description.name}-b{batch_size}")
        callbacks.append(ModelCheckpoint(dirpath=os.path.join(logger.log_dir, "checkpoints")))
    trainer = L.Trainer(
        accelerator="gpu" if backend.device == "cuda" else "cpu",
        devices=1,
        max_epochs=epochs,
        enable_checkpointing=log_dir is not None,
        logger=logger,
        default_root_dir=log_dir,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=callbacks,
    )
    trainer.fit(module, train_dataloaders=_loader(backend, dataset, batch_size))
    total_s = time.perf_counter() - started
    extra = {"torch_threads_after": torch.get_num_threads(), "lightning": L.__version__, "logging": None}
    if log_dir is not None:
        checkpoint = trainer.checkpoint_callback
        assert isinstance(checkpoint, ModelCheckpoint)
        extra["logging"] = {
            "log_dir": logger.log_dir,
            "checkpoint": checkpoint.last_model_path or checkpoint.best_model_path,
        }
    return FitResult("lightning Trainer.fit", epoch_s, epoch_loss, _logits(backend, dataset), total_s, extra)
