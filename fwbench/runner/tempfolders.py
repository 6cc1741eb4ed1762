"""A run's temporary folders (its seeded weights, its groups' export caches: named after the manager's pid; a serving
worker's samples and TorchServe's model store: after the worker's), so that the next run removes the ones a process
killed with SIGKILL could not (:func:`remove_stale`)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from fwbench.measure.processes import running

WEIGHTS_PREFIX = "fwbench-weights-"  # the run's seeded weights (fwbench.runner.manager.SeededWeights)
EXPORTS_PREFIX = "fwbench-exports-"  # a group's exported artefacts (fwbench.runner.manager.export_cache)
SERVING_PREFIX = "fwbench-serving-"  # a serving worker's query samples, answers and TorchServe's model store
EXTERNAL_PREFIX = "fwbench-external-"  # what a worker in another language reads (fwbench.runner.external), by its pid
PREFIXES = (WEIGHTS_PREFIX, EXPORTS_PREFIX, SERVING_PREFIX, EXTERNAL_PREFIX)


def run_folder(prefix: str) -> tempfile.TemporaryDirectory[str]:
    """A new temporary folder ``<prefix><this process's pid>-<random>``, removed with the object."""
    return tempfile.TemporaryDirectory(prefix=f"{prefix}{os.getpid()}-")


def remove_stale(folder: str | None = None) -> list[str]:
    """Remove the run folders in ``folder`` (the temporary folder) whose process is gone: bert-base's weights file
    alone is 440 MB, an engine's export as much. A folder's name carries its process's pid; folders without one are
    left alone. Returns the folders removed."""
    removed = []
    for prefix in PREFIXES:
        for path in Path(folder or tempfile.gettempdir()).glob(f"{prefix}*-*"):
            pid = path.name[len(prefix) :].split("-", 1)[0]
            if pid.isdigit() and not running(int(pid)):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(str(path))
    return removed


def remove_external_folders(pid: int) -> None:
    """Remove what worker ``pid`` was prepared as a worker in another language and left (it was killed: a timeout, a
    memory limit, a crash); nothing when there is none."""
    for path in Path(tempfile.gettempdir()).glob(f"{EXTERNAL_PREFIX}{pid}-*"):
        shutil.rmtree(path, ignore_errors=True)
