"""Shared fixtures: a temp database, the test plugin's environment, framework caches in a temp dir."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

TESTS_DIR = Path(__file__).resolve().parent
REPO_DIR = TESTS_DIR.parent


@pytest.fixture(scope="session", autouse=True)
def _framework_caches(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Keep inductor, XLA and Keras caches out of the home folder (workers inherit this)."""
    cache = tmp_path_factory.mktemp("framework-cache")
    saved = dict(os.environ)
    os.environ.update(
        TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"), KERAS_HOME=str(cache / "keras"),
        XDG_CACHE_HOME=str(cache / "xdg"), TF_CPP_MIN_LOG_LEVEL="1",
    )
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def plugin_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Load the test-only fake runtimes here and in every worker."""
    path = os.pathsep.join(filter(None, [str(TESTS_DIR), str(REPO_DIR), os.environ.get("PYTHONPATH")]))
    monkeypatch.setenv("PYTHONPATH", path)
    monkeypatch.setenv("FWBENCH_PLUGINS", "fwbench_test_plugin")
    monkeypatch.syspath_prepend(str(TESTS_DIR))
    import fwbench.frameworks as registry

    monkeypatch.setattr(registry, "_plugins_loaded", False)
    registry.load_plugins()
    return dict(os.environ)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "results" / "fwbench.db"


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m fwbench ARGS`` in a subprocess, as a user would run it."""
    return subprocess.run(
        [sys.executable, "-m", "fwbench", *args], capture_output=True, text=True, env=env, timeout=timeout,
        cwd=REPO_DIR,
    )
