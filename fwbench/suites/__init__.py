"""Suites: named sweeps kept as TOML files in this package, or any ``.toml`` path a user gives.

A suite file holds ``description``, ``models``, ``runtimes``, ``batch_sizes``, optional
``seq_lens``, ``phase``, ``dtype``, ``device``, and an optional ``[settings]`` table whose keys are
:class:`fwbench.spec.Settings` fields (command-line flags override them).
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from fwbench.spec import Settings, SpecError

DEFAULT_SUITE = "default"
_KEYS = {"description", "models", "runtimes", "batch_sizes", "seq_lens", "phase", "dtype", "device", "settings"}
_SETTINGS_KEYS = {f.name for f in dataclasses.fields(Settings)}


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    models: list[str]
    runtimes: list[str]
    batch_sizes: list[int]
    seq_lens: list[int] = field(default_factory=list)
    phase: str = "inference"
    dtype: str = "fp32"
    device: str = "cpu"
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def size(self) -> int:
        """Upper bound on the cell count (models without a sequence axis have fewer)."""
        return len(self.models) * len(self.runtimes) * len(self.batch_sizes) * max(1, len(self.seq_lens))


def builtin_suites() -> list[str]:
    """Names of the suites shipped in the package."""
    return sorted(p.name[:-5] for p in resources.files(__name__).iterdir() if p.name.endswith(".toml"))


def _list_of(name: str, value: Any, kind: type, where: str) -> list:
    if not isinstance(value, list) or not all(isinstance(v, kind) and not isinstance(v, bool) for v in value):
        raise SpecError(f"suite {where}: {name} must be a list of {kind.__name__} values")
    if kind is int and any(v <= 0 for v in value):
        raise SpecError(f"suite {where}: {name} must hold positive integers")
    return value


def parse_suite(name: str, text: str, where: str) -> Suite:
    """Validate a suite's TOML text; SpecError naming ``where`` on any problem."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"suite {where}: not valid TOML: {exc}") from None
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise SpecError(f"suite {where}: unknown keys {unknown}; allowed: {sorted(_KEYS)}")
    missing = sorted({"models", "runtimes", "batch_sizes"} - set(data))
    if missing:
        raise SpecError(f"suite {where}: missing keys {missing}")
    settings = data.get("settings", {})
    if not isinstance(settings, dict) or set(settings) - _SETTINGS_KEYS:
        raise SpecError(f"suite {where}: [settings] keys must be among {sorted(_SETTINGS_KEYS)}")
    for key in ("description", "phase", "dtype", "device"):
        if key in data and not isinstance(data[key], str):
            raise SpecError(f"suite {where}: {key} must be a string")
    return Suite(
        name=name,
        description=data.get("description", ""),
        models=_list_of("models", data["models"], str, where),
        runtimes=_list_of("runtimes", data["runtimes"], str, where),
        batch_sizes=_list_of("batch_sizes", data["batch_sizes"], int, where),
        seq_lens=_list_of("seq_lens", data.get("seq_lens", []), int, where),
        phase=data.get("phase", "inference"),
        dtype=data.get("dtype", "fp32"),
        device=data.get("device", "cpu"),
        settings=settings,
    )


def load_suite(name_or_path: str) -> Suite:
    """A built-in suite by name, or a suite file by path (anything ending in .toml)."""
    if name_or_path.endswith(".toml"):
        path = Path(name_or_path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise SpecError(f"cannot read suite file {path}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise SpecError(f"suite {path}: not UTF-8 text") from None
        return parse_suite(path.stem, text, str(path))
    if name_or_path not in builtin_suites():
        raise SpecError(
            f"unknown suite {name_or_path!r}; allowed: {', '.join(builtin_suites())} or a path to a .toml file"
        )
    text = resources.files(__name__).joinpath(f"{name_or_path}.toml").read_text()
    return parse_suite(name_or_path, text, name_or_path)
