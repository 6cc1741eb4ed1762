"""The typed records of a cell's ``details``: what a worker (or the manager) measured beyond the result columns.

A worker sends its result as a JSON object; the manager stores the columns apart and the rest as ``details_json``.
Each group of details has one record here, the one place that says its stored keys and their types:

- the writers build the record and store ``record.to_dict()`` (the same keys and shapes as the hand-built dicts
  before them);
- the store parses each group once, when a row is read, into :class:`fwbench.store.records.ResultRecord`'s typed
  attributes, and the reports read those, never the raw dict.

``parse`` is tolerant of every stored row: a key an older fwbench did not write reads as its default (None, empty),
a value of the wrong type as None, and a group that is absent or not a JSON object as None (or the empty record,
where a record says so). Times are seconds, sizes bytes, as stored. Framework-free and standard-library only: the
worker imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

T = TypeVar("T")


def as_float(value: Any) -> float | None:
    """A stored number as float; None for anything else (absent, null, text)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def as_int(value: Any) -> int | None:
    """A stored integer; None for anything else."""
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def as_str(value: Any) -> str | None:
    """A stored string; None for anything else."""
    return value if isinstance(value, str) else None


def as_dict(value: Any) -> dict[str, Any]:
    """A stored JSON object; empty for anything else."""
    return value if isinstance(value, dict) else {}


def _ints(value: Any) -> tuple[int, ...] | None:
    """A stored list of integers (other items left out); None when it is not a list."""
    return tuple(i for i in map(as_int, value) if i is not None) if isinstance(value, list) else None


def _floats(value: Any) -> tuple[float, ...] | None:
    """A stored list of numbers as floats (other items left out); None when it is not a list."""
    return tuple(x for x in map(as_float, value) if x is not None) if isinstance(value, list) else None


def _strs(value: Any) -> tuple[str, ...] | None:
    """A stored list of strings (each item as text); None when it is not a list."""
    return tuple(str(item) for item in value) if isinstance(value, list) else None


def _each(parse: Callable[[Any], T | None], raw: Any) -> tuple[T, ...]:
    """Each item of a stored list as ``parse`` reads it (an item it cannot read left out); empty when not a list."""
    return tuple(item for item in map(parse, raw if isinstance(raw, list) else ()) if item is not None)


def _stored(value: Any) -> Any:
    """``value`` as JSON keeps it: a record as its ``to_dict()``, tuples and lists as lists, mappings as dicts."""
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, (tuple, list)):
        return [_stored(item) for item in value]
    if isinstance(value, Mapping):
        return {key: _stored(item) for key, item in value.items()}
    return value


def _all_fields(record: Any) -> dict[str, Any]:
    """Every field of ``record`` under its own name, as stored (a writer that always writes every key)."""
    return {f.name: _stored(getattr(record, f.name)) for f in fields(record)}


def _set_fields(record: Any, keep: Iterable[str] = ()) -> dict[str, Any]:
    """The fields of ``record`` that are set, as stored: a field that is None was not written (a writer that adds
    keys as it goes), unless it is named in ``keep`` (written, as null)."""
    kept = set(keep)
    return {
        f.name: _stored(value)
        for f in fields(record)
        if (value := getattr(record, f.name)) is not None or f.name in kept
    }


# -- parity, precision, training, fit, compile health (the worker's checks and loops) ----------------------------


@dataclass(frozen=True)
class OutputError:
    """One output's error against the float64 reference: relative L2 and max-abs (None: not stored)."""

    rel_l2: float | None = None
    max_abs: float | None = None


@dataclass(frozen=True)
class FirstDivergence:
    """``details.parity.divergence.first`` of a mismatch: the first checkpoint (or output) over its share of the
    tolerance (fwbench.runner.divergence), its relative L2 error (None: not finite) and that share."""

    name: str
    rel_l2: float | None
    limit: float | None

    @classmethod
    def parse(cls, raw: Any) -> FirstDivergence | None:
        first = as_dict(as_dict(raw).get("first"))
        name = as_str(first.get("name"))
        return None if name is None else cls(name, as_float(first.get("rel_l2")), as_float(first.get("limit")))


