"""From user choices (flags, a settings file, a suite file) to a :class:`~fwbench.spec.Plan`.

Every name and number is validated here, before anything runs or is written. Precedence, highest first:
command-line flags > the ``--config`` settings file > the suite (its ``[settings]``; each grid's own phase,
dtype and device, then the suite's) > the defaults. A grid flag (``--batch-sizes``) or a cell-setting flag
(``--phase``, ``--dtype``, ``--device``) replaces that value in every grid of the suite.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fwbench.datasets.folders import DatasetError, default_folder, default_name, image_dataset
from fwbench.frameworks import RuntimeInfo, distributed_runtimes, get_runtime
from fwbench.frameworks import runtimes as registered_runtimes
from fwbench.measure import environment
from fwbench.models import get_model
from fwbench.models.weights_io import load_weights
from fwbench.runner.phases import Phase, check_case, get_phase, phase_names
from fwbench.spec import (
    DTYPES,
    MAX_COUNT,
    SCALINGS,
    Case,
    Plan,
    Settings,
    SkippedCase,
    SpecError,
    node_procs,
    node_threads,
)
from fwbench.suites import CELL_SETTINGS, DEFAULT_SUITE, Grid, Suite, load_settings_file, load_suite

DEFAULT_ROUNDS = 3  # the command line's and the suites' rounds: the fewest that give a CI (Settings' own default is 1)
DATA_BATCH = 32  # --phase data without --batch-sizes: a training batch, not the one-sample default
DEFAULT_SEQ_LEN = 128  # --models without --seq-lens: the sequence length models with a sequence axis run at


def parse_positive_ints(option: str, text: str) -> list[int]:
    """``"1,2,4"`` → [1, 2, 4]; SpecError naming ``option`` for anything else (``0``, ``1,,2``, ``1.5``...)."""
    values: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not (part.isascii() and part.isdigit()) or not 0 < int(part) <= MAX_COUNT:
            raise SpecError(
                f"{option} {text!r}: every value must be a positive integer up to {MAX_COUNT}, "
                "comma-separated (e.g. 1,2,4)"
            )
        values.append(int(part))
    return values


def parse_worker_counts(option: str, text: str) -> list[int]:
    """``"0,1,2"`` → [0, 1, 2]: loader worker counts (0: the loader's own process); SpecError for anything else."""
    values: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not (part.isascii() and part.isdigit()) or int(part) > MAX_COUNT:
            raise SpecError(
                f"{option} {text!r}: every value must be an integer from 0 to {MAX_COUNT}, comma-separated (e.g. 0,1,2)"
            )
        values.append(int(part))
    return values


def parse_names(option: str, text: str) -> list[str]:
    """``"a,b"`` → ["a", "b"]; SpecError on empty items."""
    names = [part.strip() for part in text.split(",")]
    if not all(names):
        raise SpecError(f"{option} {text!r}: expected comma-separated names with no empty item")
    return names


def _unique(items: Iterable[Any]) -> list[Any]:
    return list(dict.fromkeys(items))


def build_plan(
    models: Sequence[str],
    runtimes: Sequence[str],
    batch_sizes: Sequence[int],
    seq_lens: Sequence[int],
    settings: Settings,
    phase: str = "inference",
    dtype: str = "fp32",
    device: str = "cpu",
    suite: str | None = None,
) -> Plan:
    """The grid models × runtimes × batch sizes × sequence lengths, in that nesting order.

    Models without a sequence axis get one cell per batch size (seq_len None). Cells longer than a
    model's maximum are kept as skipped, with the reason; a plan with no runnable cell is an error.
    """
    grid = Grid(list(models), list(runtimes), list(batch_sizes), list(seq_lens), phase, dtype, device)
    return build_grids_plan([grid], settings, suite=suite)


def build_grids_plan(
    grids: Sequence[Grid],
    settings: Settings,
    phase: str = CELL_SETTINGS["phase"],
    dtype: str = CELL_SETTINGS["dtype"],
    device: str = CELL_SETTINGS["device"],
    suite: str | None = None,
) -> Plan:
    """The union of several grids' cells (see :func:`build_plan`), each cell once, in grid order. Each grid's own
    phase, dtype and device, where it sets one, beat ``phase``, ``dtype`` and ``device``."""
    cases: dict[str, Case] = {}
    skipped: dict[str, SkippedCase] = {}
    for grid in grids:
        grid = grid.with_defaults(phase=phase, dtype=dtype, device=device)
        for case, reason in _grid_cells(grid, settings):
            if reason is None:
                cases.setdefault(case.key, case)
            else:
                skipped.setdefault(case.key, SkippedCase(case, reason))
    if not cases:
        reasons = "; ".join(_unique(s.reason for s in skipped.values()))
        raise SpecError(f"the plan has no runnable cell: {reasons}")
    return Plan(tuple(cases.values()), settings, tuple(skipped.values()), suite)


def _check_cell_settings(grid: Grid, settings: Settings) -> None:
    """Refuse a phase or dtype the workers cannot run, the pair together, or (phase fit) a batch size that
    does not divide the fit samples."""
    if grid.phase not in phase_names():
        raise SpecError(f"phase {grid.phase!r} cannot be run yet; runnable: {', '.join(phase_names())}")
    if grid.dtype not in DTYPES:
        raise SpecError(f"dtype {grid.dtype!r} cannot be run yet; runnable: {', '.join(DTYPES)}")
    phase, dtype = get_phase(str(grid.phase)), str(grid.dtype)
    if phase.dtype_unsupported(dtype):
        raise SpecError(
            f"phase {phase.name} with dtype {dtype!r} cannot be run yet; phase {phase.name} dtypes: "
            f"{', '.join(phase.dtypes)}"
        )
    if grid.workers and phase.uses_model:
        loaders = ", ".join(phase_names(lambda p: not p.uses_model))
        raise SpecError(f"--workers (loader worker processes) is for phase {loaders}, not phase {phase.name}")
    for scaling in grid.scaling:
        if scaling not in SCALINGS:
            raise SpecError(f"unknown scaling {scaling!r}; allowed: {', '.join(SCALINGS)}")
    if grid.scaling and not grid.procs:
        raise SpecError("--scaling is for data-parallel cells: give --procs too")
    phase.check_grid(list(grid.batch_sizes), settings)


def _grid_cells(grid: Grid, settings: Settings) -> Iterator[tuple[Case, str | None]]:
    """Every cell of one grid (its cell settings filled in) with the reason it cannot run (None when it can):
    a sequence too long for the model, a phase the runtime or the model does not implement, or a dtype the
    runtime does not compute in (its registry record)."""
    try:
        _check_cell_settings(grid, settings)
    except SpecError as exc:
        raise SpecError(f"{grid.where}: {exc}" if grid.where else str(exc)) from None
    phase, dtype = get_phase(str(grid.phase)), str(grid.dtype)
    for name in grid.runtimes:
        get_runtime(name)
    if not grid.models or not grid.runtimes or not grid.batch_sizes:
        raise SpecError("a plan needs at least one model, one runtime and one batch size")
    if not phase.uses_model:
        for case in _loader_cells(grid):
            check_case(case, settings)
            yield case, phase.runtime_refusal(get_runtime(case.runtime), dtype, settings)
        return
    for name in grid.models:
        get_model(name)
    _check_distributed(grid)
    for model_name, runtime, batch in itertools.product(
        _unique(grid.models), _unique(grid.runtimes), _unique(grid.batch_sizes)
    ):
        yield from _combination_cells(grid, settings, phase, model_name, runtime, batch)


def _combination_cells(
    grid: Grid, settings: Settings, phase: Phase, model_name: str, runtime: str, batch: int
) -> Iterator[tuple[Case, str | None]]:
    """The cells of one model, runtime and batch size of a grid (:func:`_grid_cells`), one per sequence length and
    process count, each with the reason it cannot run (None when it can)."""
    dtype = str(grid.dtype)
    model = get_model(model_name)
    info = get_runtime(runtime)
    if info.unavailable:
        raise SpecError(f"runtime {runtime} is not available: {info.unavailable}")
    unsupported = (
        phase.runtime_refusal(info, dtype, settings)
        or phase.unsupported(model, info, settings)
        or schedule_refusal(info, phase, settings)
    )
    lengths: list[int | None] = _unique(grid.seq_lens) if model.has_sequence else [None]
    if model.has_sequence and not lengths:
        raise SpecError(f"model {model_name} needs at least one sequence length (--seq-lens)")
    several = bool(info.distributed) or bool(grid.procs and _skipped_under_procs(grid, info))
    if several and not info.distributed:
        unsupported = unsupported or info.procs_unsupported
    for seq_len, (procs, scaling) in itertools.product(lengths, _process_counts(grid, several)):
        case = Case(
            model_name, runtime, grid.phase, batch, seq_len, grid.dtype, grid.device,  # type: ignore[arg-type]
            procs=procs, scaling=scaling,  # type: ignore[arg-type]
        )  # fmt: skip
        check_case(case, settings)
        if procs is not None:
            _check_processes_fit(case, settings)
        yield case, unsupported or model.supports_seq_len(seq_len)


def _check_distributed(grid: Grid) -> None:
    """Refuse --procs with a runtime of one process, and a data-parallel runtime without --procs."""
    single = [
        name
        for name in _unique(grid.runtimes)
        if not get_runtime(name).distributed and not _skipped_under_procs(grid, get_runtime(name))
    ]
    several = [name for name in _unique(grid.runtimes) if get_runtime(name).distributed]
    if grid.procs and single:
        raise SpecError(
            f"--procs runs the data-parallel runtimes ({', '.join(distributed_runtimes())}); "
            f"{', '.join(single)} runs as one process"
        )
    if several and not grid.procs:
        raise SpecError(
            f"{', '.join(several)} runs as several processes: give --procs (e.g. fwbench run --phase training "
            "--procs 1,2)"
        )


def _skipped_under_procs(grid: Grid, info: RuntimeInfo) -> bool:
    """Whether ``info``'s runtime, of one process, has its --procs cells stored as skipped (with
    ``RuntimeInfo.procs_unsupported``: a fit loop users would run as several processes) rather than refused."""
    return bool(info.procs_unsupported) and grid.phase == "fit"


def _process_counts(grid: Grid, distributed: bool) -> list[tuple[int | None, str | None]]:
    """(process count, scaling) of each cell of a runtime: every --procs × --scaling (default weak) for a
    data-parallel runtime, (None, None) for one of one process."""
    if not distributed:
        return [(None, None)]
    return list(itertools.product(_unique(grid.procs), _unique(grid.scaling or ["weak"])))


def _check_processes_fit(case: Case, settings: Settings) -> None:
    """Refuse a distributed cell whose processes' threads (each on cores of its own) exceed the CPUs this process
    may use, or whose thread budget its processes do not divide."""
    usable = len(os.sched_getaffinity(0))
    here = node_procs(case, settings)
    total = node_threads(case, settings)
    if total > usable:
        where = "" if here == case.procs else f" ({here} on each of --nnodes {settings.nodes} machines)"
        raise SpecError(
            f"--procs {case.procs}{where} with {total // here} thread(s) each needs {total} CPUs; "
            f"this process may use {usable}"
        )


def _loader_cells(grid: Grid) -> Iterator[Case]:
    """The cells of a loader phase's grid (phase data): dataset (its ``models``, filled in by
    :func:`with_dataset`) × loader runtimes × batch sizes × worker counts (default: 0, the loader's own process)."""
    for model_name, runtime, batch, workers in itertools.product(
        _unique(grid.models), _unique(grid.runtimes), _unique(grid.batch_sizes), _unique(grid.workers or [0])
    ):
        yield Case(model_name, runtime, grid.phase, batch, None, grid.dtype, grid.device, workers)  # type: ignore[arg-type]


def dataset_of(settings: Settings) -> tuple[Path, str]:
    """The folder phase data reads and its dataset's name: ``data_input`` (checked: a folder ``fwbench data make
    images`` wrote) or, when unset, the default dataset's cache folder (written before the run when missing)."""
    if settings.data_input is None:
        return default_folder(), default_name()
    folder = Path(settings.data_input).expanduser().resolve()
    try:
        return folder, image_dataset(folder).name
    except DatasetError as exc:
        raise SpecError(str(exc)) from None


def with_dataset(grids: Sequence[Grid], settings: Settings) -> tuple[list[Grid], Settings]:
    """Phase data grids get the run's dataset as their model (a grid naming another dataset is refused) and the
    settings its absolute folder, which phase fit grids read too with ``fit_source`` input; other grids and
    settings are returned as they are."""
    reads_images = settings.fit_source == "input" and any(grid.phase == "fit" for grid in grids)
    if not reads_images and not any(grid.phase == "data" for grid in grids):
        return list(grids), settings
    folder, name = dataset_of(settings)
    out = []
    for grid in grids:
        if grid.phase == "data":
            others = [model for model in grid.models if model != name]
            if others:
                raise SpecError(
                    f"{grid.where + ': ' if grid.where else ''}phase data reads one dataset, {name} ({folder}); "
                    f"the grid names {', '.join(others)} (leave the models out, or give the dataset with --input)"
                )
            grid = dataclasses.replace(grid, models=[name])
        out.append(grid)
    return out, dataclasses.replace(settings, data_input=str(folder))


# -- precedence: flags > settings file > suite > defaults -----------------------------------------------------
@dataclass(frozen=True)
class PlanChoices:
    """What the command line chose for a run; None (or absent from ``settings``) means not given, so the
    ``--config`` file, the suite or the default decides. Axis values are the flags' comma-separated text."""

    suite: str | None = None  # a built-in suite name or a .toml path
    config: Path | None = None  # a settings file: one [settings] table
    models: str | None = None
    runtimes: str | None = None
    batch_sizes: str | None = None
    seq_lens: str | None = None
    workers: str | None = None
    procs: str | None = None
    scaling: str | None = None
    phase: str | None = None
    dtype: str | None = None
    device: str | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)  # Settings field name -> value, from flags


