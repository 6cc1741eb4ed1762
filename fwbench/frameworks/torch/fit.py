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

from fwbench.datasets.images import LoaderInput
from fwbench.frameworks.base import Backend
from fwbench.frameworks.roles import as_training_arch
from fwbench.frameworks.torch import data as torch_data
from fwbench.frameworks.torch import distributed
from fwbench.frameworks.torch.training import make_optimizer, train_epochs
from fwbench.models.fit import EpochEnd, FitDataset, FitResult, WaitClock, no_pause
from fwbench.models.training import optimizer_spec


def _loader(backend: Backend, dataset: FitDataset, batch_size: int) -> DataLoader[Any]:
    tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in dataset.inputs.values()]
    labels = torch.from_numpy(dataset.labels.astype(np.int64))
    return DataLoader(
        TensorDataset(*tensors, labels), batch_size=batch_size, shuffle=False, pin_memory=backend.device == "cuda"
    )


def _image_loader(source: LoaderInput, batch_size: int) -> DataLoader[Any]:
    """torch:dataloader's DataLoader over the dataset's JPEGs: batches (images NCHW, labels), the random crops
    new each epoch."""
    return torch_data.make_loader(
        source.folder, batch_size, source.workers, source.crop, source.transform, source.seed,
        exclude=source.exclude,
    )  # fmt: skip


def _logits(backend: Backend, dataset: FitDataset) -> np.ndarray:
    """(n, classes) logits of the whole dataset with the trained parameters, float32 → numpy (untimed), in
    eval() mode: ResNet's batch norm on the running statistics the epochs left."""
    tensors = [torch.from_numpy(np.ascontiguousarray(a)).to(backend.device) for a in dataset.inputs.values()]
    with torch.no_grad():
        return backend.model.eval()(*tensors)[0].float().cpu().numpy()


def fit(
    backend: Backend,
    dataset: FitDataset,
    epochs: int,
    batch_size: int,
    epoch_end: EpochEnd = no_pause,
    loader: LoaderInput | None = None,
) -> FitResult:
    """``epochs`` epochs of ``dataset`` in batches of ``batch_size``: the manual loop (mode eager) or
    Lightning's Trainer.fit (mode lightning); see the module docstring. With ``loader`` the epochs read the
    images through torch:dataloader's DataLoader instead, and the loop's waits for it are reported
    (``extra["input"]``; Lightning: from its batch-end hook to the next batch-start hook, its own bookkeeping
    between them included); ``dataset`` is then the evaluation set only."""
    assert backend.description is not None
    if backend.mode not in ("eager", "lightning", "ddp"):
        raise NotImplementedError(f"torch:{backend.mode} has no fit phase")
    arch = as_training_arch(backend.arch_module())
    model = backend.model.train()
    spec = optimizer_spec(backend.settings.optimizer)
    if backend.mode == "ddp":
        if loader is not None:
            raise NotImplementedError("torch:ddp's fit loop reads the in-memory dataset only")
        return distributed.fit(backend, arch, model, spec, dataset, epochs, batch_size, epoch_end)
    if backend.mode == "lightning":
        return _lightning(backend, arch, model, spec, dataset, epochs, batch_size, epoch_end, loader)
    return _manual(backend, arch, model, spec, dataset, epochs, batch_size, epoch_end, loader)


def _manual(
    backend: Backend,
    arch: Any,
    model: torch.nn.Module,
    spec: Any,
    dataset: FitDataset,
    epochs: int,
    batch_size: int,
    epoch_end: EpochEnd,
    source: LoaderInput | None = None,
) -> FitResult:
    started = time.perf_counter()
    clock = WaitClock()
    loader = _loader(backend, dataset, batch_size) if source is None else _image_loader(source, batch_size)
    optimizer = make_optimizer(spec, model.parameters())
    epoch_s, epoch_loss = train_epochs(backend, arch, model, optimizer, loader, epochs, epoch_end, clock)
    total_s = time.perf_counter() - started
    extra: dict[str, Any] = {"torch_threads_after": torch.get_num_threads()}
    if source is not None:
        extra["input"] = clock.report(epoch_s, "torch:dataloader", torch_data.LAYOUT)
    loop = "manual DataLoader loop" + (" over the dataset's JPEGs" if source is not None else "")
    return FitResult(loop, epoch_s, epoch_loss, _logits(backend, dataset), total_s, extra)


