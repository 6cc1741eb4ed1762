"""The command line: every bad input is one line on stderr, exit 2, no traceback, nothing written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import run_cli
from fwbench.cli import main
from fwbench.spec import Case, Plan, Settings
from fwbench.store import Store


def assert_usage_error(capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str) -> None:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert fragment in lines[0], lines[0]


RUN = ["run", "--models", "mlp", "--runtimes", "torch:eager"]


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--models", "bert-huge", "--runtimes", "torch:eager"], "unknown model 'bert-huge'; allowed: mlp"),
        (["--models", "mlp", "--runtimes", "torch:turbo"], "unknown runtime 'torch:turbo'; allowed:"),
        (["--suite", "nightly"], "unknown suite 'nightly'; allowed: default"),
        ([*RUN[1:], "--batch-sizes", "0"], "--batch-sizes '0': every value must be a positive integer"),
        ([*RUN[1:], "--batch-sizes", "-3"], "--batch-sizes '-3'"),
        ([*RUN[1:], "--batch-sizes", "1,,2"], "--batch-sizes '1,,2'"),
        ([*RUN[1:], "--batch-sizes", "two"], "--batch-sizes 'two'"),
        ([*RUN[1:], "--batch-sizes", "1.5"], "--batch-sizes '1.5'"),
        ([*RUN[1:], "--seq-lens", "8,x"], "--seq-lens '8,x'"),
        ([*RUN[1:], "--protocol", "fastest"], "invalid choice: 'fastest' (choose from "),
        ([*RUN[1:], "--threads", "0"], "'0' is not a positive integer"),
        ([*RUN[1:], "--memory-limit", "lots"], "'lots': expected a positive integer"),
        ([*RUN[1:], "--max-time", "-1"], "'-1' must be positive"),
        (["--models", "mlp"], "give both --models and --runtimes, or a --suite"),
        (["--suite", "default", "--resume", "1"], "--resume reruns a stored plan; it takes no grid flags"),
    ],
)
def test_bad_run_arguments(capsys: pytest.CaptureFixture[str], tmp_path: Path, extra: list[str], fragment: str) -> None:
    db = tmp_path / "sub" / "x.db"
    assert_usage_error(capsys, ["run", *extra, "--db", str(db)], fragment)
    assert not db.exists() and not db.parent.exists()


def test_plan_with_no_runnable_cell(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from test_planner import SequenceModel

    import fwbench.models as models

    monkeypatch.setitem(models.MODELS, "seqmodel", SequenceModel())
    db = tmp_path / "x.db"
    assert_usage_error(capsys, [*RUN[:1], "--models", "seqmodel", "--runtimes", "torch:eager", "--seq-lens",
                                "1024,2048", "--db", str(db)], "the plan has no runnable cell: sequence length 1024")
    assert not db.exists()


def test_bad_databases(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert_usage_error(capsys, [*RUN, "--db", str(tmp_path)], "is a directory")
    notes = tmp_path / "notes.txt"
    notes.write_bytes(b"\x00\x01 precious bytes")
    assert_usage_error(capsys, [*RUN, "--db", str(notes)], "is not an SQLite database; refusing to touch it")
    assert notes.read_bytes() == b"\x00\x01 precious bytes"
    assert_usage_error(capsys, [*RUN, "--db", "/sys/fwbench.db"], "not a writable folder")
    assert_usage_error(capsys, ["report", "--db", str(tmp_path / "none.db")], "does not exist")
    assert not (tmp_path / "none.db").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_bad_report_arguments(capsys: pytest.CaptureFixture[str], db_path: Path) -> None:
    with Store.open(db_path) as store:
        store.create_run(Plan((Case("mlp", "torch:eager"),), Settings()), "x", {}, "0")
    before = db_path.read_bytes()
    assert_usage_error(capsys, ["report", "--db", str(db_path), "--run", "7"], "run 7 is not in")
    assert_usage_error(capsys, ["report", "--db", str(db_path), "--format", "xml"], "invalid choice: 'xml'")
    assert_usage_error(capsys, ["run", "--resume", "9", "--db", str(db_path)], "run 9 is not in")
    assert_usage_error(capsys, ["frobnicate"], "invalid choice: 'frobnicate'")
    assert db_path.read_bytes() == before


def test_help_for_every_command() -> None:
    for command in ([], ["run"], ["report"], ["list"], ["env"]):
        result = run_cli(*command, "--help")
        assert result.returncode == 0 and "usage: fwbench" in result.stdout, result.stderr


def test_list_and_env(plugin_env: dict[str, str]) -> None:
    listing = run_cli("list", env=plugin_env)
    assert listing.returncode == 0
    for text in ("mlp", "torch:eager", "tensorflow:function", "default", "missing:eager"):
        assert text in listing.stdout
    assert "no: fwbench_no_such_framework is not installed" in listing.stdout.replace("\n", " ").replace("│", "")\
        or "fwbench_no_such_framework" in listing.stdout
    env = run_cli("env", "--format", "json")
    record = json.loads(env.stdout)
    assert record["python"] == sys.version.split()[0]


def test_manager_side_never_imports_a_framework() -> None:
    code = (
        "import sys, fwbench.cli, fwbench.runner.manager, fwbench.report.table, fwbench.store;"
        "fwbench.cli.main(['list']);"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'torch','tensorflow','jax','keras'});"
        "print('IMPORTED', bad)"
    )
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("IMPORTED []")