@dataclass(frozen=True)
class ParityCheck:
    """``details.parity``: the check of one cell's outputs (inference) or first-step loss (training) against
    the float64 reference. ``ok`` None: the stored check has no verdict. ``shape``: (batch, seq or None)
    it was checked at; ``outputs``: each output's error, by output name, in stored order; ``first_divergence``: where
    a mismatch starts (None: the check passed, or the runtime has no checkpoints)."""

    ok: bool | None = None
    reference: str | None = None
    tolerance_rel_l2: float | None = None
    checked: str | None = None
    shape: tuple[int | None, ...] = ()
    outputs: Mapping[str, OutputError] = field(default_factory=dict)
    reference_loss: float | None = None
    first_divergence: FirstDivergence | None = None

    @property
    def passed(self) -> bool:
        """The check ran and passed."""
        return bool(self.ok)

    @property
    def worst_rel_l2(self) -> float:
        """The largest relative L2 error over the outputs (an output without one counts 0; 0 without outputs)."""
        return max((o.rel_l2 or 0.0 for o in self.outputs.values()), default=0.0)

    @classmethod
    def parse(cls, raw: Any) -> ParityCheck | None:
        """The check stored as ``raw``; None when there is none (not a JSON object)."""
        if not isinstance(raw, dict):
            return None
        outputs = {
            str(name): OutputError(as_float(v.get("rel_l2")), as_float(v.get("max_abs")))
            for name, v in as_dict(raw.get("outputs")).items()
            if isinstance(v, dict)
        }
        shape = raw.get("shape")
        return cls(
            ok=bool(raw["ok"]) if "ok" in raw else None,
            reference=as_str(raw.get("reference")),
            tolerance_rel_l2=as_float(raw.get("tolerance_rel_l2")),
            checked=as_str(raw.get("checked")),
            shape=tuple(as_int(s) for s in shape) if isinstance(shape, list) else (),
            outputs=outputs,
            reference_loss=as_float(raw.get("reference_loss")),
            first_divergence=FirstDivergence.parse(raw.get("divergence")),
        )


@dataclass(frozen=True)
class PrecisionCheck:
    """``details.precision``: the policy a cell ran under (its dtype, fwbench.precision) and what the framework's
    own graph showed: op class → the dtypes it read (``observable`` False where the runtime cannot be looked
    into; ``error`` when looking failed), and each op class that did not compute as the policy says."""

    policy: str | None = None
    observable: bool = False
    observed: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    mismatches: tuple[str, ...] = ()
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """As the worker stores it: ``observed`` null where the runtime could not be looked into, ``error`` only
        when looking failed."""
        out: dict[str, Any] = {
            "policy": self.policy,
            "observed": {op: list(dtypes) for op, dtypes in self.observed.items()} if self.observable else None,
            "mismatches": list(self.mismatches),
        }
        if self.error is not None:
            out["error"] = self.error
        return out

    @classmethod
    def parse(cls, raw: Any) -> PrecisionCheck | None:
        """The check stored as ``raw``; None when there is none (not a JSON object)."""
        if not isinstance(raw, dict):
            return None
        observed = {
            str(op): tuple(str(d) for d in dtypes)
            for op, dtypes in as_dict(raw.get("observed")).items()
            if isinstance(dtypes, list)
        }
        return cls(
            policy=as_str(raw.get("policy")),
            observable=isinstance(raw.get("observed"), dict),
            observed=observed,
            mismatches=_strs(raw.get("mismatches")) or (),
            error=as_str(raw.get("error")),
        )


@dataclass(frozen=True)
class StepLossParts:
    """How many optimizer steps of a training cell's loop were which part, in the order they ran."""

    first_call: int = 0
    warmup: int = 0
    calibration: int = 0
    timed: int = 0

    @property
    def before_timed(self) -> int:
        """Steps run before the first timed one (first call, warm-up, the timer's calibration)."""
        return self.first_call + self.warmup + self.calibration

    def to_dict(self) -> dict[str, int]:
        """As stored (``details_json`` keeps keys sorted)."""
        return {
            "calibration": self.calibration,
            "first_call": self.first_call,
            "timed": self.timed,
            "warmup": self.warmup,
        }

    @classmethod
    def parse(cls, raw: Any) -> StepLossParts | None:
        if not isinstance(raw, dict):
            return None
        return cls(**{f.name: as_int(raw.get(f.name)) or 0 for f in fields(cls)})


