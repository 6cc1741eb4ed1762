"""Phase fit: the framework's own training loop (its package's ``fit.py``, :meth:`Backend.fit_module`) trains
``settings.epochs`` epochs of the seeded dataset (fwbench.models.fit). Epoch 1 (tracing and compilation included)
is stored as ``first_call_s``, epochs 2.. are the samples (one epoch each); ``details.fit`` holds every epoch's
seconds and mean loss and the final full-dataset loss and accuracy. Agreement across runtimes is checked in
reports. A final loss that is not finite makes the cell ``mismatch``.

Interleaved (the default), each epoch after the first is one block on the manager's command
(:class:`EpochBlocks`), so the runtimes of a group take turns epoch by epoch, as other phases do block by block."""

from __future__ import annotations

import dataclasses
import gc
import inspect
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fwbench.datasets.images import LoaderInput, read_labels
from fwbench.frameworks import RuntimeInfo, fit_input_unsupported
from fwbench.measure import memory, processes
from fwbench.models import get_model
from fwbench.models.base import ModelDescription
from fwbench.models.fit import EpochEnd, FitDataset, evaluate, image_fit_dataset, make_fit_dataset, no_pause
from fwbench.models.training import optimizer_spec
from fwbench.runner import estimate
from fwbench.runner.cell import Cell
from fwbench.runner.phases.base import Phase
from fwbench.runner.phases.data import dataset_facts  # the data phase's checks: manifest, corrupt files
from fwbench.spec import Case, Settings, SpecError

if TYPE_CHECKING:
    from fwbench.frameworks.base import Backend


LOADER_EXIT_S = 10.0  # a fit from images: how long its loader's worker processes may take to end after it


class EpochBlocks:
    """The fit loop's :data:`~fwbench.models.fit.EpochEnd` in an interleaved worker: after epoch 1 it says
    ``ready`` and answers ``calibrate`` (a block is one epoch); after each later epoch it reports that epoch as a
    ``block``; then it waits for the manager's next command, ``block`` (the next epoch runs) or, after the last
    epoch, ``finish``. The waiting happens between two epochs' clocks, never inside one."""

    def __init__(self, cell: Cell, epochs: int, barrier: Callable[[], None] | None = None) -> None:
        """``barrier``: a distributed fit's, before each epoch the manager asks for (every process starts it
        together, outside its clock)."""
        self.cell, self.epochs, self.barrier = cell, epochs, barrier
        self.done = 0
        self.first_s = 0.0
        self.start_unix_s = 0.0
        self.waited_s = 0.0  # between epochs, for the manager: not part of the loop's own time

    def __call__(self, seconds: float) -> None:
        entered = time.perf_counter()
        self.done += 1
        if self.done == 1:
            self.first_s = seconds
            self.cell.send("ready", peak_memory_bytes=memory.peak_rss_bytes())
        else:
            self.cell.send("block", seconds=seconds, calls=1, start_unix_s=self.start_unix_s)
        expected = "finish" if self.done == self.epochs else "block"
        command = self.cell.await_command()
        if command["command"] == "calibrate":  # after epoch 1 only: the block is the epoch
            self.cell.send("calibrated", calls_per_block=1, block_s=self.first_s)
            command = self.cell.await_command()
        if command["command"] != expected:
            raise RuntimeError(f"after epoch {self.done} of {self.epochs} the manager sent {command['command']!r}")
        if expected == "block" and self.barrier is not None:
            self.barrier()
        self.start_unix_s = time.time()
        self.waited_s += time.perf_counter() - entered

    def check_finished(self, runtime: str) -> None:
        """Raise unless the fit loop called this after every epoch (else the manager's blocks were not served)."""
        if self.done != self.epochs:
            raise RuntimeError(f"{runtime}'s fit loop called epoch_end {self.done} times for {self.epochs} epochs")


def _loader_reads(runtime: str, fit: Callable[..., Any], loader: LoaderInput | None) -> dict[str, Any]:
    """The keyword arguments that hand ``fit`` the loader of --input images (none without one); NotImplementedError
    when it takes no loader."""
    reads: dict[str, Any] = {}
    if loader is not None:
        if "loader" not in inspect.signature(fit).parameters:
            raise NotImplementedError(f"{runtime}'s fit.py cannot read --input images")
        reads["loader"] = loader
    return reads


