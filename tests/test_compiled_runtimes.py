"""The compiled modes: torch:script, torch:compile and tensorflow:xla compute the same function."""

from __future__ import annotations

import pytest

from conftest import run_cli
from fwbench.runner.manager import run_worker
from fwbench.spec import Case, Settings


@pytest.mark.parametrize("runtime", ["torch:script", "tensorflow:xla"])
def test_compiled_runtime_in_a_worker(runtime: str) -> None:
    outcome = run_worker(Case("bert-tiny", runtime, batch_size=2, seq_len=32), Settings(threads=1, max_time_s=0.3))
    assert outcome.status == "ok", outcome.reason
    assert outcome.details["parity"]["ok"]
    assert outcome.fields["first_call_s"] > outcome.fields["median_s"]  # tracing / compiling happens in call 1


@pytest.mark.slow
def test_verify_every_compiled_runtime() -> None:
    """torch:compile runs inductor (a cold compile takes tens of seconds on 2 cores)."""
    result = run_cli("verify", "--models", "mlp,resnet-tiny", "--runtimes",
                     "torch:eager,torch:script,torch:compile,tensorflow:xla", "--threads", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(" ok ") == 8


def test_list_says_torchscript_is_deprecated() -> None:
    listing = " ".join(run_cli("list").stdout.split())
    assert "TorchScript is deprecated upstream since PyTorch 2.9" in listing.replace("│ ", "").replace(" │", "")
