"""A full disk says so: every place that writes (the results database, ``data make``, ``export``, profile traces)
stops with one line naming the path, the error (SQLITE_FULL, ENOSPC; EFBIG worded apart) and what was kept; exit 1;
nothing stored before is lost.

The disk fills for real where the machine allows: a 1 MiB tmpfs (root; a test that needs one says so in its skip
reason), a database at its page limit (``PRAGMA max_page_count``: SQLite's own SQLITE_FULL, anywhere), a file size
limit (RLIMIT_FSIZE: EFBIG, anywhere). Workers are replaced by stand-ins that return what a worker reports: the
failure path is the manager's, and a real worker's time adds nothing to it.
"""

from __future__ import annotations

import errno
import io
import os
import re
import resource
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO_DIR, run_cli
from fwbench.cli import main
from fwbench.diskfull import DiskFull, disk_full_cause, disk_full_report
from fwbench.messages import Job
from fwbench.runner import manager
from fwbench.runner.cell import Cell
from fwbench.runner.outcome import CellOutcome
from fwbench.spec import Case, Plan, Settings
from fwbench.store import Store
from fwbench.store.merge import merge_stores

PLAN = Plan((Case("mlp", "torch:eager", batch_size=1), Case("mlp", "torch:eager", batch_size=2)), Settings(rounds=1))
RUN = ["run", "--models", "mlp", "--runtimes", "torch:eager", "--batch-sizes", "1,2", "--rounds", "1"]
PADDING = "x" * 20_000  # a stored cell this large needs new database pages: past the page limit, SQLITE_FULL


# -- ways to fill a disk -------------------------------------------------------------------------------------
@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs at tmp_path/fs, unmounted at teardown (lazily, if busy). Skipped, saying why, where mounting
    is not allowed; the page-limit, size-limit and stand-in tests cover the same paths there."""
    folder = tmp_path / "fs"
    folder.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs", str(folder)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield folder
    finally:
        if subprocess.run(["umount", str(folder)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def fill(folder: Path) -> Path:
    """Write a file into ``folder`` until its file system has no byte left (ENOSPC); the file's path."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for chunk in (b"\0" * 65536, b"\0" * 4096, b"\0"):
            while True:
                try:
                    os.write(fd, chunk)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                    break
    finally:
        os.close(fd)
    return filler


def limit_pages(store: Store) -> None:
    """Let ``store``'s database grow no more: the next write needing a page fails with SQLITE_FULL (SQLite's own)."""
    pages = store.conn.execute("PRAGMA page_count").fetchone()[0]
    store.conn.execute(f"PRAGMA max_page_count = {pages}")


def one_line(err: str) -> str:
    """The one disk-full line of ``err`` (asserted to be the only one, and the last)."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines and sum("disk full" in line or "file too large" in line for line in lines) == 1, err
    return lines[-1]


def store_cell(db: Path, padding: str = "") -> None:
    """A database at ``db`` with run 1 of PLAN holding its first cell."""
    with Store.open(db) as store:
        run_id = store.create_run(PLAN, "fwbench run", {}, "0")
        with store.transaction():
            store.add_result(run_id, PLAN.cases[0], {"status": "ok", "median_s": 1e-3}, [1e-3], {"pad": padding})


def assert_kept(db: Path, cells: int) -> None:
    """``db`` opens, passes SQLite's integrity check and holds ``cells`` cells."""
    with Store.open(db, readonly=True) as store:
        assert store.integrity_ok()
        assert len(store.results()) == cells


# -- the store ----------------------------------------------------------------------------------------------
def test_opening_a_database_on_a_full_disk_says_disk_full(tmpfs: Path) -> None:
    """The reported case: `fwbench run` on a full file system said "--db …: cannot commit - no transaction is active"
    (opening needs room for SQLite's WAL index; the read failed, SQLite ended the transaction, and the COMMIT after
    it failed in turn). Now: one line, exit 1, the database as it was."""
    db = tmpfs / "x.db"
    store_cell(db)
    filler = fill(tmpfs)
    done = run_cli(*RUN, "--db", str(db))
    assert done.returncode == 1, done.stderr
    # SQLite names the failure SQLITE_FULL, or (growing its WAL index) an I/O error fwbench reads with the free space
    assert re.fullmatch(
        rf"fwbench: disk full writing {re.escape(str(db))} \((SQLITE_FULL|SQLITE_IOERR\w*, \d+ KiB free)\): what it held "
        "before is kept; free space and run the command again",
        done.stderr.strip(),
    ), done.stderr
    filler.unlink()
    assert_kept(db, 1)