def schedule_refusal(info: RuntimeInfo, phase: Phase, settings: Settings) -> str | None:
    """Why ``info``'s cells cannot be timed as ``settings`` schedule them (None when they can): a worker in another
    language (``RuntimeInfo.external``) times the manager's interleaved blocks only; the stopping rule of one cell
    after another (``--interleave off``) is scipy's, in the Python worker."""
    if info.external and not (settings.interleave and phase.interleaves(settings)):
        return f"{info.name} is timed in interleaved rounds only (its worker is not Python: --interleave off has no stopping rule there)"
    return None


def resolve_plan(choices: PlanChoices) -> Plan:
    """The plan of ``choices``: flags > settings file > suite > defaults. Without --models and --runtimes
    the default suite runs; SpecError on any invalid choice (nothing has been written)."""
    # --phase data: the dataset is the model, and the loaders are the runtimes unless --runtimes names some
    data_flags = choices.phase == "data" and choices.suite is None and choices.models is None
    if choices.suite is None and (choices.models is None) != (choices.runtimes is None) and not data_flags:
        raise SpecError("give both --models and --runtimes, or a --suite (--phase data: --runtimes or none)")
    use_suite = choices.suite is not None or (choices.models is None and not data_flags)
    suite = load_suite(DEFAULT_SUITE if choices.suite is None else choices.suite) if use_suite else None
    cores = environment.physical_core_count()
    # a phase sets its cells' default budget (serving leaves the load generator a core); an unknown name is refused
    # below, where the grid is checked
    threads = get_phase(choices.phase).default_threads(cores) if choices.phase in phase_names() else cores
    settings_data: dict[str, Any] = {"threads": threads, "rounds": DEFAULT_ROUNDS}
    if suite is not None:
        settings_data.update(suite.settings)
    if choices.config is not None:
        settings_data.update(load_settings_file(choices.config))
    settings_data.update(choices.settings)
    if "data_input" in choices.settings and "fit_source" not in choices.settings:  # --input: fit reads it too
        settings_data["fit_source"] = "input"
    settings = Settings.from_dict(settings_data)
    check_threads_fit(settings)
    flag_grid = Grid(
        models=parse_names("--models", choices.models) if choices.models is not None else [],
        runtimes=parse_names("--runtimes", choices.runtimes)
        if choices.runtimes is not None
        else [name for name, info in registered_runtimes().items() if "data" in info.phases and data_flags],
        batch_sizes=parse_positive_ints("--batch-sizes", choices.batch_sizes)
        if choices.batch_sizes is not None
        else [DATA_BATCH if data_flags else 1],
        seq_lens=parse_positive_ints("--seq-lens", choices.seq_lens)
        if choices.seq_lens is not None
        else [DEFAULT_SEQ_LEN],
        workers=parse_worker_counts("--workers", choices.workers) if choices.workers is not None else [],
        procs=parse_positive_ints("--procs", choices.procs) if choices.procs is not None else [],
        scaling=parse_names("--scaling", choices.scaling) if choices.scaling is not None else [],
    )
    # A flag replaces its axis, or its cell setting, in every grid of the suite.
    grids = (
        [flag_grid]
        if suite is None
        else [
            dataclasses.replace(
                grid,
                models=flag_grid.models if choices.models is not None else grid.models,
                runtimes=flag_grid.runtimes if choices.runtimes is not None else grid.runtimes,
                batch_sizes=flag_grid.batch_sizes if choices.batch_sizes is not None else grid.batch_sizes,
                seq_lens=flag_grid.seq_lens if choices.seq_lens is not None else grid.seq_lens,
                procs=flag_grid.procs if choices.procs is not None else grid.procs,
                scaling=flag_grid.scaling if choices.scaling is not None else grid.scaling,
            )
            for grid in suite.grids
        ]
    )
    overrides = {"phase": choices.phase, "dtype": choices.dtype, "device": choices.device}
    grids = [grid.with_overrides(**overrides).with_defaults(**CELL_SETTINGS) for grid in grids]
    if suite is not None and choices.workers is not None:  # --workers replaces the phase data grids' axis only
        if not any(grid.phase == "data" for grid in grids):
            raise SpecError(
                f"--workers (loader worker processes) is for phase data; suite {suite.name} has no data grid"
            )
        grids = [dataclasses.replace(g, workers=flag_grid.workers) if g.phase == "data" else g for g in grids]
    grids, settings = with_dataset(grids, settings)
    plan = build_grids_plan(grids, settings, suite=suite.name if suite else None)
    if settings.weights_path is not None:
        check_weights_file(plan, settings.weights_path)
    return plan