@dataclass(frozen=True)
class TrainingDetails:
    """``details.training`` of a training cell: the optimizer, the first (before any update) and final loss,
    and every step's loss in the order the steps ran (``step_loss_parts`` says which step was which)."""

    optimizer: dict[str, Any] | None = None
    loss: str | None = None
    first_loss: float | None = None
    final_loss: float | None = None
    counted_steps_before_final: int | None = None
    step_losses: tuple[float, ...] | None = None
    step_loss_parts: StepLossParts | None = None
    samples_per_step: int | None = None
    tokens_per_step: int | None = None

    @classmethod
    def parse(cls, raw: Any) -> TrainingDetails | None:
        """None without training details (absent or empty)."""
        if not isinstance(raw, dict) or not raw:
            return None
        losses = raw.get("step_losses")
        optimizer = raw.get("optimizer")
        return cls(
            optimizer=optimizer if isinstance(optimizer, dict) else None,
            loss=as_str(raw.get("loss")),
            first_loss=as_float(raw.get("first_loss")),
            final_loss=as_float(raw.get("final_loss")),
            counted_steps_before_final=as_int(raw.get("counted_steps_before_final")),
            step_losses=None if not isinstance(losses, list) else tuple(float(x) for x in losses),
            step_loss_parts=StepLossParts.parse(raw.get("step_loss_parts")),
            samples_per_step=as_int(raw.get("samples_per_step")),
            tokens_per_step=as_int(raw.get("tokens_per_step")),
        )


@dataclass(frozen=True)
class CompileHealth:
    """``details.compile_health``: compile counters (recompiles, retraces, graph breaks, eager fallbacks) read
    after warm-up and after timing, and the flags a report shows. Empty for a cell that stored none."""

    flags: tuple[str, ...] = ()
    recompiled_in_timed_loop: bool = False
    during_timing: Mapping[str, int] = field(default_factory=dict)
    after_warmup: Mapping[str, int] = field(default_factory=dict)
    after_timing: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def measured(cls, before: Mapping[str, int], after: Mapping[str, int]) -> CompileHealth:
        """The counters read just before and just after the timed loop, and the flags a report shows: any counter
        that grew during the loop means it recompiled or retraced; graph breaks and eager fallbacks are flagged even
        when they came before it."""
        during = {key: after[key] - before.get(key, 0) for key in after}
        flags = [f"{key.replace('_', ' ')} +{n} in timed loop" for key, n in during.items() if n > 0]
        flags += [
            f"{key.replace('_', ' ')} {after[key]}"
            for key in ("graph_breaks", "eager_fallbacks")
            if after.get(key, 0) > 0 and during.get(key, 0) == 0
        ]
        return cls(tuple(flags), any(n > 0 for n in during.values()), during, dict(before), dict(after))

    def to_dict(self) -> dict[str, Any]:
        return {
            "after_warmup": dict(self.after_warmup),
            "after_timing": dict(self.after_timing),
            "during_timing": dict(self.during_timing),
            "recompiled_in_timed_loop": self.recompiled_in_timed_loop,
            "flags": list(self.flags),
        }

    @classmethod
    def parse(cls, raw: Any) -> CompileHealth:
        """The stored record; the empty one for a cell that stored none."""
        if not isinstance(raw, dict) or not raw:
            return NO_COMPILE_HEALTH

        def counters(key: str) -> dict[str, int]:
            return {str(k): v for k, v in as_dict(raw.get(key)).items() if as_int(v) is not None}

        return cls(
            flags=_strs(raw.get("flags")) or (),
            recompiled_in_timed_loop=bool(raw.get("recompiled_in_timed_loop", False)),
            during_timing=counters("during_timing"),
            after_warmup=counters("after_warmup"),
            after_timing=counters("after_timing"),
        )


NO_COMPILE_HEALTH = CompileHealth()


# -- the worker's stages and its ahead-of-time compile ------------------------------------------------------------

# The worker's stages up to its first call's outputs (runner.messages.STAGES): the time to first result.
FIRST_RESULT_STAGES = ("start", "import", "build", "compile", "first_call")


