"""Phase data: the timed call is the next batch out of an input pipeline (the loader runtime's ``data.py``:
torch DataLoader, tf.data, Grain) reading a dataset folder (``fwbench data make images``). No model and no
backend: ``case.model`` is the dataset's name, ``case.workers`` the loader's worker count.

Stages: import (the loader's framework; the thread budget) → build (the dataset checked: images whose bytes
changed since ``fwbench data make`` wrote them are decoded with Pillow; one that does not decode fails the cell,
naming it, unless ``--skip-corrupt`` leaves it out) → first_call (the loader made and its first batch out: worker
start-up included, ``first_call_s`` is the time to first batch) → warmup (batches until every worker has
delivered, for at least a second) → timing (``data_batches`` batches in up to eight blocks on one clock, nothing
done between blocks; the PSS of the process and of its workers just before and just after) → done (the loader
closed; its worker processes must end).

Data cells run one at a time (not interleaved): a pipeline that waits for its turn keeps prefetching and would
look faster when it resumes. The loader's worker processes inherit the cell's CPU affinity (its ``--threads``
cores) and share them.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import time
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from fwbench.datasets.folders import changed_packed_files, corrupt_images, image_dataset
from fwbench.datasets.images import LoaderInput
from fwbench.details import CorruptFile, DataDetails, FirstBatch, PssPeak
from fwbench.frameworks import get_runtime, loader_module
from fwbench.measure import memory, noise, processes
from fwbench.models.base import ModelDescription
from fwbench.runner import estimate
from fwbench.runner.cell import Cell
from fwbench.runner.phases.base import Phase
from fwbench.spec import Case, Settings

BLOCKS = 8  # timed blocks per round (fewer when data_batches is below it)
WARMUP_MIN_S = 1.0  # warm-up lasts at least this long: tf.data's AUTOTUNE settles its parallelism and buffers
WORKER_EXIT_S = 10.0  # how long the loader's worker processes may take to end once it is closed


class CorruptImages(RuntimeError):
    """Images of the dataset that do not decode (the cell is ``error``, naming the first)."""


def block_layout(settings: Settings) -> tuple[int, int]:
    """(timed blocks, batches per block) of a round: min(BLOCKS, data_batches) blocks of data_batches // blocks
    batches (data_batches rounded down to a multiple of the block count)."""
    blocks = min(BLOCKS, settings.data_batches)
    return blocks, settings.data_batches // blocks


def warmup_batches(settings: Settings, workers: int) -> int:
    """The fewest untimed batches after the first: the warm-up calls, and two per worker so that every worker
    process has delivered (each prefetches two) before the clock starts; warm-up also lasts WARMUP_MIN_S."""
    return max(settings.warmup_calls, 2 * workers)


def _first_batch_facts(batch: Any) -> FirstBatch:
    """The first batch's images: shape, dtype and a checksum (float64 sum), read once, outside any timing."""
    images = np.asarray(batch[0])
    return FirstBatch(tuple(images.shape), str(images.dtype), float(images.sum(dtype=np.float64)))


def dataset_facts(folder: Path, settings: Settings, packed_folder: str | None) -> tuple[DataDetails, list[str]]:
    """The dataset's facts for ``details.data`` and the files to leave out; raises CorruptImages for an image that
    does not decode (without --skip-corrupt) and ValueError for a changed packed file."""
    manifest = image_dataset(folder)
    packed = settings.data_source == "packed" and packed_folder is not None
    details = DataDetails(
        dataset=manifest.name,
        digest=manifest.digest,
        folder=str(folder),
        images=int(manifest.arguments.get("n", 0)),
        source=packed_folder if packed else "files",
        transform=settings.transform,
        crop=settings.crop,
        pinning=f"the loader's workers share the cell's {settings.threads} pinned core(s) (inherited affinity)",
        corrupt_files=0,
    )
    if packed:
        assert packed_folder is not None
        changed = changed_packed_files(folder, manifest, packed_folder)
        if changed:
            raise ValueError(
                f"{len(changed)} packed file(s) differ from the manifest, first {changed[0]}: rewrite the "
                "dataset with fwbench data make"
            )
        return details, []
    corrupt = corrupt_images(folder, manifest)
    if corrupt and not settings.skip_corrupt:
        first = corrupt[0]
        raise CorruptImages(
            f"{len(corrupt)} image(s) do not decode, first {folder / first.file} ({first.error}); "
            "--skip-corrupt leaves them out"
        )
    details = dataclasses.replace(
        details, corrupt_files=len(corrupt), corrupt=tuple(CorruptFile(c.file, c.error) for c in corrupt[:20])
    )
    return details, [c.file for c in corrupt]


