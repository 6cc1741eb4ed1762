"""A cell whose runtime has a worker in another language (``RuntimeInfo.external``, e.g. TensorFlow.js in Node.js):
the Python worker writes what that worker reads into a folder of its own (the runtime's ``prepare``: the seeded
weights, the inputs, the float64 reference), then *becomes* it with ``execve``.

So the manager sees one process from start to end, as for every cell: the same pid (its memory high-water mark
restarts with the new program: the preparation's numpy arrays are not counted), the same CPU pinning, process group
and parent-death signal, the result pipe (``--result-fd``) and stdin (the job line was read before: an interleaved
job's commands come only after the worker's ``ready``). The worker speaks the protocol of
:mod:`fwbench.runner.messages`; docs/architecture.md says what it must do.
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from fwbench.runner.messages import Job
from fwbench.runner.tempfolders import WORKER_PREFIX


def hand_over(job: Job, external: str, result_fd: int, cpus: Sequence[int], manager_pid: int) -> NoReturn:
    """Prepare ``job`` for the worker of module ``external`` and exec it on ``cpus`` with the protocol's arguments
    (``--result-fd``, ``--manager-pid``, ``--folder``: what it reads, its to remove). Raises (the folder removed)
    when preparing or starting fails: the Python worker reports that as the cell's error."""
    folder = tempfile.mkdtemp(prefix=f"{WORKER_PREFIX}{os.getpid()}-")
    try:
        command = importlib.import_module(external).prepare(job, Path(folder))
        os.sched_setaffinity(0, cpus)  # a worker started beside others: the new program starts on the cell's CPUs
        os.set_inheritable(result_fd, True)
        sys.stdout.flush()
        sys.stderr.flush()
        arguments = ["--result-fd", str(result_fd), "--manager-pid", str(manager_pid), "--folder", folder]
        os.execv(command[0], [*command, *arguments])
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
