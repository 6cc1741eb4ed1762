"""The compiled modes: torch:script, torch:compile, torch:export and tensorflow:xla compute the same function.

``make test`` runs torch:script in a worker (torch's compiled modes; torch.compile's code path runs in-process in
tests/test_bf16.py, and torch.compile gets the compile mode below); the tensorflow:xla worker cell, ``fwbench verify``
of every compiled runtime (a cold inductor compile) and torch:export (AOTInductor: its worker cell, and its bf16
autocast in tests/test_bf16.py) are the matrix's (``make test-matrix``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import require, run_args, run_cli
from fwbench.cli import main
from fwbench.runner.manager import run_worker
from fwbench.spec import Case, CompileMode, Settings, SpecError
from fwbench.store import Store


@pytest.mark.parametrize("runtime", ["torch:script", pytest.param("tensorflow:xla", marks=pytest.mark.matrix)])
def test_compiled_runtime_in_a_worker(runtime: str) -> None:
    outcome = run_worker(Case("bert-tiny", runtime, batch_size=2, seq_len=32), Settings(threads=1, max_time_s=0.3))
    assert outcome.status == "ok", outcome.reason
    assert outcome.details["parity"]["ok"]
    assert outcome.fields["first_call_s"] > outcome.fields["median_s"]  # tracing / compiling happens in call 1


@pytest.mark.slow
@pytest.mark.matrix
@pytest.mark.parametrize("model", ["resnet-tiny"])
def test_verify_every_compiled_runtime(model: str) -> None:
    """Convolutions and batch norm through each compiled runtime (their MLP and bert-tiny: test_diff.py's tapped
    programs, test_compiled_runtime_in_a_worker). torch:compile runs inductor (a cold compile takes tens of seconds
    on 2 cores)."""
    runtimes = ("torch:script", "torch:compile", "tensorflow:xla")
    result = run_cli("verify", "--models", model, "--runtimes", ",".join(runtimes), "--threads", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(" ok ") == len(runtimes)


def listing(capsys: pytest.CaptureFixture[str]) -> str:
    """``fwbench list``'s output, run in this process."""
    capsys.readouterr()
    assert main(["list"]) == 0
    return capsys.readouterr().out


def test_list_says_torchscript_is_deprecated(capsys: pytest.CaptureFixture[str]) -> None:
    text = " ".join(listing(capsys).split())
    assert "TorchScript is deprecated upstream since PyTorch 2.9" in text.replace("│ ", "").replace(" │", "")


@pytest.mark.slow
@pytest.mark.matrix
def test_export_runtime_in_a_worker(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """torch:export: export + AOTInductor in the compile stage, its seconds stored; parity ok. The MLP at batch 3
    is exported again at the parity shape (batch 2). (bert-tiny's exported program: test_diff.py's checkpoints through
    torch:export. A cell at its parity shape reuses the timed runner instead: that branch is not run here, it would
    cost another worker and AOT compile, about 20 s.)"""
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the worker's package folder and torch's extraction land here
    batch_size = 3
    outcome = run_worker(Case("mlp", "torch:export", batch_size=batch_size), Settings(threads=1, max_time_s=0.3))
    assert outcome.status == "ok", outcome.reason
    assert outcome.details["parity"]["ok"]
    report = outcome.details["compile_report"]
    assert report["export_s"] > 0 and report["aot_compile_s"] > 0 and report["package_bytes"] > 0
    assert report["input_shapes"][0][0] == batch_size
    # export and AOT compile happen in the compile stage, not in the timed first call
    assert outcome.details["stage_seconds"]["compile"] >= report["export_s"] + report["aot_compile_s"]
    assert outcome.fields["first_call_s"] < report["aot_compile_s"]
    assert [r["input_shapes"][0][0] for r in report.get("reexports", [])] == [2]
    assert outcome.details["compile_health"]["during_timing"] == {}
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(("fwbench-aoti-", "aotinductor_"))]


def test_list_shows_torch_export(capsys: pytest.CaptureFixture[str]) -> None:
    rows = [line for line in listing(capsys).splitlines() if "torch:export" in line]
    assert rows and "yes" in rows[0] and "torch.export.export" in rows[0]


def test_compile_mode_is_validated(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="unknown compile mode 'fast'; allowed: default, reduce-overhead, max-autotune"):
        Settings(compile_mode="fast")  # type: ignore[arg-type]
    bad_config = tmp_path / "settings.toml"
    bad_config.write_text('[settings]\ncompile_mode = "turbo"\n')
    db = tmp_path / "never.db"
    for extra, fragment in (
        (["--compile-mode", "fast"], "--compile-mode: invalid choice: 'fast'"),
        (["--config", str(bad_config)], "unknown compile mode 'turbo'"),
    ):
        code = main(["run", "--models", "mlp", "--runtimes", "torch:compile", "--db", str(db), *extra])
        err = capsys.readouterr().err
        assert code == 2 and len(err.strip().splitlines()) == 1 and fragment in err, err
    assert not db.exists()


def test_compile_mode_is_stored_with_the_run(
    plugin_env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "run.db"
    for extra, _expected in (([], "default"), (["--compile-mode", "max-autotune"], "max-autotune")):
        code = main(run_args("--models", "mlp", "--runtimes", "fake:sleep", *extra, db=db, max_time=0.1))
        assert code == 0, capsys.readouterr().err
    with Store.open(db, create=False) as store:
        runs = [store.get_run(i) for i in (1, 2)]
    assert [run.settings["compile_mode"] if run else None for run in runs] == ["default", "max-autotune"]


@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune"])
def test_compile_mode_reaches_torch_compile(monkeypatch: pytest.MonkeyPatch, mode: CompileMode) -> None:
    """The setting is what torch.compile gets (captured, nothing compiled)."""
    torch = require("torch")
    from fwbench.frameworks import create_backend
    from fwbench.frameworks.torch.backend import TorchBackend
    from fwbench.models import get_model

    calls: list[dict[str, object]] = []

    def record_compile(model: object, **kwargs: object) -> object:
        calls.append(kwargs)
        return model

    monkeypatch.setattr(torch, "compile", record_compile)
    backend = create_backend("torch:compile", "cpu", Settings(compile_mode=mode))
    assert isinstance(backend, TorchBackend)
    description = get_model("mlp")
    backend.build(description, description.canonical_weights(0))
    try:
        backend.compile(backend.make_inputs(description.make_inputs(1, None, 0)))
    finally:
        backend._inference_mode.__exit__(None, None, None)  # compile entered it for the process
    assert calls == [{"fullgraph": True, "mode": mode}]