def _run_fit(
    fit: Callable[..., Any],
    backend: Backend,
    dataset: FitDataset,
    case: Case,
    epochs: int,
    blocks: EpochBlocks | None,
    reads: dict[str, Any],
) -> Any:
    """Run the fit loop ``epochs`` epochs, calling its epoch_end (``blocks`` when interleaved, else no pause); a
    plugin's fit.py from before epoch_end runs start to end, when neither blocks nor a loader are asked of it."""
    if "epoch_end" in inspect.signature(fit).parameters:
        epoch_end: EpochEnd = blocks if blocks is not None else no_pause
        return fit(backend, dataset, epochs, case.rank_batch, epoch_end, **reads)
    if blocks is None and not reads:  # a plugin's fit.py from before epoch_end: it can still run start to end
        return fit(backend, dataset, epochs, case.batch_size)
    raise NotImplementedError(f"{case.runtime}'s fit.py takes no epoch_end: run it with --interleave off")


def _check_loader_gone(cell: Cell) -> None:
    """After a fit from --input images: the loader's worker processes (made inside fit()) must end within
    LOADER_EXIT_S; how many did not is stored, and any makes the cell fail."""
    gc.collect()  # a library's loop (Lightning, Keras) may hold its loader in reference cycles
    left = processes.wait_gone([child.pid for child in processes.children()], LOADER_EXIT_S)
    cell.result["fit_input"]["workers_left_running"] = len(left)
    if left:
        raise RuntimeError(f"{len(left)} loader worker processes still ran {LOADER_EXIT_S:g} s after the fit")


def takes_images(description: ModelDescription) -> bool:
    """Whether the model's one input is ``pixel_values`` (it can fit on the data phase's --input images)."""
    return set(description.make_inputs(1, None, 0)) == {"pixel_values"}


