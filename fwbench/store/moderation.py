"""A run's cells read together: their round-level variances moderated over the run (:mod:`fwbench.measure.moderate`).

:meth:`fwbench.store.Store.results` always reads whole runs, so each run's priors are fitted here, when read, over
all of its cells on one machine (``hardware_id`` and ``hostname``: shards from two hosts of one kind stay apart):
the same priors whatever a report later filters, for runs stored before this existed, for resumed runs and for
runs merged from shards alike.

- Cell times: every ``ok`` cell with at least 2 rounds gives a :class:`~fwbench.measure.moderate.Unit`; a cell's
  ``ci_low_s`` / ``ci_high_s`` become the moderated interval (:attr:`ResultRecord.interval` keeps its own, written
  when its group was stored, which is what the database's columns hold, and what :meth:`Store.result` gives: one
  cell read alone, as the live TensorBoard writer and ``--resume`` read it, has no run to be moderated over).
- Speed-ups: every two ``ok`` cells measured together (one comparison group, interleaved) give a unit from their
  paired log ratios; the report's paired speed-ups use that prior (:func:`fwbench.speedups.row_ratio`),
  whichever baseline it is asked for.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence

from fwbench.measure.moderate import RunPriors, Unit, fit_prior
from fwbench.measure.rounds import blocks_by_round, paired_log_ratios, ratio_unit, time_estimate, time_unit
from fwbench.store.records import CellInterval, ResultRecord

RunMachine = tuple[int, str | None, str | None]  # (run_id, hardware_id, hostname): the cells one prior is fitted over


def measured_together(numerator: ResultRecord, denominator: ResultRecord) -> bool:
    """Both rows interleaved in the same run and comparison group: their blocks pair by (round, cycle)."""
    return (
        numerator.run_id == denominator.run_id
        and numerator.schedule == denominator.schedule == "interleaved"
        and numerator.group_key is not None
        and numerator.group_key == denominator.group_key
    )


def pair_log_time(first: ResultRecord, second: ResultRecord) -> float | None:
    """The covariate of a pair: the mean log seconds per call of its two cells; None without both times."""
    if not first.median_s or not second.median_s or first.median_s <= 0 or second.median_s <= 0:
        return None
    return (math.log(first.median_s) + math.log(second.median_s)) / 2


def _timed(row: ResultRecord) -> bool:
    """An ``ok`` cell with blocks that all hold calls and a finite time, and a finite positive time estimate."""
    return (
        row.status == "ok"
        and bool(row.blocks)
        and all(block.calls > 0 and math.isfinite(block.seconds) and block.seconds >= 0 for block in row.blocks)
        and row.median_s is not None
        and math.isfinite(row.median_s)
        and row.median_s > 0
    )


def _time_units(rows: Sequence[ResultRecord]) -> list[Unit]:
    return [
        unit
        for row in rows
        if _timed(row) and (unit := time_unit(blocks_by_round(row.blocks), (row.runtime,))) is not None
    ]


def _pair_units(rows: Sequence[ResultRecord]) -> list[Unit]:
    """A unit per two cells measured together: pairs are only ever within one comparison group."""
    groups: dict[str, list[ResultRecord]] = {}
    for row in rows:
        if _timed(row) and row.schedule == "interleaved" and row.group_key is not None:
            groups.setdefault(row.group_key, []).append(row)
    units = []
    for cells in groups.values():
        for first, second in itertools.combinations(cells, 2):
            log_time = pair_log_time(first, second)
            ratios = paired_log_ratios(first.blocks, second.blocks) if log_time is not None else []
            unit = ratio_unit(ratios, log_time, (first.runtime, second.runtime)) if ratios and log_time else None
            if unit is not None:
                units.append(unit)
    return units


def run_priors(rows: Sequence[ResultRecord]) -> dict[RunMachine, RunPriors]:
    """The priors of each (run, machine) among ``rows`` (all the cells of each run)."""
    by_machine: dict[RunMachine, list[ResultRecord]] = {}
    for row in rows:
        by_machine.setdefault((row.run_id, row.hardware_id, row.hostname), []).append(row)
    return {
        key: RunPriors(fit_prior(_time_units(cells)), fit_prior(_pair_units(cells)))
        for key, cells in by_machine.items()
    }


def moderate(rows: Sequence[ResultRecord]) -> list[ResultRecord]:
    """``rows`` (whole runs) with their priors attached and each timed cell's interval moderated."""
    priors = run_priors(rows)
    out = []
    for row in rows:
        found = priors[(row.run_id, row.hardware_id, row.hostname)]
        row = dataclasses.replace(row, priors=found)
        if _timed(row) and row.ci_low_s is not None and row.ci_high_s is not None:
            estimate = time_estimate(blocks_by_round(row.blocks), found.times, (row.runtime,))
            if estimate is not None and estimate.ci_low is not None and estimate.ci_high is not None:
                row = dataclasses.replace(
                    row,
                    ci_low_s=estimate.ci_low,
                    ci_high_s=estimate.ci_high,
                    interval=CellInterval(row.ci_low_s, row.ci_high_s, estimate.dof, estimate.moderated),
                )
        out.append(row)
    return out
