"""tests/conftest.py's ``require``: a test of an optional framework is skipped where the framework is not installed,
and fails where it is installed but does not import (``pytest.importorskip`` would skip it)."""

from __future__ import annotations

import colorsys
import os.path
import sys
from pathlib import Path

import pytest

from conftest import NEED_EXTRAS_ENV, require


def test_a_package_that_is_not_installed_skips(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NEED_EXTRAS_ENV, raising=False)  # a user's pytest with some extras left out
    with pytest.raises(pytest.skip.Exception, match="fwbench_no_such_package is not installed"):
        require("fwbench_no_such_package")
    with pytest.raises(pytest.skip.Exception, match="not installed"):
        require("fwbench_no_such_package.submodule")
    monkeypatch.setitem(sys.modules, "colorsys", None)  # how a test hides an installed package
    with pytest.raises(pytest.skip.Exception, match="colorsys is not installed"):
        require("colorsys")


def test_under_make_test_a_package_that_is_not_installed_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NEED_EXTRAS_ENV, "all")  # make test installed every extra
    with pytest.raises(pytest.fail.Exception, match="fwbench_no_such_package is not installed, but"):
        require("fwbench_no_such_package")


def test_an_installed_package_that_does_not_import_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "fwbench_broken_package"
    package.mkdir()
    (package / "__init__.py").write_text('raise ImportError("libbroken.so: cannot open shared object file")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(pytest.fail.Exception, match="fwbench_broken_package is installed but does not import: "):
        require("fwbench_broken_package")
    with pytest.raises(pytest.fail.Exception, match="ImportError: libbroken.so: cannot open shared object file"):
        require("fwbench_broken_package.submodule")
    with pytest.raises(pytest.fail.Exception, match="ModuleNotFoundError"):  # a module its package lacks
        require("os.fwbench_no_such_module")


def test_an_installed_package_is_imported_and_returned() -> None:
    assert require("colorsys") is colorsys
    assert require("os.path") is os.path
