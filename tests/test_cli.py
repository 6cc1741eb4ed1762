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
        (
            ["--suite", "nightly"],
            "unknown suite 'nightly'; allowed: bf16, bf16-training, data, deploy, distributed, generate, generate-full, hf2019, mlp, quick, "
            "runtimes, serving, serving-full, tfjs, training",
        ),
        ([*RUN[1:], "--batch-sizes", "0"], "--batch-sizes '0': every value must be a positive integer"),
        ([*RUN[1:], "--batch-sizes", "-3"], "--batch-sizes '-3'"),
        ([*RUN[1:], "--batch-sizes", "1,,2"], "--batch-sizes '1,,2'"),
        ([*RUN[1:], "--batch-sizes", "two"], "--batch-sizes 'two'"),
        ([*RUN[1:], "--batch-sizes", "1.5"], "--batch-sizes '1.5'"),
        ([*RUN[1:], "--seq-lens", "8,x"], "--seq-lens '8,x'"),
        ([*RUN[1:], "--protocol", "fastest"], "invalid choice: 'fastest' (choose from "),
        ([*RUN[1:], "--threads", "0"], "'0' is not a positive integer"),
        ([*RUN[1:], "--memory-limit", "lots"], "'lots': expected a positive integer"),
        ([*RUN[1:], "--max-time", "-1"], "'-1' must be a positive finite number"),
        ([*RUN[1:], "--timeout", "inf"], "'inf' must be a positive finite number"),
        ([*RUN[1:], "--max-time", "30", "--timeout", "20"], "max time 30 s must be below the timeout 20 s"),
        ([*RUN[1:], "--budget", "0"], "'0' must be a positive finite duration"),
        ([*RUN[1:], "--budget", "ten minutes"], "'ten minutes' is not a duration (seconds, or with ms, s, m or h"),
        ([*RUN[1:], "--target-ci", "0"], "'0' must be a positive finite number"),
        ([*RUN[1:], "--max-rounds", "0"], "'0' is not a positive integer"),
        ([*RUN[1:], "--threads", "\u00b2"], "is not a positive integer"),
        ([*RUN[1:], "--threads", "4096"], "--threads 4096 exceeds the"),
        ([*RUN[1:], "--batch-sizes", "\u00b2"], "--batch-sizes '\u00b2'"),
        ([*RUN[1:], "--batch-sizes", "99999999999999999999"], "positive integer up to 2147483647"),
        ([*RUN[1:], "--batch-sizes", ""], "--batch-sizes ''"),
        (["--suite", ""], "unknown suite ''"),
        (["--models", "", "--runtimes", "torch:eager"], "--models '': expected comma-separated names"),
        (["--models", "mlp"], "give both --models and --runtimes, or a --suite"),
        (["--suite", "quick", "--resume", "1"], "--resume reruns a stored plan with its stored settings; drop --suite"),
        (["--resume", "1", "--threads", "1"], "drop --threads"),
    ],
)
def test_bad_run_arguments(capsys: pytest.CaptureFixture[str], tmp_path: Path, extra: list[str], fragment: str) -> None:
    db = tmp_path / "sub" / "x.db"
    assert_usage_error(capsys, ["run", *extra, "--db", str(db)], fragment)
    assert not db.exists() and not db.parent.exists()


