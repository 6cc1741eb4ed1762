"""The table ``fwbench env`` prints: the environment record stored with every run, key by key."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.table import Table


def environment_table(record: Mapping[str, Any]) -> Table:
    """One row per key of ``record``; None shows as —."""
    table = Table(title="environment (stored with every run)")
    table.add_column("key")
    table.add_column("value")
    for key, value in record.items():
        table.add_row(key, "—" if value is None else str(value))
    return table