@dataclass(frozen=True)
class StageSeconds:
    """``details.stage_seconds``: seconds the worker spent in each stage it entered (``runner.messages.STAGES``),
    by stage."""

    seconds: Mapping[str, float] = field(default_factory=dict)

    def get(self, stage: str) -> float | None:
        return self.seconds.get(stage)

    @property
    def first_result_s(self) -> float | None:
        """Seconds of the stages up to the first call's outputs (FIRST_RESULT_STAGES); None when the worker never
        finished its first call."""
        if "first_call" not in self.seconds:
            return None
        return sum(self.seconds.get(stage, 0.0) for stage in FIRST_RESULT_STAGES)

    def to_dict(self) -> dict[str, float]:
        return dict(self.seconds)

    @classmethod
    def parse(cls, raw: Any) -> StageSeconds | None:
        """The stages stored as ``raw`` (a stage whose seconds are not a number left out); None when not an object."""
        if not isinstance(raw, dict):
            return None
        return cls({str(stage): float(s) for stage, s in raw.items() if as_float(s) is not None})


@dataclass(frozen=True)
class CompileReport:
    """``details.compile_report`` of a runtime that compiles ahead of time (the deployment runtimes, torch:export;
    written by the backend's ``compile_report``): the export made for the timed shapes — its seconds (``cached``:
    the artefact came from the group's export cache, exported by another worker in ``export_s``), the engine's load
    seconds, the artefact's kind and size — the exports for other shapes made after it (``reexports``: the parity
    shape's), and what each runtime adds (``extra``: the input shapes, the exporter and opset, quantisation, the
    compiled precision, torch's AOT-compile seconds and package size, ...)."""

    export_s: float | None = None
    load_s: float | None = None
    cached: bool = False
    artefact: str | None = None
    artefact_bytes: int | None = None
    reexports: tuple[CompileReport, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """As ``frameworks.base.export_report`` writes it: the keys that are set (``cached`` only when true,
        ``reexports`` only when there are some), ``extra``'s beside them."""
        out = _set_fields(self)
        out.pop("extra")
        if not self.cached:
            del out["cached"]
        if not self.reexports:
            del out["reexports"]
        return {**dict(self.extra), **out}

    @classmethod
    def parse(cls, raw: Any) -> CompileReport | None:
        """None for a cell that stored none (absent, or not a JSON object)."""
        if not isinstance(raw, dict):
            return None
        return cls(
            export_s=as_float(raw.get("export_s")),
            load_s=as_float(raw.get("load_s")),
            cached=bool(raw.get("cached")),
            artefact=as_str(raw.get("artefact")),
            artefact_bytes=as_int(raw.get("artefact_bytes")),
            reexports=_each(cls.parse, raw.get("reexports")),
            extra={k: v for k, v in raw.items() if k not in _COMPILE_REPORT_KEYS},
        )


_COMPILE_REPORT_KEYS = frozenset(f.name for f in fields(CompileReport)) - {"extra"}


@dataclass(frozen=True)
class CpuUnits:
    """``details.cpu_bf16_units`` / ``cpu_int8_units``: of a bf16 (int8) CPU cell, the CPU's native bfloat16
    (int8) units the worker found (``fwbench.measure.environment``; empty: none, the dtype is emulated); None for
    other cells and rows stored before the units were recorded."""

    bf16: tuple[str, ...] | None = None
    int8: tuple[str, ...] | None = None

    def to_dict(self) -> dict[str, list[str]]:
        """The top-level details keys of the units found (none for a dtype not looked at)."""
        return {
            f"cpu_{name}_units": list(units)
            for name, units in (("bf16", self.bf16), ("int8", self.int8))
            if units is not None
        }

    @classmethod
    def from_details(cls, details: Mapping[str, Any]) -> CpuUnits:
        """From a row's whole ``details`` (the units are top-level keys); the empty record without them."""
        return cls(bf16=_strs(details.get("cpu_bf16_units")), int8=_strs(details.get("cpu_int8_units")))


# -- phase data's loader; phase fit's dataset --------------------------------------------------------------------


@dataclass(frozen=True)
class FirstBatch:
    """The first batch's images, read once outside any timing: shape, dtype and checksum (float64 sum)."""

    shape: tuple[int, ...] = ()
    dtype: str | None = None
    sum: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return _all_fields(self)

    @classmethod
    def parse(cls, raw: Any) -> FirstBatch | None:
        if not isinstance(raw, dict):
            return None
        return cls(_ints(raw.get("shape")) or (), as_str(raw.get("dtype")), as_float(raw.get("sum")))


@dataclass(frozen=True)
class CorruptFile:
    """An image of the dataset that did not decode (left out with ``--skip-corrupt``), and why."""

    file: str | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return _all_fields(self)

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
        return _all_fields(self)

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
        return _set_fields(self, keep=("cpu_cores_busy",) if self.timed_batches is not None else ())

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
            corrupt=_each(CorruptFile.parse, corrupt) if isinstance(corrupt, list) else None,
            first_batch=FirstBatch.parse(raw.get("first_batch")),
            warmup_batches=as_int(raw.get("warmup_batches")),
            timed_batches=as_int(raw.get("timed_batches")),
            pss_peak_bytes=PssPeak.parse(raw.get("pss_peak_bytes")),
            pss_read=as_str(raw.get("pss_read")),
            worker_processes=as_int(raw.get("worker_processes")),
            cpu_s=as_float(raw.get("cpu_s")),
            cpu_cores_busy=as_float(raw.get("cpu_cores_busy")),
            worker_pids=_ints(raw.get("worker_pids")),
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


# -- distributed cells (--procs, --nnodes) and the scheduler's rounds --------------------------------------------


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
        return _all_fields(self)

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
            allreduce_s=_floats(raw.get("allreduce_s")) or (),
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
        return _all_fields(self)

    @classmethod
    def parse(cls, raw: Any) -> RankDetail | None:
        if not isinstance(raw, dict):
            return None
        threads = raw.get("threads_effective")
        return cls(
            rank=as_int(raw.get("rank")),
            node=as_int(raw.get("node")),
            cpus=_ints(raw.get("cpus")),
            threads_effective=threads if isinstance(threads, dict) else as_int(threads),
            peak_memory_bytes=as_int(raw.get("peak_memory_bytes")),
            first_call_s=as_float(raw.get("first_call_s")),
            stage_seconds=StageSeconds.parse(raw.get("stage_seconds")),
            status=as_str(raw.get("status")),
        )

    @classmethod
    def parse_all(cls, raw: Any) -> tuple[RankDetail, ...]:
        """``details.ranks``: every rank's record (empty for a cell of one process or an older row)."""
        return _each(cls.parse, raw)


@dataclass(frozen=True)
class RendezvousNode:
    """One machine of a distributed cell: its node index (0: the one that ran fwbench run), host and ranks."""

    node: int | None = None
    host: str | None = None
    ranks: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return _all_fields(self)

    @classmethod
    def parse(cls, raw: Any) -> RendezvousNode | None:
        if not isinstance(raw, dict):
            return None
        return cls(as_int(raw.get("node")), as_str(raw.get("host")), _ints(raw.get("ranks")) or ())


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
        return _all_fields(self)

    @classmethod
    def parse(cls, raw: Any) -> Rendezvous | None:
        """None for a cell that stored none (absent, or not a JSON object)."""
        if not isinstance(raw, dict):
            return None
        return cls(
            address=as_str(raw.get("address")),
            ports=_ints(raw.get("ports")) or (),
            store=as_str(raw.get("store")),
            nodes=_each(RendezvousNode.parse, raw.get("nodes")),
        )


@dataclass(frozen=True)
class RoundDetail:
    """One round of a cell, in ``details.round_details`` (``runner.scheduler.merge_rounds``): its worker's first
    call, calls per timed sample, resident peak and stage seconds, and whether its worker started side by side
    with the group's others (rounds after the first: its first call and stage seconds were then not measured with
    the machine to itself)."""

    first_call_s: float | None = None
    calls_per_sample: int | None = None
    peak_memory_bytes: int | None = None
    stage_seconds: StageSeconds | None = None
    started_together: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Every key, as the scheduler writes it."""
        return _all_fields(self)

    @classmethod
    def parse(cls, raw: Any) -> RoundDetail | None:
        if not isinstance(raw, dict):
            return None
        return cls(
            first_call_s=as_float(raw.get("first_call_s")),
            calls_per_sample=as_int(raw.get("calls_per_sample")),
            peak_memory_bytes=as_int(raw.get("peak_memory_bytes")),
            stage_seconds=StageSeconds.parse(raw.get("stage_seconds")),
            started_together=raw.get("started_together") is True,
        )


STOP_REASONS = ("target", "budget", "max-rounds", "failure", "no-budget", "no-ci", "protocol", "cluster")


@dataclass(frozen=True)
class RoundsStop:
    """Why a cell's comparison group ran no more rounds (``runner.extra_rounds``), in ``details.rounds_stop``.
    ``reason``: ``target`` (its widest CI met the target), ``budget`` (the next round would not have fitted in the
    run's ``--budget``), ``max-rounds``, ``failure`` (a worker failed in its last extra round), or, its minimum
    rounds only: ``no-budget`` (the run had none), ``no-ci`` (fewer than 3 rounds: no CI to aim at), ``protocol``
    (hf2019 fixes its blocks) or ``cluster`` (it ran on a Ray node: extra rounds are given on the local machine).
    ``widest``: the group's widest relative CI half-width (0.05 = ±5%) as the whole run read at its end gives it — of
    a speed-up over its baseline, or, in a group that shows none, of a cell time; None when it had no CI. ``target``: the half-width
    aimed at. ``rounds``: the rounds the group ran."""

    reason: str
    rounds: int
    widest: float | None = None
    target: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Every key, as the manager writes it."""
        return _all_fields(self)

    @classmethod
    def parse(cls, raw: Any) -> RoundsStop | None:
        """None for a cell that stored none (stored before extra rounds existed, or still waiting for them)."""
        if (
            not isinstance(raw, dict)
            or as_str(raw.get("reason")) not in STOP_REASONS
            or as_int(raw.get("rounds")) is None
        ):
            return None
        return cls(
            reason=str(raw["reason"]),
            rounds=int(raw["rounds"]),
            widest=as_float(raw.get("widest")),
            target=as_float(raw.get("target")),
        )


@dataclass(frozen=True)
class ExtraRoundFailure:
    """An extra round (``runner.extra_rounds``) in which a cell's worker failed, in ``details.extra_round_failure``:
    the round (from 1), the status it would have had and why. The cell keeps the rounds before it; its group gets
    no more."""

    round: int
    status: str
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Every key, as the scheduler writes it."""
        return _all_fields(self)

    @classmethod
    def parse(cls, raw: Any) -> ExtraRoundFailure | None:
        if not isinstance(raw, dict) or as_int(raw.get("round")) is None or as_str(raw.get("status")) is None:
            return None
        return cls(round=int(raw["round"]), status=str(raw["status"]), reason=as_str(raw.get("reason")))


@dataclass(frozen=True)
class Interleaving:
    """How a cell's rounds ran (``runner.scheduler``): ``details.round_details``, each round's worker figures (a cell
    that ended ok), ``details.interleave_subgroups``, the sub-groups its comparison group was split into in each
    round when its workers did not all fit in memory together (stored only when some round was split), and
    ``details.rounds_stop``, why its group ran no more rounds, and ``details.extra_round_failure``, an extra round
    of the cell that failed. Empty for rows stored before these."""

    subgroups: tuple[int, ...] = ()
    rounds: tuple[RoundDetail, ...] = ()
    stop: RoundsStop | None = None
    extra_failure: ExtraRoundFailure | None = None

    @property
    def most_subgroups(self) -> int | None:
        """The most sub-groups a round was split into; None when no split was stored."""
        return max(self.subgroups) if self.subgroups else None

    def to_dict(self) -> dict[str, Any]:
        """The top-level details keys of what is set (``interleave_subgroups``, ``round_details``)."""
        out: dict[str, Any] = {}
        if self.subgroups:
            out["interleave_subgroups"] = list(self.subgroups)
        if self.rounds:
            out["round_details"] = _stored(self.rounds)
        if self.stop is not None:
            out["rounds_stop"] = self.stop.to_dict()
        if self.extra_failure is not None:
            out["extra_round_failure"] = self.extra_failure.to_dict()
        return out

    @classmethod
    def from_details(cls, details: Mapping[str, Any]) -> Interleaving:
        """From a row's whole ``details`` (both are top-level keys); the empty record without them."""
        return cls(
            subgroups=_ints(details.get("interleave_subgroups")) or (),
            rounds=_each(RoundDetail.parse, details.get("round_details")),
            stop=RoundsStop.parse(details.get("rounds_stop")),
            extra_failure=ExtraRoundFailure.parse(details.get("extra_round_failure")),
        )


# -- phase serving (fwbench.runner.phases.serving, fwbench.serving.loadgen) ---------------------------------------


@dataclass(frozen=True)
class LoadPoint:
    """One load point of a serving round, as the load generator writes it (``fwbench.serving.loadgen.run_point``):
    LoadGen's latency percentiles from each query's scheduled send (seconds), the loads (queries per
    second), the queries lost (dropped: 503 from a full queue; timed out; failed), the server's batches by row count
    and both processes' CPU seconds over the point."""

    scenario: str | None = None
    label: str | None = None
    fraction: float | None = None
    target_qps: float | None = None
    offered_qps: float | None = None
    achieved_qps: float | None = None
    queries: int | None = None
    answered: int | None = None
    dropped: int | None = None
    timed_out: int | None = None
    failed: int | None = None
    p50_s: float | None = None
    p90_s: float | None = None
    p99_s: float | None = None
    p999_s: float | None = None
    mean_s: float | None = None
    max_s: float | None = None
    wall_s: float | None = None
    server_cpu_s: float | None = None
    client_cpu_s: float | None = None
    batch_rows: dict[str, int] = field(default_factory=dict)
    padded_rows: int | None = None
    first_failure: str | None = None

    @property
    def lost(self) -> int:
        return (self.dropped or 0) + (self.timed_out or 0) + (self.failed or 0)

    def to_dict(self) -> dict[str, Any]:
        return _all_fields(self)

    @classmethod
    def parse(cls, raw: Any) -> LoadPoint | None:
        if not isinstance(raw, dict):
            return None
        values: dict[str, Any] = {}
        for f in fields(cls):
            value = raw.get(f.name)
            if f.name in ("scenario", "label", "first_failure"):
                values[f.name] = as_str(value)
            elif f.name == "batch_rows":
                rows = as_dict(value)
                values[f.name] = {str(k): v for k, v in rows.items() if as_int(v) is not None}
            elif f.name in ("queries", "answered", "dropped", "timed_out", "failed", "padded_rows"):
                values[f.name] = as_int(value)
            else:
                values[f.name] = as_float(value)
        return cls(**values)


@dataclass(frozen=True)
class ServingRound:
    """One round (one server process) of a serving cell: its Offline capacity, its peak load under the p99 bound
    (None: no point met it), its points in the order run."""

    capacity_qps: float | None = None
    peak_qps: float | None = None
    points: tuple[LoadPoint, ...] = ()

    def point(self, label: str) -> LoadPoint | None:
        return next((p for p in self.points if p.label == label), None)

    @classmethod
    def parse(cls, raw: Any) -> ServingRound | None:
        if not isinstance(raw, dict):
            return None
        return cls(
            as_float(raw.get("capacity_qps")), as_float(raw.get("peak_qps")), _each(LoadPoint.parse, raw.get("points"))
        )


@dataclass(frozen=True)
class ServingDetails:
    """``details.serving`` of a phase-serving cell: the batcher's settings (max batch = the cell's batch size, the
    compiled batch sizes, seconds), the bound, and every round (one per worker, in order)."""

    max_batch: int | None = None
    buckets: tuple[int, ...] | None = None
    max_delay_s: float | None = None
    max_queue_rows: int | None = None
    p99_bound_s: float | None = None
    point_s: float | None = None
    rounds: tuple[ServingRound, ...] = ()

    @classmethod
    def parse(cls, raw: Any) -> ServingDetails | None:
        if not isinstance(raw, dict):
            return None
        rounds = _each(ServingRound.parse, raw.get("rounds"))
        if not rounds:  # one round, stored without the list
            first = ServingRound.parse(raw)
            rounds = () if first is None else (first,)
        return cls(
            as_int(raw.get("max_batch")),
            _ints(raw.get("buckets")),
            as_float(raw.get("max_delay_s")),
            as_int(raw.get("max_queue_rows")),
            as_float(raw.get("p99_bound_s")),
            as_float(raw.get("point_s")),
            rounds,
        )