def _lightning_module(L: Any, arch: Any, model: torch.nn.Module, spec: Any, log_steps: bool) -> Any:
    """The LightningModule around ``model``: the manual loop's step (forward + F.cross_entropy), its losses kept for
    the epoch's mean, logged only when ``log_steps`` (self.log costs time in every step)."""

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.losses: list[torch.Tensor] = []

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
            *xs, y = batch
            loss = F.cross_entropy(arch.training_logits(self.model, *xs), y)
            self.losses.append(loss.detach())
            if log_steps:
                self.log("train_loss", loss, on_step=True, on_epoch=True)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return make_optimizer(spec, self.model.parameters())

    return Module()


def _lightning_callbacks(
    L: Any,
    backend: Backend,
    epoch_end: EpochEnd,
    epoch_s: list[float],
    epoch_loss: list[float],
    waits: WaitClock | None,
) -> list[Any]:
    """Lightning callbacks that append each epoch's wall time and mean loss to ``epoch_s`` / ``epoch_loss`` (and call
    ``epoch_end``), and with ``waits`` (a fit from images) time the loop's wait for each batch, from one batch-end
    hook to the next batch-start."""

    class EpochClock(L.Callback):
        def on_train_epoch_start(self, trainer: Any, module: Any) -> None:
            module.losses.clear()
            self.start = time.perf_counter()

        def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
            epoch_loss.append(float(torch.stack(module.losses).mean()))
            if backend.device == "cuda":
                torch.cuda.synchronize()
            epoch_s.append(time.perf_counter() - self.start)
            epoch_end(epoch_s[-1])

    if waits is None:
        return [EpochClock()]
    clock = waits

    class InputWaits(L.Callback):
        def on_train_epoch_start(self, trainer: Any, module: Any) -> None:
            clock.start_epoch()

        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
            clock.batch_ready()

        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if backend.device == "cuda":
                torch.cuda.synchronize()
            clock.step_done()

        def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
            clock.end_epoch()

    return [InputWaits(), EpochClock()]


def _lightning(
    backend: Backend,
    arch: Any,
    model: torch.nn.Module,
    spec: Any,
    dataset: FitDataset,
    epochs: int,
    batch_size: int,
    epoch_end: EpochEnd,
    source: LoaderInput | None = None,
) -> FitResult:
    import lightning as L

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # no "GPU available: ..." banners
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    epoch_s: list[float] = []
    epoch_loss: list[float] = []
    waits = WaitClock() if source is not None else None
    log_dir = backend.settings.fit_logging
    started = time.perf_counter()
    module = _lightning_module(L, arch, model, spec, log_steps=log_dir is not None)
    callbacks = _lightning_callbacks(L, backend, epoch_end, epoch_s, epoch_loss, waits)
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
    data = _loader(backend, dataset, batch_size) if source is None else _image_loader(source, batch_size)
    trainer.fit(module, train_dataloaders=data)
    total_s = time.perf_counter() - started
    extra: dict[str, Any] = {
        "torch_threads_after": torch.get_num_threads(),
        "lightning": L.__version__,
        "logging": None,
    }
    if waits is not None:
        extra["input"] = waits.report(
            epoch_s,
            "torch:dataloader",
            torch_data.LAYOUT,
            "per step, from Lightning's batch-end hook to its next batch-start hook (the batch fetched between them, "
            "with Lightning's own bookkeeping)",
        )
    if log_dir is not None:
        checkpoint = trainer.checkpoint_callback
        assert isinstance(checkpoint, ModelCheckpoint)
        extra["logging"] = {
            "log_dir": logger.log_dir,
            "checkpoint": checkpoint.last_model_path or checkpoint.best_model_path,
        }
    loop = "lightning Trainer.fit" + (" over the dataset's JPEGs" if source is not None else "")
    return FitResult(loop, epoch_s, epoch_loss, _logits(backend, dataset), total_s, extra)
