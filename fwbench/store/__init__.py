"""The embedded SQLite results store."""

from fwbench.store.db import SCHEMA_VERSION, RunRecord, Store, StoreError
from fwbench.store.records import (
    CompileHealth,
    FitDetails,
    OutputError,
    ParityCheck,
    ProfileRecord,
    ResultRecord,
    StepLossParts,
    TrainingDetails,
)

DEFAULT_DB = "results/fwbench.db"

__all__ = [
    "DEFAULT_DB",
    "SCHEMA_VERSION",
    "CompileHealth",
    "FitDetails",
    "OutputError",
    "ParityCheck",
    "ProfileRecord",
    "ResultRecord",
    "RunRecord",
    "StepLossParts",
    "Store",
    "StoreError",
    "TrainingDetails",
]
