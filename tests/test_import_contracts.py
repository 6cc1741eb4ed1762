"""The import contracts of pyproject.toml ([tool.importlinter], run by `make test` as `lint-imports`) hold, say what
docs/architecture.md says, and fail when broken: a copy of the package with one import against the layers breaks the
named contract."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
CONTRACTS = {contract["id"]: contract for contract in CONFIG["contracts"]}
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` over the ``fwbench`` package and pyproject.toml found in ``root``."""
    env = {**os.environ, "PYTHONPATH": str(root)}  # before the editable install's path
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(root / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def top_level_names() -> set[str]:
    """The package's top-level modules and packages, as the layers contract names them."""
    package = ROOT / "fwbench"
    modules = {path.stem for path in package.glob("*.py") if path.stem != "__init__"}
    return modules | {path.name for path in package.iterdir() if (path / "__init__.py").exists()}


def layer_names(layers: list[str]) -> list[str]:
    return [name.strip() for layer in layers for name in re.split(r"[|:]", layer)]


def test_every_top_level_module_is_placed_and_every_one_but_frameworks_is_kept_framework_free() -> None:
    names = top_level_names()
    assert sorted(layer_names(CONTRACTS["layers"]["layers"])) == sorted(names)
    sources = {source.removeprefix("fwbench.") for source in CONTRACTS["no-framework-outside"]["source_modules"]}
    assert sources == names - {"frameworks"}
    assert all("ignore_imports" not in contract for contract in CONFIG["contracts"])  # no exceptions


def test_the_architecture_table_lists_the_layers_in_the_contracts_order() -> None:
    """docs/architecture.md's layer table: one row per module, top layer first, numbered as the contract's layers."""
    table = (ROOT / "docs" / "architecture.md").read_text().split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+) \| `([a-z_]+)` \|", table, flags=re.MULTILINE)
    documented: dict[int, list[str]] = {}
    for number, name in rows:
        documented.setdefault(int(number), []).append(name)
    expected = [re.split(r"\s*[|:]\s*", layer.strip()) for layer in CONTRACTS["layers"]["layers"]]
    assert [documented[number] for number in sorted(documented)] == expected


@pytest.mark.slow
def test_an_import_against_the_layers_fails_lint_imports_naming_the_contract(tmp_path: Path) -> None:
    shutil.copytree(
        ROOT / "fwbench", tmp_path / "fwbench", ignore=shutil.ignore_patterns("node_modules", "__pycache__")
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    kept = lint_imports(tmp_path)
    assert kept.returncode == 0, kept.stdout[-3000:] + kept.stderr[-3000:]
    cell = tmp_path / "fwbench" / "runner" / "cell.py"
    cell.write_text(cell.read_text() + "\nimport fwbench.report  # noqa: E402\n")
    broken = lint_imports(tmp_path)
    assert broken.returncode != 0
    out = " ".join(broken.stdout.split())  # rich wraps long lines
    assert f"{CONTRACTS['layers']['name']} BROKEN" in out, out[-3000:]
    assert "fwbench.runner.cell -> fwbench.report" in out, out[-3000:]
