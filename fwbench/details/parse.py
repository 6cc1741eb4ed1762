"""The tolerant readers of stored ``details`` values and the writers' key selection, shared by every record.

Each reader takes a value as JSON gave it back and returns it typed, or None (empty) when it is absent or of the wrong
type; ``all_fields`` / ``set_fields`` give a record's stored form. Standard library only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields
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


def ints(value: Any) -> tuple[int, ...] | None:
    """A stored list of integers (other items left out); None when it is not a list."""
    return tuple(i for i in map(as_int, value) if i is not None) if isinstance(value, list) else None


def floats(value: Any) -> tuple[float, ...] | None:
    """A stored list of numbers as floats (other items left out); None when it is not a list."""
    return tuple(x for x in map(as_float, value) if x is not None) if isinstance(value, list) else None


def strs(value: Any) -> tuple[str, ...] | None:
    """A stored list of strings (each item as text); None when it is not a list."""
    return tuple(str(item) for item in value) if isinstance(value, list) else None


def each(parse: Callable[[Any], T | None], raw: Any) -> tuple[T, ...]:
    """Each item of a stored list as ``parse`` reads it (an item it cannot read left out); empty when not a list."""
    return tuple(item for item in map(parse, raw if isinstance(raw, list) else ()) if item is not None)


def stored(value: Any) -> Any:
    """``value`` as JSON keeps it: a record as its ``to_dict()``, tuples and lists as lists, mappings as dicts."""
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, (tuple, list)):
        return [stored(item) for item in value]
    if isinstance(value, Mapping):
        return {key: stored(item) for key, item in value.items()}
    return value


def all_fields(record: Any) -> dict[str, Any]:
    """Every field of ``record`` under its own name, as stored (a writer that always writes every key)."""
    return {f.name: stored(getattr(record, f.name)) for f in fields(record)}


def set_fields(record: Any, keep: Iterable[str] = ()) -> dict[str, Any]:
    """The fields of ``record`` that are set, as stored: a field that is None was not written (a writer that adds
    keys as it goes), unless it is named in ``keep`` (written, as null)."""
    kept = set(keep)
    return {
        f.name: stored(value)
        for f in fields(record)
        if (value := getattr(record, f.name)) is not None or f.name in kept
    }