@pytest.mark.parametrize("how", ["tmpfs", "page limit"])
def test_each_write_of_the_store_says_disk_full_and_loses_nothing(
    how: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A result's commit (SQLITE_FULL at the COMMIT on a full file system, at the INSERT past the page limit), run
    creation, a run's end: DiskFull with the path; nothing committed before is lost and the store goes on."""
    folder = request.getfixturevalue("tmpfs") if how == "tmpfs" else tmp_path
    db = folder / "x.db"
    with Store.open(db) as store:
        run_id = store.create_run(PLAN, "fwbench run", {}, "0")
        with store.transaction():
            store.add_result(run_id, PLAN.cases[0], {"status": "ok"}, [1e-3], {})
        if how == "tmpfs":
            fill(folder)
        else:
            limit_pages(store)

        def add_result() -> None:
            with store.transaction():
                store.add_result(run_id, PLAN.cases[1], {"status": "ok"}, [1e-3], {"pad": PADDING})

        writes: list[Callable[[], object]] = [
            add_result,
            lambda: store.create_run(PLAN, "fwbench run", {"pad": PADDING}, "0"),
            lambda: store.finish_run(run_id),  # in place: past the page limit it still fits
        ]
        for write in writes[: 2 if how == "page limit" else 3]:
            with pytest.raises(DiskFull) as raised:
                write()
            assert str(raised.value) == (
                f"fwbench: disk full writing {db} (SQLITE_FULL): what it held before is kept; free space and run the "
                "command again"
            )
            assert not store.conn.in_transaction
        (folder / "filler").unlink(missing_ok=True)
        store.conn.execute("PRAGMA max_page_count = 1073741823")
        with store.transaction():  # room again: the same store writes on
            store.add_result(run_id, PLAN.cases[1], {"status": "ok"}, [1e-3], {})
    assert_kept(db, 2)


def stand_in_groups(monkeypatch: pytest.MonkeyPatch, filled: Callable[[Store], None]) -> None:
    """Groups run by a stand-in (each cell ok, with a large details record), and ``filled`` called on the store
    once the first group is stored."""

    def run_group(group: list[Case], settings: Settings, parity: Any, **_: Any) -> tuple[manager.Settled, None]:
        return [
            (CellOutcome(case, "ok", None, [1e-3], {"median_s": 1e-3}, {"pad": PADDING}), 0.1) for case in group
        ], None

    record, calls = manager.Recorder.record, []

    def record_then_fill(self: manager.Recorder, settled: manager.Settled, machine: Any, **kwargs: Any) -> None:
        record(self, settled, machine, **kwargs)
        calls.append(1)
        if len(calls) == 1:
            filled(self.store)

    monkeypatch.setattr(manager, "open_comparison_group", run_group)
    monkeypatch.setattr(manager.Recorder, "record", record_then_fill)


@pytest.mark.parametrize("how", ["tmpfs", "page limit"])
def test_a_sweep_stopped_by_a_full_disk_keeps_its_cells_and_says_how_to_resume(
    how: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    folder = request.getfixturevalue("tmpfs") if how == "tmpfs" else tmp_path
    db = folder / "x.db"
    fillers: list[Path] = []
    stand_in_groups(monkeypatch, lambda store: fillers.append(fill(folder)) if how == "tmpfs" else limit_pages(store))
    assert main([*RUN, "--db", str(db)]) == 1
    assert one_line(capsys.readouterr().err) == (
        f"fwbench: disk full writing {db} (SQLITE_FULL): the 1 cell stored before is kept; free space and continue "
        f"with `fwbench run --resume 1 --db {db}`"
    )
    for filler in fillers:
        filler.unlink()
    assert_kept(db, 1)
    monkeypatch.undo()
    stand_in_groups(monkeypatch, lambda store: None)
    assert main(["run", "--resume", "1", "--db", str(db)]) == 0  # the line's command finishes the run
    assert_kept(db, 2)


def test_a_cell_whose_worker_found_the_disk_full_stops_the_sweep_unstored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """A worker's write (its group's export cache, say) that found no room: the group is not stored (--resume runs
    it), and the line names the worker's file."""
    db, cache = tmp_path / "x.db", "/tmp/fwbench-exports-1/model.onnx"
    report = disk_full_report(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), cache))

    def run_group(group: list[Case], settings: Settings, parity: Any, **_: Any) -> tuple[manager.Settled, None]:
        return [
            (CellOutcome(case, "error", "OSError during compile", details={"disk_full": report}), 0.1) for case in group
        ], None

    monkeypatch.setattr(manager, "open_comparison_group", run_group)
    assert main([*RUN, "--db", str(db)]) == 1
    assert one_line(capsys.readouterr().err) == (
        f"fwbench: disk full writing {cache} (ENOSPC): the 0 cells stored before are kept; free space and continue "
        f"with `fwbench run --resume 1 --db {db}`"
    )
    assert_kept(db, 0)


