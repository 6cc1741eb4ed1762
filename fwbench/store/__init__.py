"""The embedded SQLite results store."""

from fwbench.store.db import RunRecord, Store
from fwbench.store.errors import StoreError
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
from fwbench.store.schema import SCHEMA_VERSION

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
