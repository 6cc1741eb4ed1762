"""The dataset a cell read: ``details.data`` of a phase-data cell (its loader's dataset, first batch, corrupt files
and PSS peak) and ``details.fit`` of a phase-fit cell (whose images input is the same record)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from fwbench.details.parse import all_fields, as_float, as_int, as_str, each, ints, set_fields


@dataclass(frozen=True)
class FirstBatch:
    """The first batch's images, read once outside any timing: shape, dtype and checksum (float64 sum)."""

    shape: tuple[int, ...] = ()
    dtype: str | None = None
    sum: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return all_fields(self)

    @classmethod
    def parse(cls, raw: Any) -> FirstBatch | None:
        if not isinstance(raw, dict):
            return None
        return cls(ints(raw.get("shape")) or (), as_str(raw.get("dtype")), as_float(raw.get("sum")))


@dataclass(frozen=True)
class CorruptFile:
    """An image of the dataset that did not decode (left out with ``--skip-corrupt``), and why."""

    file: str | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return all_fields(self)

    @classmethod
    def parse(cls, raw: Any) -> CorruptFile | None:
        return cls(as_str(raw.get("file")), as_str(raw.get("error"))) if isinstance(raw, dict) else None


@dataclass(frozen=True)
class PssPeak:
    """The larger of the loader's proportional set sizes read just before and just after the timed batches: its own
    process's, its worker processes' together, and their total (None: not readable)."""

    parent: int | None = None
    workers: int | None = None
    total: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return all_fields(self)

    @classmethod
    def parse(cls, raw: Any) -> PssPeak | None:
        if not isinstance(raw, dict):
            return None
        return cls(as_int(raw.get("parent")), as_int(raw.get("workers")), as_int(raw.get("total")))


@dataclass(frozen=True)
class DataDetails:
    """``details.data`` of a phase-data cell (``fwbench.runner.phases.data``), written as the cell goes: the dataset
    checked (its name, digest, folder, image count, the source read — ``files`` or the loader's packed folder —, the
    transform and crop, how the loader's workers were pinned, the corrupt images; build), the first batch's facts
    (first_call), the warm-up and timed batch counts, the loader's PSS peak, its worker processes and the CPU they
    used while timed (timing), the worker processes' ids and how many still ran once the loader closed (done). A
    fit from images stores the same dataset facts under ``details.fit.input`` (:attr:`FitDetails.input`).

    A field that is None was not written (a cell that failed before that stage, an older row); ``cpu_cores_busy``
    is written (as null when the timed batches took no time) once the timed batches are."""

    dataset: str | None = None
    digest: str | None = None
    folder: str | None = None
    images: int | None = None
    source: str | None = None
    transform: str | None = None
    crop: int | None = None
    pinning: str | None = None
    corrupt_files: int | None = None
    corrupt: tuple[CorruptFile, ...] | None = None  # the first 20; None when the source is packed (not decoded)
    first_batch: FirstBatch | None = None
    warmup_batches: int | None = None
    timed_batches: int | None = None
    pss_peak_bytes: PssPeak | None = None
    pss_read: str | None = None
    worker_processes: int | None = None
    cpu_s: float | None = None
    cpu_cores_busy: float | None = None
    worker_pids: tuple[int, ...] | None = None
    workers_left_running: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The keys written so far."""
        return set_fields(self, keep=("cpu_cores_busy",) if self.timed_batches is not None else ())

    @classmethod
    def parse(cls, raw: Any) -> DataDetails | None:
        """None for a cell that stored none (absent, or not a JSON object); keys it does not know are left out."""
        if not isinstance(raw, dict):
            return None
        corrupt = raw.get("corrupt")
        return cls(
            dataset=as_str(raw.get("dataset")),
            digest=as_str(raw.get("digest")),
            folder=as_str(raw.get("folder")),
            images=as_int(raw.get("images")),
            source=as_str(raw.get("source")),
            transform=as_str(raw.get("transform")),
            crop=as_int(raw.get("crop")),
            pinning=as_str(raw.get("pinning")),
            corrupt_files=as_int(raw.get("corrupt_files")),
            corrupt=each(CorruptFile.parse, corrupt) if isinstance(corrupt, list) else None,
            first_batch=FirstBatch.parse(raw.get("first_batch")),
            warmup_batches=as_int(raw.get("warmup_batches")),
            timed_batches=as_int(raw.get("timed_batches")),
            pss_peak_bytes=PssPeak.parse(raw.get("pss_peak_bytes")),
            pss_read=as_str(raw.get("pss_read")),
            worker_processes=as_int(raw.get("worker_processes")),
            cpu_s=as_float(raw.get("cpu_s")),
            cpu_cores_busy=as_float(raw.get("cpu_cores_busy")),
            worker_pids=ints(raw.get("worker_pids")),
            workers_left_running=as_int(raw.get("workers_left_running")),
        )


@dataclass(frozen=True)
class FitDetails:
    """``details.fit`` of a phase-fit cell: the loop that ran, every epoch's seconds and mean loss, and the
    final loss and accuracy over the whole dataset. Epoch 1 (compilation included) is the row's
    ``first_call_s``; the row's samples are epochs 2... A fit from images has the dataset's facts in ``input``
    (also kept raw in ``extra["input"]``, with what the loop's loader waited)."""

    loop: str
    steps_per_epoch: int
    final_loss: float
    final_accuracy: float
    epochs: int | None = None
    samples: int | None = None
    batch_size: int | None = None
    epoch_s: tuple[float, ...] = ()
    epoch_loss: tuple[float, ...] = ()
    total_s: float | None = None
    optimizer: dict[str, Any] | None = None
    input: DataDetails | None = None  # a fit from --input images: the dataset read (None: from memory)
    extra: Mapping[str, Any] = field(default_factory=dict)  # what one loop adds (e.g. Lightning's version, logging)

    @classmethod
    def parse(cls, raw: Any) -> FitDetails | None:
        """None without fit details, or without a field the overhead table needs (loop, steps per epoch,
        final loss and accuracy)."""
        if not isinstance(raw, dict):
            return None
        loop, steps = as_str(raw.get("loop")), as_int(raw.get("steps_per_epoch"))
        loss, accuracy = as_float(raw.get("final_loss")), as_float(raw.get("final_accuracy"))
        if loop is None or steps is None or loss is None or accuracy is None:
            return None
        optimizer = raw.get("optimizer")
        return cls(
            loop=loop,
            steps_per_epoch=steps,
            final_loss=loss,
            final_accuracy=accuracy,
            epochs=as_int(raw.get("epochs")),
            samples=as_int(raw.get("samples")),
            batch_size=as_int(raw.get("batch_size")),
            epoch_s=tuple(float(x) for x in raw.get("epoch_s") or ()),
            epoch_loss=tuple(float(x) for x in raw.get("epoch_loss") or ()),
            total_s=as_float(raw.get("total_s")),
            optimizer=optimizer if isinstance(optimizer, dict) else None,
            input=DataDetails.parse(raw.get("input")),
            extra={k: v for k, v in raw.items() if k not in _FIT_KEYS},
        )


# ``input`` stays in ``extra`` too: the loop's own report of its loader (wait fraction, how it was measured).
_FIT_KEYS = frozenset({f.name for f in fields(FitDetails)} - {"input"} | {"samples_are"})
