"""The embedded SQLite results store."""

from fwbench.store.db import SCHEMA_VERSION, RunRecord, Store, StoreError

DEFAULT_DB = "results/fwbench.db"

__all__ = ["DEFAULT_DB", "SCHEMA_VERSION", "RunRecord", "Store", "StoreError"]
