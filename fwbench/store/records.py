"""Typed records of stored result rows: :class:`ResultRecord` and the sub-records parsed from ``details_json``.

``details_json`` holds what the worker measured beyond the result columns (parity, training, fit, compile
health, versions, ...). It is parsed once, when a row is read, into the typed sub-records below; a key an
older fwbench did not write reads as its default (None, or an empty record), so every stored run stays
readable without a schema change. The raw dict stays on the record (:attr:`ResultRecord.details`) for the
keys not typed here. Times are seconds, sizes bytes, as stored.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from fwbench.measure.environment import machine_ids
from fwbench.measure.noise import NoiseTotals, contention
from fwbench.measure.rounds import Block, blocks_by_round
from fwbench.profile.categories import CATEGORIES
from fwbench.profile.cells import ProfiledCell
from fwbench.profile.summary import OpRow, ProfileSummary


def _float(value: Any) -> float | None:
    """A stored number as float; None for anything else (absent, null, text)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    """A stored integer; None for anything else."""
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _dict(value: Any) -> dict[str, Any]:
    """A stored JSON object; empty for anything else."""
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class OutputError:
    """One output's error against the float64 reference: relative L2 and max-abs (None: not stored)."""

    rel_l2: float | None = None
    max_abs: float | None = None


@dataclass(frozen=True)
class ParityCheck:
    """``details.parity``: the check of one cell's outputs (inference) or first-step loss (training) against
    the float64 reference. ``ok`` None: the stored check has no verdict. ``shape``: (batch, seq or None)
    it was checked at; ``outputs``: each output's error, by output name, in stored order."""

    ok: bool | None = None
    reference: str | None = None
    tolerance_rel_l2: float | None = None
    checked: str | None = None
    shape: tuple[int | None, ...] = ()
    outputs: Mapping[str, OutputError] = field(default_factory=dict)
    reference_loss: float | None = None

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
            str(name): OutputError(_float(v.get("rel_l2")), _float(v.get("max_abs")))
            for name, v in _dict(raw.get("outputs")).items()
            if isinstance(v, dict)
        }
        shape = raw.get("shape")
        return cls(
            ok=bool(raw["ok"]) if "ok" in raw else None,
            reference=_str(raw.get("reference")),
            tolerance_rel_l2=_float(raw.get("tolerance_rel_l2")),
            checked=_str(raw.get("checked")),
            shape=tuple(_int(s) for s in shape) if isinstance(shape, list) else (),
            outputs=outputs,
            reference_loss=_float(raw.get("reference_loss")),
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

    @classmethod
    def parse(cls, raw: Any) -> PrecisionCheck | None:
        """The check stored as ``raw``; None when there is none (not a JSON object)."""
        if not isinstance(raw, dict):
            return None
        observed = {
            str(op): tuple(str(d) for d in dtypes)
            for op, dtypes in _dict(raw.get("observed")).items()
            if isinstance(dtypes, list)
        }
        mismatches = raw.get("mismatches")
        return cls(
            policy=_str(raw.get("policy")),
            observable=isinstance(raw.get("observed"), dict),
            observed=observed,
            mismatches=tuple(str(m) for m in mismatches) if isinstance(mismatches, list) else (),
            error=_str(raw.get("error")),
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
        return cls(**{f.name: _int(raw.get(f.name)) or 0 for f in fields(cls)})


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
            loss=_str(raw.get("loss")),
            first_loss=_float(raw.get("first_loss")),
            final_loss=_float(raw.get("final_loss")),
            counted_steps_before_final=_int(raw.get("counted_steps_before_final")),
            step_losses=None if not isinstance(losses, list) else tuple(float(x) for x in losses),
            step_loss_parts=StepLossParts.parse(raw.get("step_loss_parts")),
            samples_per_step=_int(raw.get("samples_per_step")),
            tokens_per_step=_int(raw.get("tokens_per_step")),
        )


@dataclass(frozen=True)
class FitDetails:
    """``details.fit`` of a phase-fit cell: the loop that ran, every epoch's seconds and mean loss, and the
    final loss and accuracy over the whole dataset. Epoch 1 (compilation included) is the row's
    ``first_call_s``; the row's samples are epochs 2..."""

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
    extra: Mapping[str, Any] = field(default_factory=dict)  # what one loop adds (e.g. Lightning's version, logging)

    @classmethod
    def parse(cls, raw: Any) -> FitDetails | None:
        """None without fit details, or without a field the overhead table needs (loop, steps per epoch,
        final loss and accuracy)."""
        if not isinstance(raw, dict):
            return None
        loop, steps = _str(raw.get("loop")), _int(raw.get("steps_per_epoch"))
        loss, accuracy = _float(raw.get("final_loss")), _float(raw.get("final_accuracy"))
        if loop is None or steps is None or loss is None or accuracy is None:
            return None
        optimizer = raw.get("optimizer")
        return cls(
            loop=loop,
            steps_per_epoch=steps,
            final_loss=loss,
            final_accuracy=accuracy,
            epochs=_int(raw.get("epochs")),
            samples=_int(raw.get("samples")),
            batch_size=_int(raw.get("batch_size")),
            epoch_s=tuple(float(x) for x in raw.get("epoch_s") or ()),
            epoch_loss=tuple(float(x) for x in raw.get("epoch_loss") or ()),
            total_s=_float(raw.get("total_s")),
            optimizer=optimizer if isinstance(optimizer, dict) else None,
            extra={k: v for k, v in raw.items() if k not in _FIT_KEYS},
        )


_FIT_KEYS = frozenset({f.name for f in fields(FitDetails)} | {"samples_are"})


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
    def parse(cls, raw: Any) -> CompileHealth:
        """The stored record; the empty one for a cell that stored none."""
        if not isinstance(raw, dict) or not raw:
            return NO_COMPILE_HEALTH

        def counters(key: str) -> dict[str, int]:
            return {str(k): v for k, v in _dict(raw.get(key)).items() if _int(v) is not None}

        flags = raw.get("flags")
        return cls(
            flags=tuple(str(f) for f in flags) if isinstance(flags, list) else (),
            recompiled_in_timed_loop=bool(raw.get("recompiled_in_timed_loop", False)),
            during_timing=counters("during_timing"),
            after_warmup=counters("after_warmup"),
            after_timing=counters("after_timing"),
        )


NO_COMPILE_HEALTH = CompileHealth()


# The worker's stages up to its first call's outputs (runner.messages.STAGES): the time to first result.
FIRST_RESULT_STAGES = ("start", "import", "build", "compile", "first_call")


@dataclass(frozen=True)
class ResultRecord:
    """One stored cell: its case, status, statistics (seconds per call), memory (bytes), raw samples and the
    typed details. ``details`` is the raw ``details_json`` object, for the keys not typed here."""

    id: int
    run_id: int
    case_key: str
    created: str
    model: str
    runtime: str
    phase: str
    batch_size: int
    seq_len: int | None
    dtype: str
    device: str
    status: str
    reason: str | None = None
    protocol: str | None = None
    samples: tuple[float, ...] = ()
    calls_per_sample: int | None = None
    n_samples: int = 0
    median_s: float | None = None
    ci_low_s: float | None = None
    ci_high_s: float | None = None
    mean_s: float | None = None
    stdev_s: float | None = None
    min_s: float | None = None
    first_call_s: float | None = None
    peak_memory_bytes: int | None = None
    allocator_peak_bytes: int | None = None
    threads: int | None = None
    interop_threads: int | None = None
    flops: int | None = None
    wall_s: float | None = None
    details: Mapping[str, Any] = field(default_factory=dict)
    parity: ParityCheck | None = None
    precision: PrecisionCheck | None = None  # None: not observed (stored before the policy was observed)
    training: TrainingDetails | None = None
    fit: FitDetails | None = None
    compile_health: CompileHealth = NO_COMPILE_HEALTH
    versions: Mapping[str, Any] | None = None
    group_key: str | None = None  # None: stored before rounds (migration 2)
    schedule: str | None = None  # interleaved | sequential; None: stored before rounds
    rounds: int | None = None
    noise: NoiseTotals | None = None
    machine: Mapping[str, Any] | None = None
    blocks: tuple[Block, ...] = ()
    workers: int | None = None  # phase data: the loader's worker processes (None in every other phase)
    procs: int | None = None  # a distributed cell's processes (None for every other cell)
    scaling: str | None = None  # a distributed cell's batch semantics: weak or strong (spec.Scaling)
    hostname: str | None = None  # the host that ran the cell
    hardware_id: str | None = None  # its hardware fingerprint (fwbench.measure.environment.hardware_record)
    software_id: str | None = None  # its software record's id (None: stored before fingerprints)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ResultRecord:
        """The record of a row as the store keeps it, ``samples``/``details`` given decoded (lists, dict) or
        as ``samples_json``/``details_json`` text, ``blocks`` as Block tuples; absent optional columns read as None."""
        samples = row["samples"] if "samples" in row else json.loads(row.get("samples_json") or "[]")
        details = row["details"] if "details" in row else json.loads(row.get("details_json") or "{}")
        details = _dict(details)
        columns = {name: row[name] for name in COLUMN_NAMES if name in row}
        versions = details.get("versions")
        noise = row["noise"] if "noise" in row else json.loads(row.get("noise_json") or "null")
        machine = row["machine"] if "machine" in row else json.loads(row.get("machine_json") or "null")
        machine = machine if isinstance(machine, dict) else None
        if columns.get("hardware_id") is None:  # stored before fingerprints: the id its machine record gives
            columns["hostname"], columns["hardware_id"], columns["software_id"] = machine_ids(machine)
        return cls(
            **columns,
            samples=tuple(map(float, samples)),
            noise=NoiseTotals.from_dict(noise) if isinstance(noise, dict) else None,
            machine=machine,
            blocks=tuple(row.get("blocks") or ()),
            details=details,
            parity=ParityCheck.parse(details.get("parity")),
            precision=PrecisionCheck.parse(details.get("precision")),
            training=TrainingDetails.parse(details.get("training")),
            fit=FitDetails.parse(details.get("fit")),
            compile_health=CompileHealth.parse(details.get("compile_health")),
            versions=versions if isinstance(versions, dict) else None,
        )

    def to_dict(self) -> dict[str, Any]:
        """The row as plain JSON-ready data: every column, ``samples`` (list), the raw ``details``, the noise and
        machine records and the blocks."""
        out = {name: getattr(self, name) for name in COLUMN_NAMES}
        out["samples"] = list(self.samples)
        out["details"] = dict(self.details)
        out["noise"] = None if self.noise is None else self.noise.to_dict()
        out["machine"] = None if self.machine is None else dict(self.machine)
        out["blocks"] = [dataclasses.asdict(block) for block in self.blocks]
        return out

    @property
    def time_to_first_result_s(self) -> float | None:
        """Seconds from the worker's first stage to its first call's outputs: importing the framework, build,
        compile (an export, conversion and load included; an artefact from the export cache counts the seconds its
        export took) and the first call, from ``details.stage_seconds``
        (the interpreter's start and fwbench's own imports come before the first stage); None where the cell never
        reached its first call or stored no stage seconds."""
        stages = _dict(self.details.get("stage_seconds"))
        if _float(stages.get("first_call")) is None:
            return None
        total = sum(_float(stages.get(stage)) or 0.0 for stage in FIRST_RESULT_STAGES)
        report = _dict(self.details.get("compile_report"))
        if report.get("cached"):  # its artefact came from the group's export cache: count the export it took
            total += _float(report.get("export_s")) or 0.0
        return total

    @property
    def global_batch(self) -> int:
        """Samples one timed call processes: the batch size, or a distributed cell's global batch (weak scaling:
        processes × the batch size each takes)."""
        return self.batch_size * self.procs if self.procs is not None and self.scaling == "weak" else self.batch_size

    @property
    def nodes(self) -> int:
        """Machines a distributed cell's processes ran on (``fwbench run --nnodes``); 1 for every other cell."""
        return max(1, len(_dict(self.details.get("rendezvous")).get("nodes") or []))

    @property
    def exported(self) -> bool:
        """Whether the cell ran an exported artefact: its compile report has the export's seconds."""
        return _float(_dict(self.details.get("compile_report")).get("export_s")) is not None

    @property
    def round_samples(self) -> list[list[float]]:
        """Seconds per call by round: the blocks' when stored, else all samples as one round (rows stored before
        rounds, which are never given a CI)."""
        if self.blocks:
            return blocks_by_round(self.blocks)
        return [list(self.samples)] if self.samples else []

    @property
    def round_count(self) -> int:
        """Rounds behind the row's time (1 for rows stored before rounds)."""
        return len(self.round_samples)

    @property
    def contended(self) -> list[str]:
        """Why the machine was busy with other work while this cell was timed (empty: it was not, or unknown)."""
        return [] if self.noise is None else contention(self.noise)


# The result columns a record carries as attributes of the same name (``samples``/``details`` decoded apart).
COLUMN_NAMES: tuple[str, ...] = (
    "id",
    "run_id",
    "case_key",
    "created",
    "model",
    "runtime",
    "phase",
    "batch_size",
    "seq_len",
    "dtype",
    "device",
    "status",
    "reason",
    "protocol",
    "calls_per_sample",
    "n_samples",
    "median_s",
    "ci_low_s",
    "ci_high_s",
    "mean_s",
    "stdev_s",
    "min_s",
    "first_call_s",
    "peak_memory_bytes",
    "allocator_peak_bytes",
    "threads",
    "interop_threads",
    "flops",
    "wall_s",
    "group_key",
    "schedule",
    "rounds",
    "workers",
    "procs",
    "scaling",
    "hostname",
    "hardware_id",
    "software_id",
)


@dataclass(frozen=True)
class ProfileRecord:
    """One stored profiled cell (table ``profiles``, fwbench profile): the case, how it ended, and ``cell`` (its
    profile rebuilt from the stored figures and op rows; None unless status is ``ok``)."""

    id: int
    run_id: int
    case_key: str
    model: str
    runtime: str
    phase: str
    batch_size: int
    seq_len: int | None
    dtype: str
    device: str
    status: str
    reason: str | None
    cell: ProfiledCell | None
    details: dict[str, Any] = field(default_factory=dict)


def profile_record(row: Mapping[str, Any], ops: list[OpRow]) -> ProfileRecord:
    """A :class:`ProfileRecord` from a ``profiles`` row and its ``profile_ops`` rows."""
    cell = None
    if row["status"] == "ok" and row["calls"] is not None:
        categories = json.loads(row["categories_json"])
        summary = ProfileSummary(
            calls=row["calls"],
            wall_s=row["wall_s"],
            busy_s=row["busy_s"],
            overlap_s=row["overlap_s"],
            overhead_s=row["overhead_s"],
            categories_s={category: float(categories.get(category, 0.0)) for category in CATEGORIES},
            ops=sorted(ops, key=lambda op: (-op.self_s_per_call, op.name)),
            uncategorized=list(json.loads(row["uncategorized_json"])),
        )
        cell = ProfiledCell(
            summary=summary,
            trace=row["trace_path"] or "",
            profiler=row["profiler"] or "",
            unprofiled_median_s=row["unprofiled_median_s"],
            profiled_median_s=row["profiled_median_s"],
            attribution=row["attribution"] or "",
        )
    return ProfileRecord(
        id=row["id"],
        run_id=row["run_id"],
        case_key=row["case_key"],
        model=row["model"],
        runtime=row["runtime"],
        phase=row["phase"],
        batch_size=row["batch_size"],
        seq_len=row["seq_len"],
        dtype=row["dtype"],
        device=row["device"],
        status=row["status"],
        reason=row["reason"],
        cell=cell,
        details=json.loads(row["details_json"] or "{}"),
    )
