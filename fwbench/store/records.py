"""Typed records of stored result rows: :class:`ResultRecord`, with the sub-records of ``details_json``.

``details_json`` holds what the worker measured beyond the result columns (parity, training, fit, compile
health, the loader's and the ranks' figures, versions, ...). It is parsed once, when a row is read, into the typed
sub-records of :mod:`fwbench.details` (the one declaration of each group's keys, which the writers build too); a
key an older fwbench did not write reads as its default (None, or an empty record), so every stored run stays
readable without a schema change. The raw dict stays on the record (:attr:`ResultRecord.details`) for the
keys not typed. Times are seconds, sizes bytes, as stored.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fwbench.details import (
    FIRST_RESULT_STAGES,
    NO_COMPILE_HEALTH,
    CompileHealth,
    CompileReport,
    CpuUnits,
    DataDetails,
    DistributedDetails,
    FitDetails,
    GenerationDetails,
    Interleaving,
    OutputError,
    ParityCheck,
    PrecisionCheck,
    RankDetail,
    Rendezvous,
    ServingDetails,
    StageSeconds,
    StepLossParts,
    TrainingDetails,
    as_dict,
)
from fwbench.measure.environment import machine_ids
from fwbench.measure.moderate import RunPriors
from fwbench.measure.noise import NoiseTotals, contention
from fwbench.measure.rounds import Block, blocks_by_round
from fwbench.profile.categories import CATEGORIES
from fwbench.profile.cells import ProfiledCell
from fwbench.profile.summary import OpRow, ProfileSummary

__all__ = [  # the details records are fwbench.details'; these names stay importable from here
    "COLUMN_NAMES",
    "FIRST_RESULT_STAGES",
    "NO_COMPILE_HEALTH",
    "CompileHealth",
    "CompileReport",
    "CpuUnits",
    "DataDetails",
    "ServingDetails",
    "DistributedDetails",
    "FitDetails",
    "Interleaving",
    "OutputError",
    "ParityCheck",
    "PrecisionCheck",
    "ProfileRecord",
    "RankDetail",
    "Rendezvous",
    "ResultRecord",
    "StageSeconds",
    "StepLossParts",
    "TrainingDetails",
    "profile_record",
]


def unfinished(status: str | None, rounds: int | None, min_rounds: int) -> bool:
    """Whether a stored cell holds only some of its run's minimum rounds (``--rounds``): ``ok`` with fewer than
    ``min_rounds`` rounds stored, the rounds so far of a group whose window the run was stopped in
    (``fwbench.runner.manager.Window``), which ``--resume`` runs again. Rows stored before rounds (None) are done."""
    return status == "ok" and rounds is not None and rounds < min_rounds


@dataclass(frozen=True)
class CellInterval:
    """How a cell's 95% CI was made: its own interval (over its rounds alone, as stored in the database's
    ``ci_low_s`` / ``ci_high_s`` columns), the degrees of freedom of the interval the record shows, and whether
    that one was moderated over its run (:mod:`fwbench.store.moderation`)."""

    own_low_s: float
    own_high_s: float
    dof: float | None
    moderated: bool

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


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
    compile_report: CompileReport | None = None  # an ahead-of-time compile's (deployment runtimes, torch:export)
    stage_seconds: StageSeconds | None = None  # None: stored before stages were timed
    cpu_units: CpuUnits = CpuUnits()  # a bf16 / int8 CPU cell's native units
    data: DataDetails | None = None  # phase data: the loader's figures
    serving: ServingDetails | None = None  # phase serving: the load points of every round
    generation: GenerationDetails | None = None  # phase generate: every round's latencies and rates
    distributed: DistributedDetails | None = None  # a distributed cell: its batch rows and all-reduce
    ranks: tuple[RankDetail, ...] = ()  # a distributed cell: each rank's figures
    rendezvous: Rendezvous | None = None  # a distributed cell: where its ranks met
    interleaving: Interleaving = Interleaving()  # each round's worker figures; the memory sub-groups
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
    # Set when read with its run (Store.results): the interval shown, and the run's variance priors.
    interval: CellInterval | None = None
    priors: RunPriors | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ResultRecord:
        """The record of a row as the store keeps it, ``samples``/``details`` given decoded (lists, dict) or
        as ``samples_json``/``details_json`` text, ``blocks`` as Block tuples; absent optional columns read as None."""
        samples = row["samples"] if "samples" in row else json.loads(row.get("samples_json") or "[]")
        details = row["details"] if "details" in row else json.loads(row.get("details_json") or "{}")
        details = as_dict(details)
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
            compile_report=CompileReport.parse(details.get("compile_report")),
            stage_seconds=StageSeconds.parse(details.get("stage_seconds")),
            cpu_units=CpuUnits.from_details(details),
            data=DataDetails.parse(details.get("data")),
            serving=ServingDetails.parse(details.get("serving")),
            generation=GenerationDetails.parse(details.get("generation")),
            distributed=DistributedDetails.parse(details.get("distributed")),
            ranks=RankDetail.parse_all(details.get("ranks")),
            rendezvous=Rendezvous.parse(details.get("rendezvous")),
            interleaving=Interleaving.from_details(details),
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
        out["interval"] = None if self.interval is None else self.interval.to_dict()
        return out

    @property
    def time_to_first_result_s(self) -> float | None:
        """Seconds from the worker's first stage to its first call's outputs: importing the framework, build,
        compile (an export, conversion and load included; an artefact from the export cache counts the seconds its
        export took) and the first call, from ``details.stage_seconds``
        (the interpreter's start and fwbench's own imports come before the first stage); None where the cell never
        reached its first call or stored no stage seconds."""
        total = None if self.stage_seconds is None else self.stage_seconds.first_result_s
        if total is None:
            return None
        report = self.compile_report
        if report is not None and report.cached:  # its artefact came from the group's export cache: count its export
            total += report.export_s or 0.0
        return total

    @property
    def global_batch(self) -> int:
        """Samples one timed call processes: the batch size, or a distributed cell's global batch (weak scaling:
        processes × the batch size each takes)."""
        return self.batch_size * self.procs if self.procs is not None and self.scaling == "weak" else self.batch_size

    @property
    def nodes(self) -> int:
        """Machines a distributed cell's processes ran on (``fwbench run --nnodes``); 1 for every other cell."""
        return max(1, 0 if self.rendezvous is None else len(self.rendezvous.nodes))

    @property
    def exported(self) -> bool:
        """Whether the cell ran an exported artefact: its compile report has the export's seconds."""
        return self.compile_report is not None and self.compile_report.export_s is not None

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


# The result columns a record carries as attributes of the same name (``samples``/``details`` decoded apart): the one
# list of them, in the order the CSV export writes those it writes (fwbench.report.export.CSV_COLUMNS); the case's
# fields (spec.CASE_FIELDS) among them, its second axis (sequence, workers, processes) before the dtype.
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
    "workers",
    "procs",
    "scaling",
    "dtype",
    "device",
    "status",
    "reason",
    "protocol",
    "group_key",
    "schedule",
    "rounds",
    "n_samples",
    "calls_per_sample",
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