def test_plan_with_no_runnable_cell(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fwbench.models as models
    from test_planner import SequenceModel

    monkeypatch.setitem(models.MODELS, "seqmodel", SequenceModel())
    db = tmp_path / "x.db"
    assert_usage_error(
        capsys,
        [*RUN[:1], "--models", "seqmodel", "--runtimes", "torch:eager", "--seq-lens", "1024,2048", "--db", str(db)],
        "the plan has no runnable cell: sequence length 1024",
    )
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
    assert_usage_error(
        capsys, ["report", "--db", str(db_path), "--run", "7"], f"--run 7 is not in {db_path}; runs there: [1]"
    )
    assert_usage_error(capsys, ["report", "--db", str(db_path), "--format", "xml"], "invalid choice: 'xml'")
    assert_usage_error(
        capsys, ["run", "--resume", "9", "--db", str(db_path)], f"--resume 9 is not in {db_path}; runs there: [1]"
    )
    assert_usage_error(capsys, ["frobnicate"], "invalid choice: 'frobnicate'")
    assert db_path.read_bytes() == before


def test_one_run_id_lookup_for_every_command(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """'latest' or a number, resolved the same way with the same message wherever a run id is given."""
    from fwbench.cli.common import resolve_run
    from fwbench.spec import SpecError

    empty = tmp_path / "empty.db"
    with Store.open(empty) as store:
        with pytest.raises(SpecError, match=f"^--run latest is not in {empty}; runs there: none$"):
            resolve_run(store, "latest", empty, "--run")
        first = store.create_run(Plan((Case("mlp", "torch:eager"),), Settings()), "x", {}, "0")
        second = store.create_run(Plan((Case("mlp", "torch:eager"),), Settings()), "x", {}, "0")
        assert resolve_run(store, "latest", empty, "--run").id == second
        assert resolve_run(store, first, empty, "RUN_A").id == first
    for argv, label in (
        (["report", "--run", "5"], "--run"),
        (["compare", "1", "5"], "RUN_B"),
        (["run", "--resume", "5"], "--resume"),
    ):
        assert_usage_error(capsys, [*argv, "--db", str(empty)], f"{label} 5 is not in {empty}; runs there: [1, 2]")


def test_help_for_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    """In this process (argparse's help is the same text from ``python -m fwbench``, which test_list_and_env
    runs): exit 0, the usage line, no unexpanded ``%%``."""
    from fwbench.cli import COMMANDS

    for command in ([], *([name] for name in COMMANDS)):
        with pytest.raises(SystemExit) as exited:
            main([*command, "--help"])
        out = capsys.readouterr().out
        assert exited.value.code == 0 and "usage: fwbench" in out, command
        assert "%%" not in out, out


def test_list_and_env(plugin_env: dict[str, str]) -> None:
    listing = run_cli("list", env=plugin_env)
    assert listing.returncode == 0
    for text in ("mlp", "torch:eager", "tensorflow:function", "quick", "missing:eager"):
        assert text in listing.stdout
    assert "fwbench_no_such_framework" in listing.stdout
    missing_rows = [line for line in listing.stdout.splitlines() if "missing:eager" in line]
    assert missing_rows and "no:" in missing_rows[0] and "yes" not in missing_rows[0]
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


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (
            b'models = ["mlp"]\nruntimes = ["torch:eager"]\nbatch_sizes = [3]\nphase = "fit"\n',
            "phase fit: batch size 3 does not divide the 4096 fit samples",
        ),
        (
            b'models = ["mlp"]\nruntimes = ["torch:eager"]\nbatch_sizes = [1]\ndtype = "fp16"\n',
            "dtype 'fp16' cannot be run yet; runnable: fp32, bf16",
        ),
        (b'models = ["mlp"]\nruntimes = ["torch:eager"]\nbatch_sizes = [0]\n', "batch_sizes must hold positive"),
        (b'models = ["mlp"]\nruntimes = ["torch:eager"]\n', "missing keys ['batch_sizes']"),
        (b'models = ["mlp"]\nruntimes = ["torch:eager"]\nbatch_sizes = [1]\ncolour = 1\n', "unknown keys ['colour']"),
        (
            b'models = ["mlp"]\nruntimes = ["torch:eager"]\nbatch_sizes = [1]\n[settings]\nthreads = 0\n',
            "threads must be a positive integer",
        ),
        (b'models = ["mlp"\n', "not valid TOML"),
        (b"\xff\xfe not text", "not UTF-8 text"),
    ],
)
def test_bad_suite_files(capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes, fragment: str) -> None:
    suite = tmp_path / "mine.toml"
    suite.write_bytes(content)
    db = tmp_path / "x.db"
    assert_usage_error(capsys, ["run", "--suite", str(suite), "--db", str(db)], fragment)
    assert not db.exists()


def test_report_is_read_only(capsys: pytest.CaptureFixture[str], db_path: Path, tmp_path: Path) -> None:
    with Store.open(db_path) as store:
        store.create_run(Plan((Case("mlp", "torch:eager"),), Settings()), "x", {}, "0")
    before = db_path.read_bytes()
    assert main(["report", "--db", str(db_path), "--format", "json"]) == 0
    assert db_path.read_bytes() == before  # (a WAL reader may leave its -wal/-shm side files)
    empty = tmp_path / "empty.db"
    empty.touch()
    assert_usage_error(capsys, ["report", "--db", str(empty)], "holds no fwbench results yet")
    assert empty.read_bytes() == b""
    assert_usage_error(
        capsys, ["report", "--db", str(db_path), "--run", "99999999999999999999999"], "is not a positive integer"
    )
    assert_usage_error(capsys, ["report", "--db", str(db_path), "--out", "/sys/fwbench.csv"], "cannot write it")
    assert_usage_error(
        capsys,
        ["report", "--db", str(db_path), "--out", str(tmp_path / "no" / "x.csv")],
        "give a file path in an existing folder",
    )
