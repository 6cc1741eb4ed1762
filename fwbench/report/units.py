"""Scaling stored seconds and bytes for display (storage always keeps seconds and bytes)."""

from __future__ import annotations

import math


def format_seconds(value: float | None, digits: int = 3) -> str:
    """``2.13e-05`` → ``'21.3 µs'``; ``'—'`` for None."""
    if value is None or math.isnan(value):
        return "—"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns")):
        if abs(value) >= scale or unit == "ns":
            return f"{value / scale:.{digits}g} {unit}"
    raise AssertionError("unreachable")


def format_bytes(value: int | None) -> str:
    """``1536`` → ``'1.5 KiB'``; ``'—'`` for None."""
    if value is None:
        return "—"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def parse_bytes(text: str) -> int:
    """``'2G'``, ``'512M'``, ``'64k'`` or a plain integer → bytes (binary multiples); ValueError otherwise."""
    text = text.strip()
    multiplier = 1
    if text and text[-1].upper() in "KMGT":
        multiplier = 1024 ** ("KMGT".index(text[-1].upper()) + 1)
        text = text[:-1]
    if not text.isdigit() or int(text) <= 0:
        raise ValueError("expected a positive integer, optionally with K, M, G or T")
    return int(text) * multiplier
