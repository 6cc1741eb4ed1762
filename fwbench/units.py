"""Scaling stored seconds and bytes for display (storage always keeps seconds and bytes)."""

from __future__ import annotations

import math


def format_percent(fraction: float, digits: int = 3) -> str:
    """``0.05`` → ``'5%'``, ``0.0001`` → ``'0.01%'``: ``digits`` significant digits at most, as given."""
    return f"{fraction * 100:.{digits}g}%"


def format_seconds(value: float | None, digits: int = 3) -> str:
    """``2.13e-05`` → ``'21.3 µs'``; ``'—'`` for None."""
    if value is None or math.isnan(value):
        return "—"
    value = float(f"{value:.{digits}g}")  # round first: 0.9996 s is "1 s", not "1e+03 ms"
    scale, unit = seconds_unit(value)
    return f"{value / scale:.{digits}g} {unit}"


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


def format_gflops(value: float | None) -> str:
    """A rate in GFLOP/s, three significant digits without an exponent: ``171.4`` → ``'171'``,
    ``94`` → ``'94.0'``, ``0.9921`` → ``'0.992'``; ``'—'`` for None."""
    if value is None or math.isnan(value):
        return "—"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:#.3g}" if abs(value) >= 0.001 else f"{value:.1e}"


def format_fraction(value: float | None) -> str:
    """A fraction as a percentage with one decimal (``0.4531`` → ``'45.3%'``), one significant digit
    below 0.1%; ``'—'`` for None."""
    if value is None or math.isnan(value):
        return "—"
    return f"{value:.1%}" if abs(value) >= 0.001 else f"{value * 100:.1g}%"


def significant_digits(
    value: float, half_width: float | None, default: int = 3, lowest: int = 2, highest: int = 4
) -> int:
    """How many significant digits of ``value`` its noise supports: down to the decimal place of the
    leading digit of ``half_width`` (the CI half-width, same unit), clamped to [lowest, highest];
    ``default`` without a usable half-width. ``21.34`` ± ``0.064`` → 4; ± ``1.1`` → 2."""
    if half_width is None or not math.isfinite(half_width) or half_width <= 0 or value == 0 or not math.isfinite(value):
        return default
    digits = math.floor(math.log10(abs(value))) - math.floor(math.log10(half_width)) + 1
    return max(lowest, min(highest, digits))


def decimals_for(value: float, digits: int) -> int:
    """Decimal places that show ``digits`` significant digits of ``value`` in fixed-point notation (never
    negative: integer digits are kept, ``213`` at 2 digits is ``'213'``, not ``'2.1e+02'``)."""
    if value == 0 or not math.isfinite(value):
        return max(0, digits - 1)
    return max(0, digits - 1 - math.floor(math.log10(abs(value))))


def format_significant(value: float, digits: int) -> str:
    """``value`` with ``digits`` significant digits, fixed-point: ``(21.337, 3)`` → ``'21.3'``."""
    return f"{value:.{decimals_for(value, digits)}f}"


def seconds_unit(value: float) -> tuple[float, str]:
    """The display scale and unit of a duration in seconds: ``2.1e-05`` → ``(1e-06, 'µs')``."""
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns")):
        if abs(value) >= scale or unit == "ns":
            return scale, unit
    raise AssertionError("unreachable")


def format_seconds_noise(value: float | None, low: float | None, high: float | None) -> str:
    """A median in seconds with the digits its CI ``[low, high]`` supports (:func:`significant_digits`):
    ``2.1337e-05`` with CI ±6.4e-08 → ``'21.34 µs'``, with CI ±1.1e-06 → ``'21 µs'``; ``'—'`` for None."""
    if value is None or math.isnan(value):
        return "—"
    half = None if low is None or high is None else (high - low) / 2
    scale, unit = seconds_unit(value)
    return f"{format_significant(value / scale, significant_digits(value, half))} {unit}"


def procs_text(procs: int | None, scaling: str | None, nodes: int = 1) -> str:
    """A distributed cell's processes and scaling (``2 weak``; ``2 weak/2 nodes`` across machines), ``—`` for a cell
    of one process."""
    if procs is None:
        return "—"
    return f"{procs} {scaling}" + (f"/{nodes} nodes" if nodes > 1 else "")


def second_axis_text(
    seq_len: int | None, workers: int | None, procs: int | None = None, scaling: str | None = None
) -> str:
    """A table's ``seq`` cell: the sequence length, ``w=N`` for a phase data cell's loader workers, else ``—``; a
    distributed cell's processes and scaling after it (``128 p=2 weak``)."""
    text = f"w={workers}" if workers is not None else "—" if seq_len is None else str(seq_len)
    return text if procs is None else f"{text} p={procs} {scaling}"


def short_id(record_id: str | None) -> str:
    """A hardware or software id as shown in tables: its first 8 hex digits (``?`` when unknown)."""
    return "?" if record_id is None else record_id[:8]
