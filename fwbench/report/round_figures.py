"""Figures a phase measures once per round (phase serving's capacities and percentiles, phase generate's latencies
and rates), estimated over the rounds as fwbench's cell times are, and written with as many digits as their interval
supports."""

from __future__ import annotations

import math
from collections.abc import Sequence

from fwbench.measure.rounds import Estimate, time_estimate
from fwbench.units import format_significant, seconds_unit, significant_digits


def over_rounds(values: Sequence[float | None]) -> Estimate | None:
    """The rounds' values (those measured and positive) as fwbench's cell times are estimated
    (:func:`fwbench.measure.rounds.time_estimate`, each round one value): their geometric mean, with a Student-t
    interval of the logs from 3 rounds; a round that stalled moves it less than an arithmetic mean. None when no
    round measured one."""
    return time_estimate([[v] for v in values if v is not None and math.isfinite(v)])


def _digits(figure: Estimate, scale: float = 1.0) -> int:
    half = None if figure.ci_low is None or figure.ci_high is None else (figure.ci_high - figure.ci_low) / 2 / scale
    return significant_digits(figure.value / scale, half)


def seconds_text(figure: Estimate | None) -> str:
    """``12.3 ms (11.0–13.9)``: the interval in the mean's unit, digits as many as it supports."""
    if figure is None:
        return "—"
    scale, unit = seconds_unit(figure.value)
    digits = _digits(figure, scale)
    text = f"{format_significant(figure.value / scale, digits)} {unit}"
    if figure.ci_low is None or figure.ci_high is None:
        return text
    return f"{text} ({format_significant(figure.ci_low / scale, 2)}–{format_significant(figure.ci_high / scale, 2)})"


def rate_text(figure: Estimate | None) -> str:
    """``1330 (1200–1470)``: a rate (queries or tokens per second), digits as many as its interval supports."""
    if figure is None:
        return "—"
    text = format_significant(figure.value, _digits(figure))
    if figure.ci_low is None or figure.ci_high is None:
        return text
    return f"{text} ({format_significant(figure.ci_low, 2)}–{format_significant(figure.ci_high, 2)})"
