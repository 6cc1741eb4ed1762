"""Suites: named sweeps kept as TOML files in this package, or any ``.toml`` path a user gives.

A suite file holds ``description``; the cell settings ``phase``, ``dtype`` and ``device`` (every grid's
default); an optional ``[settings]`` table whose keys are :class:`fwbench.spec.Settings` fields (a
``--config`` file and command-line flags override them); and one or more grids: ``models``, ``runtimes``,
``batch_sizes`` and optional ``seq_lens`` at the top level, and/or ``[[grid]]`` tables with the same four
keys plus any cell setting of their own (``phase = "training"``, ``dtype = "bf16"``), so that one suite holds
inference and training rows, fp32 and bf16 rows. The suite's plan is the union of its grids' cells, in order.
A ``--phase``/``--dtype``/``--device`` flag overrides the suite's value and every grid's own.

A settings file (``fwbench run --config FILE``) is TOML with the same ``[settings]`` table only.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from fwbench.frameworks import get_runtime  # the registry: no framework is imported
from fwbench.models import get_model
from fwbench.spec import Settings, SpecError

DEFAULT_SUITE = "quick"
# The settings of a cell that a suite sets for all its grids and a [[grid]] may set for its own cells, with
# their defaults. A later grid axis (procs, workers) is one more entry here and one more field of Grid.
CELL_SETTINGS: dict[str, str] = {"phase": "inference", "dtype": "fp32", "device": "cpu"}
_AXIS_KEYS = {"models", "runtimes", "batch_sizes", "seq_lens", "workers", "procs", "scaling"}
_GRID_KEYS = {*_AXIS_KEYS, *CELL_SETTINGS}
_KEYS = {"description", "settings", "grid", *_GRID_KEYS}
_SETTINGS_KEYS = {f.name for f in dataclasses.fields(Settings)}


@dataclass(frozen=True)
class Grid:
    """models × runtimes × batch sizes × sequence lengths (ignored by models without a sequence axis), and the
    grid's own cell settings (None: the suite's, or the planner's default). Phase data: × loader worker counts
    (``workers``), and ``models`` is the dataset's name (empty: the one the run reads). Data-parallel runtimes:
    × process counts (``procs``) × scalings (``scaling``: weak, strong; default weak)."""

    models: list[str]
    runtimes: list[str]
    batch_sizes: list[int]
    seq_lens: list[int] = field(default_factory=list)
    phase: str | None = None
    dtype: str | None = None
    device: str | None = None
    workers: list[int] = field(default_factory=list)  # phase data only
    procs: list[int] = field(default_factory=list)  # data-parallel runtimes only
    scaling: list[str] = field(default_factory=list)  # data-parallel runtimes only (empty: weak)
    where: str = field(default="", compare=False)  # where the grid was written, for errors: "suite x.toml [[grid]] 2"

    def with_defaults(self, **defaults: str | None) -> Grid:
        """This grid with each cell setting it leaves unset (None) taken from ``defaults`` (CELL_SETTINGS keys)."""
        return self._with_cell_settings({key: value for key, value in defaults.items() if getattr(self, key) is None})

    def with_overrides(self, **overrides: str | None) -> Grid:
        """This grid with each cell setting given in ``overrides`` (not None) replaced, e.g. by a flag."""
        return self._with_cell_settings({key: value for key, value in overrides.items() if value is not None})

    def _with_cell_settings(self, changes: dict[str, Any]) -> Grid:
        unknown = sorted(set(changes) - set(CELL_SETTINGS))
        if unknown:
            raise ValueError(f"not cell settings: {unknown}")
        return dataclasses.replace(self, **changes)

    @property
    def size(self) -> int:
        """Upper bound on the cell count (models without a sequence axis have fewer)."""
        models = len(self.models) if self.models or self.phase != "data" else 1  # data: the run's dataset
        procs = max(1, len(self.procs)) * max(1, len(self.scaling))
        return (
            models * len(self.runtimes) * len(self.batch_sizes) * max(1, len(self.seq_lens), len(self.workers)) * procs
        )


@dataclass(frozen=True)
class Suite:
    """A named sweep: its grids (each cell setting filled in: the grid's own or the suite's) and its settings."""

    name: str
    description: str
    grids: list[Grid]
    phase: str = CELL_SETTINGS["phase"]
    dtype: str = CELL_SETTINGS["dtype"]
    device: str = CELL_SETTINGS["device"]
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def size(self) -> int:
        """Upper bound on the cell count (grids may share cells; models without a sequence axis have fewer)."""
        return sum(grid.size for grid in self.grids)


def builtin_suites() -> list[str]:
    """Names of the suites shipped in the package."""
    return sorted(p.name[:-5] for p in resources.files(__name__).iterdir() if p.name.endswith(".toml"))


def _list_of(name: str, value: Any, kind: type, where: str) -> list[Any]:
    if not isinstance(value, list) or not all(isinstance(v, kind) and not isinstance(v, bool) for v in value):
        raise SpecError(f"suite {where}: {name} must be a list of {kind.__name__} values")
    if kind is int and any(v < 0 if name == "workers" else v <= 0 for v in value):
        raise SpecError(
            f"suite {where}: {name} must hold {'non-negative' if name == 'workers' else 'positive'} integers"
        )
    return value


def _cell_settings(data: dict[str, Any], where: str) -> dict[str, str]:
    """The cell settings (CELL_SETTINGS keys) that ``data`` gives, each checked to be a string."""
    for key in CELL_SETTINGS:
        if key in data and not isinstance(data[key], str):
            raise SpecError(f"suite {where}: {key} must be a string")
    return {key: data[key] for key in CELL_SETTINGS if key in data}


def _grid(data: dict[str, Any], where: str, defaults: dict[str, str]) -> Grid:
    """One grid from its table (or the suite's top level); cell settings it does not give come from ``defaults``."""
    phase = data.get("phase", defaults.get("phase"))
    missing = sorted({"models", "runtimes", "batch_sizes"} - set(data) - ({"models"} if phase == "data" else set()))
    if missing:
        raise SpecError(f"suite {where}: missing keys {missing}")
    grid = (
        Grid(
            models=_list_of("models", data.get("models", []), str, where),
            runtimes=_list_of("runtimes", data["runtimes"], str, where),
            batch_sizes=_list_of("batch_sizes", data["batch_sizes"], int, where),
            seq_lens=_list_of("seq_lens", data.get("seq_lens", []), int, where),
            workers=_list_of("workers", data.get("workers", []), int, where),
            procs=_list_of("procs", data.get("procs", []), int, where),
            scaling=_list_of("scaling", data.get("scaling", []), str, where),
            where=f"suite {where}",
        )
        .with_overrides(**defaults)
        .with_overrides(**_cell_settings(data, where))
    )
    try:
        for model in grid.models if grid.phase != "data" else ():  # phase data: a dataset's name
            get_model(model)
        for runtime in grid.runtimes:
            get_runtime(runtime)
    except SpecError as exc:
        raise SpecError(f"suite {where}: {exc}") from None
    return grid


def _load_toml(text: str, where: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{where}: not valid TOML: {exc}") from None


def _settings_table(data: dict[str, Any], where: str) -> dict[str, Any]:
    settings = data.get("settings", {})
    if not isinstance(settings, dict):
        raise SpecError(f"{where}: [settings] must be a table")
    unknown = sorted(set(settings) - _SETTINGS_KEYS)
    if unknown:
        raise SpecError(f"{where}: unknown [settings] keys {unknown}; allowed: {sorted(_SETTINGS_KEYS)}")
    return settings


def parse_suite(name: str, text: str, where: str) -> Suite:
    """Validate a suite's TOML text; SpecError naming ``where`` on any problem."""
    data = _load_toml(text, f"suite {where}")
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise SpecError(f"suite {where}: unknown keys {unknown}; allowed: {sorted(_KEYS)}")
    tables = data.get("grid", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise SpecError(f"suite {where}: grid must be an array of tables ([[grid]])")
    if "description" in data and not isinstance(data["description"], str):
        raise SpecError(f"suite {where}: description must be a string")
    defaults = {**CELL_SETTINGS, **_cell_settings(data, where)}
    grids = [_grid(data, where, defaults)] if _AXIS_KEYS & set(data) or not tables else []
    for number, table in enumerate(tables, 1):
        extra = sorted(set(table) - _GRID_KEYS)
        if extra:
            raise SpecError(f"suite {where}: [[grid]] {number}: unknown keys {extra}; allowed: {sorted(_GRID_KEYS)}")
        grids.append(_grid(table, f"{where} [[grid]] {number}", defaults))
    settings = _settings_table(data, f"suite {where}")
    return Suite(
        name=name,
        description=data.get("description", ""),
        grids=grids,
        phase=defaults["phase"],
        dtype=defaults["dtype"],
        device=defaults["device"],
        settings=settings,
    )


def _read_text(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"cannot read {what} {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise SpecError(f"{what} {path}: not UTF-8 text") from None


def load_settings_file(path: Path) -> dict[str, Any]:
    """The ``[settings]`` table of a settings file (``fwbench run --config``); SpecError on anything else."""
    where = f"settings file {path}"
    data = _load_toml(_read_text(path, "settings file"), where)
    unknown = sorted(set(data) - {"settings"})
    if unknown:
        raise SpecError(f"{where}: unknown keys {unknown}; a settings file holds one [settings] table")
    if "settings" not in data:
        raise SpecError(f"{where}: no [settings] table")
    return _settings_table(data, where)


def load_suite(name_or_path: str) -> Suite:
    """A built-in suite by name, or a suite file by path (anything ending in .toml)."""
    if name_or_path.endswith(".toml"):
        path = Path(name_or_path)
        return parse_suite(path.stem, _read_text(path, "suite file"), str(path))
    if name_or_path not in builtin_suites():
        raise SpecError(
            f"unknown suite {name_or_path!r}; allowed: {', '.join(builtin_suites())} or a path to a .toml file"
        )
    text = resources.files(__name__).joinpath(f"{name_or_path}.toml").read_text()
    return parse_suite(name_or_path, text, name_or_path)