class Fit(Phase):
    """build → fit (every epoch, the first one compiling) → evaluate; no timer of ours, no parity stage."""

    name = "fit"
    dtypes = ("fp32",)
    distributed = True
    report_sections = ("fit",)  # high-level loops against the manual ones

    def interleaves(self, settings: Settings) -> bool:
        """Not from --input images: a loop waiting for its turn keeps its loader prefetching, and its next epoch
        would wait less for data than it does alone."""
        return settings.fit_source == "memory"

    def blocks_per_round(self, settings: Settings) -> int:
        """One block per epoch after the first (which compiles: the warm-up)."""
        return settings.epochs - 1

    def unsupported(self, description: ModelDescription, info: RuntimeInfo, settings: Settings) -> str | None:
        """The model's own refusal; from ``--input`` images, a runtime whose fit loop cannot read them, or a model
        that does not take images."""
        refused = description.fit_unsupported()
        if refused is None and settings.fit_source == "input":
            refused = fit_input_unsupported(info)
            if refused is None and not takes_images(description):
                refused = f"{description.name} does not take images (--input holds images)"
        return refused

    def check_grid(self, batch_sizes: list[int], settings: Settings) -> None:
        """Every batch size divides the in-memory fit samples (an epoch is whole batches)."""
        uneven = [b for b in batch_sizes if settings.fit_samples % b] if settings.fit_source == "memory" else []
        if uneven:
            raise SpecError(
                f"phase fit: batch size {uneven[0]} does not divide the {settings.fit_samples} fit "
                "samples (--fit-samples must be a multiple of every batch size)"
            )

    def check_cell(self, case: Case, settings: Settings) -> None:
        """A distributed fit trains on the in-memory dataset, and its global batch divides the fit samples."""
        if case.procs is None:
            return
        if settings.fit_source != "memory":
            raise SpecError(
                "--procs with --phase fit trains on the in-memory dataset (--fit-source memory), not --input"
            )
        if settings.fit_samples % case.global_batch:
            raise SpecError(
                f"phase fit: the global batch {case.global_batch} ({case.procs} processes) does not divide the "
                f"{settings.fit_samples} fit samples"
            )

    def samples(self, settings: Settings) -> int | None:
        """The samples of one epoch: the in-memory dataset's, or the --input folder's images (None when it cannot
        be read)."""
        if settings.fit_source == "input" and settings.data_input is not None:
            try:
                return len(read_labels(Path(settings.data_input)))
            except OSError:
                return None
        return settings.fit_samples

    def estimate_cell_s(self, case: Case, settings: Settings) -> float:
        """Each round: start-up, build, compile, and the epochs' steps (each its FLOPs plus a training loop's
        per-step cost), plus decoding every image each epoch (1 core) when the fit reads --input images."""
        samples = self.samples(settings) or settings.fit_samples
        decode_s = samples * estimate.IMAGE_S if settings.fit_source == "input" else 0.0
        call = estimate.call_s(self.step_flops(get_model(case.model), case), settings, case.runtime)
        steps = settings.epochs * (samples // case.global_batch)
        timing = steps * (call + estimate.FIT_STEP_OVERHEAD_S) + settings.epochs * decode_s
        return settings.rounds * (estimate.setup_s(case) + timing)

    def flops_per_call(self, description: ModelDescription, case: Case, settings: Settings) -> int | None:
        """One sample is an epoch: its optimizer steps' FLOPs (from images: the dataset's images // batch, None
        when the folder cannot be read)."""
        samples = self.samples(settings)
        return None if samples is None else self.step_flops(description, case) * (samples // case.global_batch)

    def dataset(self, cell: Cell, description: ModelDescription) -> tuple[FitDataset, LoaderInput | None]:
        """What the epochs read: the seeded in-memory dataset, or (``fit_source`` input) the data phase's images
        through the framework's loader, cropped to the model's image size, with their center-crop evaluation set
        (``details.fit.input`` says which images and how)."""
        settings = cell.job.settings
        if settings.fit_source == "memory":
            return make_fit_dataset(description, settings.fit_samples, settings.seed), None
        if not takes_images(description):
            raise NotImplementedError(f"phase fit from --input images needs an image model, not {description.name}")
        crop = int(description.make_inputs(1, None, settings.seed)["pixel_values"].shape[-1])
        assert settings.data_input is not None  # the planner sets the folder with fit_source input
        folder = Path(settings.data_input)
        facts, excluded = dataset_facts(folder, settings, None)
        exclude = frozenset(excluded)
        loader = LoaderInput(folder, crop, settings.transform, settings.fit_workers, settings.seed, exclude)
        cell.result["fit_input"] = {**facts.to_dict(), "crop": crop, "workers": settings.fit_workers}
        return image_fit_dataset(folder, crop, exclude), loader

    def measure(self, cell: Cell, backend: Backend, description: ModelDescription) -> None:
        case, settings = cell.job.case, cell.job.settings
        dataset, loader = self.dataset(cell, description)
        fit = backend.fit_module().fit  # the framework package's fit.py, checked to provide its role
        reads = _loader_reads(case.runtime, fit, loader)
        cell.stage("fit")
        cell.result["peak_memory_scope"] = "timed" if memory.reset_peak_rss() else "process"
        cell.result["loadavg_before_timing"] = os.getloadavg()
        together = cell.launcher.together(backend)  # a distributed fit's processes start each epoch together
        blocks = EpochBlocks(cell, settings.epochs, together) if cell.job.interleaved else None
        outcome = _run_fit(fit, backend, dataset, case, settings.epochs, blocks, reads)
        if loader is not None:  # the loop's loader was made inside fit(): its worker processes must be gone
            _check_loader_gone(cell)
        waited_s = 0.0
        if blocks is not None:
            blocks.check_finished(case.runtime)
            waited_s = blocks.waited_s
        cell.result["peak_memory_bytes"] = memory.peak_rss_bytes()
        cell.stage("evaluate")
        final = evaluate(outcome.logits, dataset.labels)
        if len(outcome.epoch_s) != settings.epochs or len(outcome.epoch_loss) != settings.epochs:
            raise RuntimeError(
                f"{case.runtime} fit reported {len(outcome.epoch_s)} epoch times and "
                f"{len(outcome.epoch_loss)} epoch losses for {settings.epochs} epochs"
            )
        cell.result["fit"] = {
            "loop": outcome.loop,
            "epochs": settings.epochs,
            "samples": dataset.size,
            "batch_size": case.batch_size,
            "global_batch": case.global_batch,
            "steps_per_epoch": dataset.size // case.global_batch,
            "source": settings.fit_source,
            "epoch_s": outcome.epoch_s,
            "epoch_loss": outcome.epoch_loss,
            "total_s": outcome.total_s - waited_s,  # the loop's own time: interleaved, without the turns it waited
            "waited_between_epochs_s": waited_s,
            "final_loss": final["loss"],
            "final_accuracy": final["accuracy"],
            "optimizer": dataclasses.asdict(optimizer_spec(settings.optimizer)),
            "samples_are": "wall seconds of epochs 2.. (epoch 1, compilation included, is first_call_s)",
            **outcome.extra,
        }
        if "fit_input" in cell.result:  # the images read: dataset, transform, crop, loader workers
            cell.result["fit"]["input"] = {**cell.result.pop("fit_input"), **outcome.extra.get("input", {})}
        cell.result.update(
            status="ok",
            first_call_s=outcome.epoch_s[0],
            samples_s=outcome.epoch_s[1:],
            calls_per_sample=1,
            stop_reason="epochs",
            timing_elapsed_s=sum(outcome.epoch_s[1:]),
        )
        if not math.isfinite(final["loss"]):
            cell.fail_check(f"the final loss after {settings.epochs} epochs is {final['loss']}")
        cell.stage("done")