def test_merge_into_a_database_on_a_full_disk_leaves_it_as_it_was(tmpfs: Path, tmp_path: Path, capsys: Any) -> None:
    source, into = tmp_path / "a.db", tmpfs / "into.db"
    store_cell(source, PADDING)
    with Store.open(into):
        pass
    with Store.open(into) as target:  # held open: its WAL index stays, the merge's commit is what finds no room
        filler = fill(tmpfs)
        with pytest.raises(DiskFull) as raised:
            merge_stores([source], into)
        assert str(raised.value) == (
            f"fwbench: disk full writing {into} (SQLITE_FULL): {into} is as it was (nothing of the merge reached it), "
            "the sources untouched; free space and merge again"
        )
        assert target.runs() == []
    filler.unlink()
    assert_kept(into, 0)
    assert main(["merge", str(source), "--into", str(into)]) == 0
    assert_kept(into, 1)


# -- the worker's report ------------------------------------------------------------------------------------
def test_the_worker_reports_a_write_that_found_no_room() -> None:
    cell = Cell(Job(PLAN.cases[0], PLAN.settings), io.StringIO())
    result = cell.failure(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/out/trace.json"))
    assert result["status"] == "error" and result["disk_full"] == {"cause": "ENOSPC", "path": "/out/trace.json"}
    assert "disk_full" not in Cell(Job(PLAN.cases[0], PLAN.settings), io.StringIO()).failure(ValueError("bad"))
    try:  # a C library's own exception, raised while handling the OSError
        try:
            raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))
        except OSError:
            raise RuntimeError("could not write the artefact") from None
    except RuntimeError as exc:
        assert disk_full_cause(exc) == "EFBIG"  # `from None` hides the OSError from tracebacks, not from this
    assert disk_full_cause(RuntimeError("write failed: No space left on device")) == "ENOSPC"  # its words say it
    assert disk_full_cause(RuntimeError("Disk quota exceeded")) == "EDQUOT"
    conn = sqlite3.connect(":memory:")
    conn.execute("PRAGMA max_page_count = 1")
    with pytest.raises(sqlite3.OperationalError) as full:
        conn.execute("CREATE TABLE t (x)")
    assert disk_full_cause(full.value) == "SQLITE_FULL"


# -- fwbench data make ----------------------------------------------------------------------------------------
def test_data_make_on_a_full_disk_leaves_no_half_dataset(tmpfs: Path, capsys: Any) -> None:
    out = tmpfs / "lines"
    assert main(["data", "make", "text", "--n", "20000", "--out", str(out)]) == 1
    assert one_line(capsys.readouterr().err) == (
        f"fwbench: disk full writing {out} (ENOSPC): no half dataset is left at {out}; free space and run the "
        "command again"
    )
    assert list(tmpfs.iterdir()) == []


def test_data_make_past_the_file_size_limit_says_file_too_large(tmp_path: Path) -> None:
    """RLIMIT_FSIZE (``ulimit -f``) makes a write past it fail with EFBIG (Python ignores SIGXFSZ): worded apart,
    freeing space would not help."""
    out = tmp_path / "lines"

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, resource.RLIM_INFINITY))

    command = [sys.executable, "-m", "fwbench", "data", "make", "text", "--n", "20000", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO_DIR, preexec_fn=limit)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip() == (
        f"fwbench: file too large (the file size limit, ulimit -f) writing {out} (EFBIG): no half dataset is left "
        f"at {out}; raise the limit and run the command again"
    )
    assert list(tmp_path.iterdir()) == []


