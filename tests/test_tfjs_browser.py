"""TensorFlow.js's WebAssembly backend in headless Chromium (tfjs:wasm-browser): cells run by the JavaScript worker,
which serves a cross-origin-isolated page on 127.0.0.1 and drives it over the DevTools protocol; parity against the
float64 reference, the threads, SIMD and isolation the page got, a defect in a JS model file caught and located (by
a run and by fwbench diff), fwbench verify and diff of unmodified models, no Chromium process left after a cell, and
the runtime listed unavailable without Chromium.

Chromium is Debian's ``chromium`` (``make test`` installs it with scripts/ensure-chromium, as CI does); without it
the tests that start it are skipped, and fail under ``FWBENCH_TESTS_NEED_EXTRAS=all``."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import NEED_EXTRAS_ENV, REPO_DIR, fwbench_here, run_args
from fwbench.frameworks.tfjs import external, external_browser
from fwbench.models import get_model
from fwbench.runner.tempfolders import EXTERNAL_PREFIX
from fwbench.spec import Settings
from fwbench.store.db import Store
from test_tfjs import (
    ATTENTION_DEFECT,
    external_workers,
    faulty_models,
    scratch_env,
    scratch_here,
    stored,
    use_faulty_models,
)

RUNTIME = "tfjs:wasm-browser"
THREADS = 2 if len(os.sched_getaffinity(0)) >= 2 else 1


@pytest.fixture
def chromium_installed() -> None:
    """Skip without Node.js or the packages unless make test installed them (then their absence fails); skip without
    Chromium, a system package scripts/ensure-chromium installs where it can (as the HTML report's browser test)."""
    missing = external.missing()
    if missing and os.environ.get(NEED_EXTRAS_ENV) == "all":
        pytest.fail(f"{RUNTIME} cannot run, but ${NEED_EXTRAS_ENV}=all: {missing}")
    if missing:
        pytest.skip(missing)
    no_chromium = external_browser.missing()
    if no_chromium:
        pytest.skip(no_chromium)


needs_chromium = pytest.mark.usefixtures("chromium_installed")


def chromium_processes(scratch: Path) -> list[int]:
    """Pids of the processes whose command line names a profile under ``scratch`` (a test's Chromium, every process
    of it: the browser passes --user-data-dir to each; its profile is in the cell's folder)."""
    marker = f"--user-data-dir={scratch}/{EXTERNAL_PREFIX}".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


LEAVE_S = 10.0  # Chromium's zygotes and renderers (outside the worker's process group) exit once its browser is gone


def assert_nothing_left(scratch: Path) -> None:
    """No process of a test's Chromium left (given LEAVE_S to end), and its folder removed."""
    deadline = time.monotonic() + LEAVE_S
    while chromium_processes(scratch) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert chromium_processes(scratch) == []
    assert list(scratch.glob(f"{EXTERNAL_PREFIX}*")) == []  # the worker removed the folder it read, the profile in it


def kill_all(pids: list[int]) -> None:
    """SIGKILL to each of ``pids`` still there: a test never leaves a process behind, also when it fails."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def leaving_no_chromium(scratch: Path) -> Iterator[None]:
    """The block, then :func:`assert_nothing_left`; whatever of the test's Chromium is left is killed, also when it
    fails."""
    try:
        yield
        assert_nothing_left(scratch)
    finally:
        kill_all(chromium_processes(scratch))


@pytest.mark.slow
@needs_chromium
def test_browser_cells_are_ok_with_parity_threads_simd_and_isolation(
    tmp_path: Path, db_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    scratch = scratch_here(tmp_path, monkeypatch)
    args = run_args("--models", "mlp,bert-tiny", "--runtimes", RUNTIME, db=db_path, threads=THREADS, max_time=0.3)
    with leaving_no_chromium(scratch):
        code, _, err = fwbench_here(capsys, *args)
        assert code == 0, err[-3000:]
        with Store.open(db_path) as store:
            rows = store.results()
        assert sorted(row.model for row in rows) == ["bert-tiny", "mlp"]
        for row in rows:
            assert row.status == "ok", row.reason
            details = row.details
            assert details["parity"]["ok"] is True and details["parity"]["reference"] == "numpy-float64"
            browser = details["browser"]
            assert browser["cross_origin_isolated"] is True and browser["simd"] is True
            assert browser["threads_requested"] == THREADS and browser["threads_got"] == THREADS
            assert details["threads_effective"]["intra_op"] == THREADS
            assert browser["multithread"] is True and browser["wasm_file"] == "tfjs-backend-wasm-threaded-simd.wasm"
            assert 0 < browser["timer_resolution_s"] <= Settings().min_block_s / 100
            assert browser["processes"] > 1 and browser["chromium"]
            assert details["tfjs_tensors"]["before_timing"] == details["tfjs_tensors"]["after_timing"]
            assert not row.compile_health.flags  # nothing short of what was asked
            assert row.median_s is not None and row.median_s > 0
            assert row.peak_memory_bytes is not None and row.peak_memory_bytes > 0
            assert set(details["stage_seconds"]) >= {"import", "build", "first_call", "warmup", "timing", "parity"}


@pytest.mark.slow
@needs_chromium
def test_a_defect_in_a_js_model_file_is_a_located_mismatch_in_the_browser(
    tmp_path: Path, db_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The page imports the model files from $FWBENCH_TFJS_MODELS's folder, as the Node.js worker does."""
    scratch = scratch_here(tmp_path, monkeypatch)
    use_faulty_models(monkeypatch, tmp_path / "models", "bert", *ATTENTION_DEFECT)
    args = run_args("--models", "bert-tiny", "--runtimes", RUNTIME, "--seq-lens", "8", db=db_path, max_time=0.2)
    with leaving_no_chromium(scratch):
        code, _, err = fwbench_here(capsys, *args)
        assert code == 0, err[-3000:]  # a mismatch is a result, stored with its reason
        ((status, reason),) = stored(db_path).values()
        assert status == "mismatch" and reason is not None and "outputs differ from the reference" in reason
        assert "first divergence: encoder.layer.0.attention.output" in reason


# mlp.mjs: never finishes building, the page's main thread busy for good (Atomics.wait is not allowed there)
BUSY_HANG = ("const last =", "for (;;) {}\n  const last =")
HANG_TIMEOUT_S = 20  # the page reaches the build in ~1.5 s on 2 cores; a margin for a loaded machine


@pytest.mark.slow
@needs_chromium
def test_a_hanging_page_is_a_timeout_and_leaves_no_chromium_process(
    tmp_path: Path, db_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The manager kills the worker's process group: Chromium's processes are in it (and the browser process has
    the worker's death as its signal); the profile was in the cell's folder, which the manager removes."""
    scratch = scratch_here(tmp_path, monkeypatch)
    use_faulty_models(monkeypatch, tmp_path / "models", "mlp", *BUSY_HANG)
    args = run_args(
        *("--models", "mlp", "--runtimes", RUNTIME, "--timeout", str(HANG_TIMEOUT_S)), db=db_path, max_time=0.2
    )
    with leaving_no_chromium(scratch):
        code, _, err = fwbench_here(capsys, *args)
        assert code == 0, err[-3000:]
        ((status, reason),) = stored(db_path).values()
        assert status == "timeout" and reason is not None, (status, reason)
        assert reason.startswith(f"exceeded --timeout {HANG_TIMEOUT_S} s during build"), reason  # in the page


def test_without_chromium_list_says_so_and_a_run_skips_the_browser_runtime(
    db_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(external_browser.CHROMIUM_ENV, "/nonexistent/chromium")
    if external_browser.missing_node():
        pytest.skip(external_browser.missing_node() or "")
    expected = "no Chromium found ($FWBENCH_CHROMIUM=/nonexistent/chromium is not an executable)"
    assert (external_browser.missing() or "").startswith(expected)
    code, out, _ = fwbench_here(capsys, "list")
    assert code == 0 and "no Chromium found" in out
    args = run_args("--models", "mlp", "--runtimes", RUNTIME, db=db_path, max_time=0.2)
    code, _, err = fwbench_here(capsys, *args)
    assert code == 0, err[-2000:]
    ((status, reason),) = stored(db_path).values()
    assert status == "skipped" and reason is not None and "no Chromium found" in reason


def test_without_chromium_on_path_the_runtime_is_unavailable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No $FWBENCH_CHROMIUM and none of chromium, chromium-browser, google-chrome on PATH (Node.js kept)."""
    monkeypatch.delenv(external_browser.CHROMIUM_ENV, raising=False)
    node = external.node_executable()
    if node is None:
        pytest.skip("no Node.js")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "node").symlink_to(node)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert external_browser.missing() == (
        "no Chromium found (none of chromium, chromium-browser, google-chrome on PATH): install Debian's chromium "
        "(scripts/ensure-chromium)"
    )


def test_generate_is_refused_with_one_line_and_verify_is_not() -> None:
    from fwbench.frameworks import get_runtime
    from fwbench.runner.verify import case_refusal
    from fwbench.spec import Case

    info = get_runtime(RUNTIME)
    assert info.phases == ("inference",) and "not built yet" in info.no_generate
    case = Case(model="mlp", runtime=RUNTIME, batch_size=1, seq_len=None)
    assert case_refusal(case, Settings()) == external_browser.missing()  # None where Chromium and Node.js are


@pytest.mark.slow
@needs_chromium
def test_verify_passes_the_browser_runtime_on_an_unmodified_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """One call in the page at the verified shape, judged against the float64 reference as tfjs:wasm's is."""
    scratch = scratch_here(tmp_path, monkeypatch)
    with leaving_no_chromium(scratch):
        code, out, err = fwbench_here(capsys, "verify", "--models", "bert-tiny", "--runtimes", RUNTIME)
        assert code == 0, out + err
        rows = [line for line in out.splitlines() if RUNTIME in line]
        assert len(rows) == 2 and all(line.rstrip(" │").endswith("ok") for line in rows), rows  # bert-tiny's 2 outputs


@pytest.mark.slow
@needs_chromium
def test_diff_names_the_layer_of_a_defect_in_a_js_model_file_in_the_browser(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The page's checkpoints, beside tfjs:wasm's in Node.js: both name the attention output of the first layer."""
    scratch = scratch_here(tmp_path, monkeypatch)
    use_faulty_models(monkeypatch, tmp_path / "models", "bert", *ATTENTION_DEFECT)
    with leaving_no_chromium(scratch):
        code, out, err = fwbench_here(
            capsys, "diff", "bert-tiny", "--runtimes", f"tfjs:wasm,{RUNTIME}", "--format", "json"
        )
        assert code == 1, out + err
        runtimes = json.loads(out)["runtimes"]
        assert [runtime["runtime"] for runtime in runtimes] == ["tfjs:wasm", RUNTIME]
        for runtime in runtimes:
            assert runtime["status"] == "ok", runtime
            first = runtime["first_divergence"]
            assert first is not None and first["name"] == "encoder.layer.0.attention.output", first
            assert first["rel_l2"] > 3 * first["limit"]


@pytest.mark.slow
@needs_chromium
@pytest.mark.parametrize("model", ["mlp", "bert-tiny"])
def test_diff_of_unmodified_models_in_the_browser_shows_every_checkpoint_within_its_share(
    model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    scratch = scratch_here(tmp_path, monkeypatch)
    with leaving_no_chromium(scratch):
        code, out, err = fwbench_here(capsys, "diff", model, "--runtimes", RUNTIME, "--format", "json")
        assert code == 0, out + err
        ((runtime,),) = [json.loads(out)["runtimes"]]
        assert runtime["runtime"] == RUNTIME
        assert runtime["status"] == "ok" and runtime["first_divergence"] is None, runtime
        checkpoints = [layer["name"] for layer in runtime["layers"] if layer["kind"] == "checkpoint"]
        assert checkpoints == list(get_model(model).checkpoint_names())


@pytest.mark.slow
@needs_chromium
def test_kill_9_of_the_manager_leaves_no_chromium_process(tmp_path: Path, db_path: Path) -> None:
    """The manager killed mid-cell: the worker dies with it (its parent-death signal), Chromium's browser process with
    the worker (setpriv's), and its zygotes and renderers once the browser is gone."""
    marker = f"{os.getpid()}-{time.time_ns()}"
    env, scratch = scratch_env(tmp_path, faulty_models(tmp_path / "models", "mlp", *BUSY_HANG))
    env["FWBENCH_TEST_MARKER"] = marker
    args = run_args("--models", "mlp", "--runtimes", RUNTIME, "--timeout", "300", db=db_path, max_time=0.2)
    manager = subprocess.Popen(
        [sys.executable, "-m", "fwbench", *args], env=env, cwd=REPO_DIR, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not chromium_processes(scratch) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert chromium_processes(scratch), "no Chromium started in time"
    finally:
        manager.send_signal(signal.SIGKILL)
        manager.wait()
    deadline = time.monotonic() + LEAVE_S
    while (chromium_processes(scratch) or external_workers(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    leftover = sorted(set(chromium_processes(scratch)) | set(external_workers(marker)))
    kill_all(leftover)
    assert leftover == [], "a worker or a Chromium process outlived the manager"