def suite_plan(suite: Suite, threads: int) -> Plan:
    """The plan a suite runs with its own settings and ``threads`` threads (no flags)."""
    settings = Settings.from_dict({"threads": threads, "rounds": DEFAULT_ROUNDS, **suite.settings})
    grids = [grid.with_defaults(phase=suite.phase, dtype=suite.dtype, device=suite.device) for grid in suite.grids]
    grids, settings = with_dataset(grids, settings)
    return build_grids_plan(grids, settings, suite.phase, suite.dtype, suite.device, suite.name)


def check_plan_fits(plan: Plan) -> None:
    """Refuse a stored plan (``--resume``) whose thread budget or distributed cells need more CPUs than this process
    may use."""
    check_threads_fit(plan.settings)
    for case in plan.cases:
        if case.procs is not None:
            _check_processes_fit(case, plan.settings)


def check_threads_fit(settings: Settings) -> None:
    """Refuse a thread budget larger than the CPUs this process may use (it could not be pinned)."""
    usable = len(os.sched_getaffinity(0))
    if settings.threads > usable:
        raise SpecError(f"--threads {settings.threads} exceeds the {usable} CPUs this process may use")


def check_weights_file(plan: Plan, path: str) -> None:
    """A weights file belongs to one model: refuse it for a plan of several, or if it does not fit."""
    models = sorted({case.model for case in (*plan.cases, *(s.case for s in plan.skipped))})
    if len(models) != 1:
        raise SpecError(f"--weights holds one model's weights; the plan has {len(models)} models ({', '.join(models)})")
    try:
        load_weights(get_model(models[0]), Path(path))
    except ValueError as exc:
        raise SpecError(str(exc)) from None