# -- fwbench export ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("named", ["the artefact", "a compiler's file"])
def test_export_on_a_full_disk_leaves_nothing_at_out(
    named: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    import fwbench.cli.export as export

    out, elsewhere = tmp_path / "mlp.onnx", "/tmp/torchinductor_root/x.cpp"

    def worker(case: Case, settings: Settings, check_parity: bool = True, **job: Any) -> CellOutcome:
        partial = Path(job["export_to"])
        partial.write_bytes(b"half an artefact")
        path = str(partial) if named == "the artefact" else elsewhere
        report = disk_full_report(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path))
        return CellOutcome(case, "error", "OSError during compile", details={"disk_full": report})

    monkeypatch.setattr(export, "run_worker", worker)
    assert main(["export", "mlp", "--runtime", "onnxruntime:torch", "--out", str(out)]) == 1
    where = out if named == "the artefact" else elsewhere
    assert one_line(capsys.readouterr().err) == (
        f"fwbench: disk full writing {where} (ENOSPC): nothing is left at {out}; free space and export again"
    )
    assert list(tmp_path.iterdir()) == []


# -- fwbench profile --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["the worker says so", "torch.profiler wrote no trace"])
def test_profile_on_a_full_disk_keeps_the_profiles_before(
    how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any, request: pytest.FixtureRequest
) -> None:
    """The second cell's trace finds no room: the first cell's profile stays stored. torch.profiler only logs a
    trace it cannot write (and leaves none): a trace that is missing on a full file system is a full disk too."""
    import fwbench.cli.profile as profile

    out = request.getfixturevalue("tmpfs") / "traces" if how != "the worker says so" else tmp_path / "traces"
    db = tmp_path / "x.db"
    cells: list[Case] = []

    def worker(case: Case, settings: Settings, check_parity: bool = True, **job: Any) -> CellOutcome:
        cells.append(case)
        if len(cells) == 1:
            return CellOutcome(case, "error", "RuntimeError during build")
        folder = Path(job["profile_to"])
        if how == "the worker says so":
            report = disk_full_report(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder / "trace.json")))
            return CellOutcome(case, "error", "OSError during profile", details={"disk_full": report})
        out.mkdir(exist_ok=True)
        fill(out.parent)
        profile_report = {"rule": "torch", "calls": 5, "trace": str(folder / "trace.json"), "wall_s": 1.0}
        return CellOutcome(case, "ok", details={"profile": profile_report})

    monkeypatch.setattr(profile, "run_worker", worker)
    argv = ["profile", "--models", "mlp", "--runtimes", "torch:eager", "--batch-sizes", "1,2"]
    assert main([*argv, "--out", str(out), "--db", str(db)]) == 1
    folder = profile.trace_folder(out, cells[1])
    cause = "ENOSPC" if how == "the worker says so" else "no complete trace, 0 KiB free"
    path = folder / "trace.json" if how == "the worker says so" else folder
    assert one_line(capsys.readouterr().err) == (
        f"fwbench: disk full writing {path} ({cause}): the 1 cell profiled before is kept (profile run 1 of {db}, "
        f"traces under {out}); free space and profile again"
    )
    with Store.open(db, readonly=True) as store:
        assert [p.status for p in store.profiles()] == ["error"]


@pytest.mark.parametrize(
    ("report", "stops"),
    [
        ({"cause": "ENOSPC", "path": "/var/cache/fwbench/exports/model.onnx"}, True),
        ({"cause": "ENOSPC", "path": "/dev/shm/torch_123_456"}, False),  # a DataLoader's shared memory: the cell's
        ({"cause": "ENOSPC", "path": None}, False),  # a C library's words, no file named: the cell's error
    ],
)
def test_only_a_full_file_system_stops_the_sweep(report: dict[str, object], stops: bool) -> None:
    from fwbench.diskfull import stops_the_sweep

    assert stops_the_sweep(report) is stops
