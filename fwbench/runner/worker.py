"""The worker: runs one cell in a fresh interpreter (``python -m fwbench.runner.worker``).

It pins itself to the CPUs given by ``--cpus`` before anything heavier than the standard library
is imported (the manager has already put the thread-budget variables in its environment); started beside other
workers with ``--start-cpus``, it imports on those instead and moves every thread to ``--cpus`` once its framework
is imported, before the framework is configured or builds anything. Then it reads a
:class:`~fwbench.messages.Job` on stdin and runs its case's phase (:mod:`fwbench.runner.phases`) on a
:class:`~fwbench.runner.cell.Cell`. It reports stages and one result as JSON lines on the file descriptor
given by ``--result-fd``, and dies with its manager.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import os
import sys

from fwbench.orphans import die_with_manager


def read_line(fd: int) -> str:
    """One line from ``fd``, read a byte at a time: nothing after it is taken from the pipe, so what follows stays
    there for ``sys.stdin`` (an interleaved job's commands) or for the program this process may become
    (fwbench.runner.external)."""
    data = bytearray()
    while not data.endswith(b"\n"):
        byte = os.read(fd, 1)
        if not byte:
            break
        data += byte
    return data.decode()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="fwbench worker: runs one cell (started by the manager).")
    parser.add_argument("--result-fd", type=int, required=True, help="file descriptor for JSON result lines")
    parser.add_argument("--cpus", required=True, help="comma-separated CPUs to pin to, before any import")
    parser.add_argument(
        "--start-cpus",
        help="comma-separated CPUs to start on (interpreter and framework imports) before every thread moves to "
        "--cpus: a worker started beside others, whose start is not a stored result",
    )
    parser.add_argument("--manager-pid", type=int, required=True, help="exit if this is no longer the parent")
    args = parser.parse_args(argv)
    die_with_manager(args.manager_pid)
    cpus = [int(cpu) for cpu in args.cpus.split(",")]
    os.sched_setaffinity(0, [int(cpu) for cpu in args.start_cpus.split(",")] if args.start_cpus else cpus)

    from fwbench.frameworks import get_runtime
    from fwbench.measure import stats
    from fwbench.measure.environment import thread_affinities
    from fwbench.messages import Job, result_message
    from fwbench.runner.cell import Cell  # numpy and friends: only now, inside the affinity
    from fwbench.runner.external import hand_over
    from fwbench.runner.launchers import launcher_for
    from fwbench.runner.phases import get_phase

    stats.load()  # the timer's stopping rule runs inside the timed window: its small sample counts computed now
    job = Job.from_json(read_line(0))  # one line; an interleaved job's commands follow on stdin
    with os.fdopen(args.result_fd, "w") as channel:
        cell = Cell(job, channel, sys.stdin, pin_to=cpus if args.start_cpus else None)
        try:
            external = get_runtime(job.case.runtime).external
            if external:  # a worker in another language: this process becomes it (never returns), or raises
                hand_over(job, external, args.result_fd, cpus, args.manager_pid)
            launcher = cell.launcher = launcher_for(job)
            result = launcher.run(get_phase(job.case.phase), cell)
        except BaseException as exc:  # every failure becomes this cell's status, never a lost sweep
            result = cell.failure(exc)
        result["cpus"] = sorted(os.sched_getaffinity(0))
        result["thread_cpu_lists"] = thread_affinities()  # every thread, BLAS and framework pools included
        channel.write(result_message(result))
        channel.flush()
    if job.case.procs is None:
        del cell  # its backend and the native objects it holds are freed now: an AOTInductor runner removes the
        end_now()  # package it extracted when it is freed
    return 0


def end_now() -> None:
    """Exit soon after the result: the interpreter's teardown (freeing TensorFlow's, torch's and JAX's modules,
    0.3–1.3 s per worker on a 2-core machine) measures nothing and would hold up the next round. What the cell held
    is freed first and the exit handlers run (0.1–0.3 s in all: what the frameworks extracted to temporary folders,
    such as an AOTInductor package, is removed then); helpers the worker leaves (compile pools) are killed with its
    process group by the manager. Not for a distributed rank: JAX's exit handler holds a shutdown barrier its peers
    wait on, and they leave together."""
    gc.collect()  # what the cell held in reference cycles is freed too
    atexit._run_exitfuncs()  # the handlers and weakref finalizers a normal exit runs first, without the teardown
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
