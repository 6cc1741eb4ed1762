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

One module per group of records, each importing only the helpers of :mod:`fwbench.details.parse` (and
:class:`StageSeconds`): ``checks`` (parity, precision, training), ``compile`` (compile health, stage seconds, the
ahead-of-time compile report, the CPU's units), ``data`` (phase data's loader, phase fit), ``distributed`` (ranks,
rendezvous), ``rounds`` (the scheduler's rounds), ``serving`` (phase serving) and ``generation`` (phase generate).
Import the records from here, the one place that names them.
"""

from fwbench.details.checks import (
    FirstDivergence,
    OutputError,
    ParityCheck,
    PrecisionCheck,
    StepLossParts,
    TrainingDetails,
)
from fwbench.details.compile import (
    FIRST_RESULT_STAGES,
    NO_COMPILE_HEALTH,
    CompileHealth,
    CompileReport,
    CpuUnits,
    StageSeconds,
)
from fwbench.details.data import CorruptFile, DataDetails, FirstBatch, FitDetails, PssPeak
from fwbench.details.distributed import DistributedDetails, RankDetail, Rendezvous, RendezvousNode
from fwbench.details.generation import GenerationDetails, GenerationRound
from fwbench.details.parse import as_dict, as_float, as_int, as_str
from fwbench.details.rounds import STOP_REASONS, ExtraRoundFailure, Interleaving, RoundDetail, RoundsStop
from fwbench.details.serving import LoadPoint, ServingDetails, ServingRound

__all__ = [
    "FIRST_RESULT_STAGES",
    "NO_COMPILE_HEALTH",
    "STOP_REASONS",
    "CompileHealth",
    "CompileReport",
    "CorruptFile",
    "CpuUnits",
    "DataDetails",
    "DistributedDetails",
    "ExtraRoundFailure",
    "FirstBatch",
    "FirstDivergence",
    "FitDetails",
    "GenerationDetails",
    "GenerationRound",
    "Interleaving",
    "LoadPoint",
    "OutputError",
    "ParityCheck",
    "PrecisionCheck",
    "PssPeak",
    "RankDetail",
    "Rendezvous",
    "RendezvousNode",
    "RoundDetail",
    "RoundsStop",
    "ServingDetails",
    "ServingRound",
    "StageSeconds",
    "StepLossParts",
    "TrainingDetails",
    "as_dict",
    "as_float",
    "as_int",
    "as_str",
]