class Data(Phase):
    """import → build (dataset checks) → first batch → warm-up → timed batches → the loader closed."""

    name = "data"
    dtypes = ("fp32",)  # the loaders hand the models float32 images
    interleavable: ClassVar[bool] = False
    uses_model: ClassVar[bool] = False

    def measure(self, cell: Cell, backend: Any, description: ModelDescription) -> None:
        raise NotImplementedError("phase data runs through Data.run")

    def flops_per_call(self, description: ModelDescription, case: Case, settings: Settings) -> int | None:
        return None  # a loader's batch: decoding and cropping, no model

    def estimate_cell_s(self, case: Case, settings: Settings) -> float:
        """Start-up, then the first, warm-up and timed batches at IMAGE_S per image (scaled by the crop's area) on
        min(workers, threads) cores, each round."""
        startup_s, _ = estimate.startup_and_compile_s(case.runtime)
        parallel = max(1, min(case.workers or 0, settings.threads))
        batch_s = case.batch_size * estimate.IMAGE_S * (settings.crop / 224) ** 2 / parallel
        batches = 1 + warmup_batches(settings, case.workers or 0) + settings.data_batches
        return settings.rounds * (startup_s + batches * batch_s)

    def run(self, cell: Cell) -> dict[str, Any]:
        case, settings = cell.job.case, cell.job.settings
        refused = self.dtype_unsupported(case.dtype)
        if refused:
            raise NotImplementedError(refused)
        if cell.job.verify_output is not None or cell.job.export_to is not None or cell.job.profile_to is not None:
            raise NotImplementedError("phase data is run by fwbench run only")
        if settings.data_input is None:
            raise ValueError("phase data needs a dataset folder (settings.data_input)")
        assert case.workers is not None  # spec.Case: every data cell has one
        folder = Path(settings.data_input)
        info = get_runtime(case.runtime)

        cell.stage("import")
        loader = loader_module(info)
        cell.pin_threads()
        cell.result["threads_effective"] = loader.configure_threads(settings.threads)
        cell.result["versions"] = loader.versions()
        cell.result["layout"] = loader.LAYOUT

        cell.stage("build")
        details, excluded = dataset_facts(folder, settings, loader.PACKED)
        cell.result["data"] = details.to_dict()
        exclude = frozenset(excluded)

        cell.stage("first_call")
        started = time.perf_counter()
        source = LoaderInput(folder, settings.crop, settings.transform, case.workers, settings.seed, exclude)
        stream = loader.batches(source, case.batch_size, settings.data_source == "packed")
        try:
            first = next(stream)
            cell.result["first_call_s"] = time.perf_counter() - started
            details = dataclasses.replace(details, first_batch=_first_batch_facts(first))
            cell.result["data"] = details.to_dict()
            del first
            details = self.time_batches(cell, stream, case.workers, details)
        finally:
            pids = [child.pid for child in processes.children()]
            stream.close()  # the generator's loader goes: its worker processes are told to stop
            del stream
            gc.collect()
            left = processes.wait_gone(pids, WORKER_EXIT_S)
            details = dataclasses.replace(details, worker_pids=tuple(pids), workers_left_running=len(left))
            cell.result["data"] = details.to_dict()
        if left:
            raise RuntimeError(f"{len(left)} loader worker processes still ran {WORKER_EXIT_S:g} s after it closed")
        cell.stage("done")
        return cell.result

    def time_batches(self, cell: Cell, stream: Any, workers: int, details: DataDetails) -> DataDetails:
        """Warm-up and timed batches of ``stream`` (the first is out), recorded in ``cell.result``: seconds per
        batch by block, on one clock with nothing between blocks (a pause would let the loader prefetch); the CPU
        the process and its workers used while timed, their PSS just before and just after the timed batches, the
        noise on the machine over them (``details`` with the loader's figures, returned)."""
        settings = cell.job.settings
        cell.stage("warmup")
        warmup_s: list[float] = []
        least = warmup_batches(settings, workers)
        while len(warmup_s) < least or sum(warmup_s) < WARMUP_MIN_S:
            start = time.perf_counter()
            next(stream)
            warmup_s.append(time.perf_counter() - start)
        cell.result["warmup_calls"] = len(warmup_s)
        cell.result["warmup_call_s"] = warmup_s

        cell.stage("timing")
        cell.result["loadavg_before_timing"] = os.getloadavg()
        cell.result["peak_memory_scope"] = "timed" if memory.reset_peak_rss() else "process"
        blocks, per_block = block_layout(settings)
        memory_before = processes.tree_memory()
        pids: list[int | str] = ["self", *(child.pid for child in processes.children())]
        cpu_before = processes.tree_cpu_s()
        wall_origin, clock_origin = time.time(), time.perf_counter()
        noise_before = noise.read(clock_origin, pids)
        samples, starts = [], []
        previous = clock_origin
        for _ in range(blocks):
            starts.append(wall_origin + (previous - clock_origin))
            for _ in range(per_block):
                next(stream)
            now = time.perf_counter()
            samples.append((now - previous) / per_block)
            previous = now
        noise_after = noise.read(previous, pids)
        cpu_s = processes.cpu_used_s(cpu_before, processes.tree_cpu_s())
        memory_after = processes.tree_memory()
        peak = max(memory_before, memory_after, key=lambda reading: reading.total_bytes or 0)
        totals = noise.NoiseTotals()
        totals.add(noise_before, noise_after)
        elapsed = previous - clock_origin
        cell.result["peak_memory_bytes"] = memory.peak_rss_bytes()
        cell.result["noise"] = totals.to_dict()
        cell.result["block_starts_unix_s"] = starts
        details = dataclasses.replace(
            details,
            warmup_batches=len(warmup_s),
            timed_batches=blocks * per_block,
            pss_peak_bytes=PssPeak(peak.parent_bytes, peak.workers_bytes, peak.total_bytes),
            pss_read="just before and just after the timed batches",
            worker_processes=max(memory_before.workers, memory_after.workers),
            cpu_s=cpu_s,
            cpu_cores_busy=cpu_s / elapsed if elapsed > 0 else None,
        )
        cell.result["data"] = details.to_dict()
        cell.result.update(
            status="ok", samples_s=samples, calls_per_sample=per_block, stop_reason="batches", timing_elapsed_s=elapsed
        )
        return details
