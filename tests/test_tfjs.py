"""TensorFlow.js in Node.js (tfjs:wasm, tfjs:cpu): cells run by the JavaScript worker through the same protocol,
parity against the float64 reference, a defect in a JS model file caught and located, hangs and a killed manager
handled; the hand-over to a worker in another language also without Node.js (fwbench_fake_external).

The commands whose manager is not what a test checks run in this process (``fwbench.cli.main``: no interpreter to
start and no fwbench to import again; their workers are processes of their own all the same); a hang and a
killed manager run the command line in a process of its own. ``make test`` runs every model file on one backend and
the mlp on both (and diffs every model on both); the other backend's bert-tiny and resnet-tiny cells, and verify of an
unmodified model, are the matrix's."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import NEED_EXTRAS_ENV, REPO_DIR, fwbench_here, run_args, run_cli
from fwbench.frameworks.tfjs import external
from fwbench.models import get_model
from fwbench.runner.tempfolders import EXTERNAL_PREFIX, remove_stale
from fwbench.store.db import Store

TFJS = ("tfjs:wasm", "tfjs:cpu")
ATTENTION_DEFECT = ("Math.sqrt(d)), keyBias", "Math.sqrt(d) * 2), keyBias")  # bert.mjs: scores scaled by 1/(2√d)
# mlp.mjs: never finishes building, blocked for good as a deadlocked worker is (Atomics.wait on a value nobody
# changes: no CPU spent while the test waits out the timeout)
HANG = ("const last =", "Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0);\n  const last =")


@pytest.fixture
def node_installed() -> None:
    """Skip without Node.js and the packages, unless make test installed them (then their absence fails)."""
    missing = external.missing()
    if missing and os.environ.get(NEED_EXTRAS_ENV) == "all":
        pytest.fail(f"the tfjs runtimes cannot run, but ${NEED_EXTRAS_ENV}=all: {missing}")
    if missing:
        pytest.skip(missing)


needs_node = pytest.mark.usefixtures("node_installed")


def stored(db: Path) -> dict[tuple[str, str], tuple[str, str | None]]:
    """(model, runtime) → (status, reason) of every stored cell."""
    with Store.open(db) as store:
        return {(row.model, row.runtime): (row.status, row.reason) for row in store.results()}


def scratch_env(tmp_path: Path, env: dict[str, str] | None = None) -> tuple[dict[str, str], Path]:
    """``env`` (default: this process's) with a temporary folder of the test's own, and that folder."""
    scratch = tmp_path / "tmp"
    scratch.mkdir(exist_ok=True)
    return {**(env or os.environ), "TMPDIR": str(scratch)}, scratch


def scratch_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary folder of the test's own for a command run in this process (:func:`fwbench_here`): its workers'
    (``TMPDIR``, which they inherit) and its manager's (``tempfile.tempdir``, read once per process)."""
    scratch = tmp_path / "tmp"
    scratch.mkdir(exist_ok=True)
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    return scratch


def faulty_models(folder: Path, arch: str, old: str, new: str) -> dict[str, str]:
    """The environment of a run whose tfjs model files come from ``folder``: this package's, with ``old`` replaced
    by ``new`` in ``<arch>.mjs`` (which must contain it)."""
    folder.mkdir(parents=True, exist_ok=True)
    for source in external.PACKAGE_DIR.glob("*.mjs"):
        shutil.copy(source, folder / source.name)
    path = folder / f"{arch}.mjs"
    text = path.read_text()
    assert old in text, f"{arch}.mjs no longer contains {old!r}"
    path.write_text(text.replace(old, new))
    return {**os.environ, external.MODELS_ENV: str(folder)}


def use_faulty_models(monkeypatch: pytest.MonkeyPatch, folder: Path, arch: str, old: str, new: str) -> None:
    """:func:`faulty_models` for a command run in this process (and its workers)."""
    monkeypatch.setenv(external.MODELS_ENV, faulty_models(folder, arch, old, new)[external.MODELS_ENV])


def cmdline(pid: int) -> bytes:
    """Process ``pid``'s command line (empty once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def external_workers(marker: str) -> list[int]:
    """Pids of the processes whose environment holds ``FWBENCH_TEST_MARKER=marker`` (a run's workers, whatever
    program they became, and what they started)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                environ = (proc / "environ").read_bytes()
            except OSError:
                continue
            if f"FWBENCH_TEST_MARKER={marker}".encode() in environ.split(b"\0"):
                pids.append(int(proc.name))
    return pids


@pytest.mark.slow
@needs_node
@pytest.mark.parametrize(
    ("models", "runtimes"),
    [
        # both backends in one interleaved comparison group, beside a Python worker (the test plugin's numpy
        # runtime: it starts at once) whose blocks the manager interleaves with theirs
        (("mlp",), ("fake:sleep", *TFJS)),
        (("bert-tiny", "resnet-tiny"), ("tfjs:wasm",)),  # every other model file, on one backend
        # the other backend on these models: make test checks its outputs and every checkpoint against the float64
        # reference in test_diff_of_unmodified_tfjs_models_shows_every_checkpoint_within_its_share
        pytest.param(("bert-tiny", "resnet-tiny"), ("tfjs:cpu",), marks=pytest.mark.matrix),
    ],
    ids=["mlp-both-backends", "bert-resnet-wasm", "bert-resnet-cpu"],
)
def test_tfjs_cells_are_ok_with_parity_checked(
    tmp_path: Path,
    db_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    models: tuple[str, ...],
    runtimes: tuple[str, ...],
    plugin_env: dict[str, str],
) -> None:
    """tfjs cells run by the JavaScript worker, checked against the float64 reference; on the MLP, in one group with a
    Python worker (the plugin's fake:sleep, loaded for every case)."""
    args = run_args(
        *("--models", ",".join(models), "--runtimes", ",".join(runtimes)),
        *("--batch-sizes", "2", "--seq-lens", "8"),
        db=db_path,
        max_time=0.2,
    )
    scratch = scratch_here(tmp_path, monkeypatch)
    code, _, err = fwbench_here(capsys, *args)
    assert code == 0, err[-3000:]
    assert list(scratch.glob(f"{EXTERNAL_PREFIX}*")) == []  # each JavaScript worker removed the folder it read
    cells = stored(db_path)
    assert sorted(cells) == sorted((model, runtime) for model in models for runtime in runtimes)
    assert all(status == "ok" for status, _ in cells.values()), cells
    with Store.open(db_path) as store:
        for row in store.results():
            if not row.runtime.startswith("tfjs:"):
                continue
            details = row.details
            assert details["parity"]["ok"] is True and details["parity"]["reference"] == "numpy-float64"
            assert details["parity"]["tolerance_rel_l2"] == 1e-4
            assert details["versions"]["tfjs-core"] == "4.22.0"
            assert details["threads_effective"]["intra_op"] == 1
            assert details["tfjs_tensors"]["before_timing"] == details["tfjs_tensors"]["after_timing"]
            assert row.median_s is not None and row.median_s > 0
            assert row.peak_memory_bytes is not None and row.peak_memory_bytes > 0
            assert set(details["stage_seconds"]) >= {"start", "import", "build", "first_call", "warmup", "timing"}
            if row.model == "resnet-tiny":  # channels last, as TensorFlow's model
                assert details["layout"].startswith("NHWC")


@pytest.mark.slow
@needs_node
def test_tfjs_generates_the_reference_tokens_over_its_cache(
    tmp_path: Path, db_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Phase generate in the JavaScript worker (generate.mjs over each model file's cached step): the float64
    reference's greedy tokens on both decoders, a block of one generation (the calibration calls none), no tensor
    leaked; Python's record and token check (fwbench.runner.external generation)."""
    from fwbench.models.decoder import CausalDecoder
    from fwbench.models.generation import generation_weights, prompt_ids, reference_greedy
    from fwbench.runner.phases.generate import BLOCKS_PER_ROUND

    batch, prompt, new = 2, 12, 6
    flags = ("--phase", "generate", "--models", "gpt2-tiny,llama-tiny", "--runtimes", "tfjs:wasm")
    sizes = ("--batch-sizes", str(batch), "--prompt-lens", str(prompt), "--new-tokens", str(new))
    scratch = scratch_here(tmp_path, monkeypatch)
    code, _, err = fwbench_here(capsys, *run_args(*flags, *sizes, db=db_path, max_time=0.2))
    assert code == 0, err[-3000:]
    assert list(scratch.glob(f"{EXTERNAL_PREFIX}*")) == []
    with Store.open(db_path) as store:
        rows = store.results()
    assert sorted(row.model for row in rows) == ["gpt2-tiny", "llama-tiny"]
    for row in rows:
        assert row.status == "ok", row.reason
        details, generation = row.details, row.details["generation"]
        tokens = details["parity"]["tokens"]
        assert tokens["ok"] and tokens["judged"] and tokens["steps"] == new
        description = get_model(row.model)
        assert isinstance(description, CausalDecoder)
        weights = generation_weights(description, 0)
        expected = reference_greedy(description, weights, prompt_ids(description, batch, prompt, 0), new)
        if not any(t["took_the_other"] for t in tokens["near_ties"]):
            assert generation["tokens"] == expected.tolist()
        assert generation["timed_generations"] == BLOCKS_PER_ROUND
        assert generation["generations_called"] == details["warmup_calls"] + BLOCKS_PER_ROUND
        assert len(generation["decode_step_s_by_position"]) == new - 1 and generation["ttft_p50_s"] > 0
        assert details["tfjs_tensors"]["before_timing"] == details["tfjs_tensors"]["after_timing"]


@pytest.mark.slow
@needs_node
def test_hf2019_generation_blocks_count_the_same_timed_generations_in_javascript_as_in_python(
    db_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--protocol hf2019: blocks of 3 generations, the calibration's block not among the timed ones, in both workers."""
    from fwbench.runner.phases.generate import BLOCKS_PER_ROUND

    flags = (
        "--phase",
        "generate",
        "--models",
        "llama-tiny",
        "--runtimes",
        "torch:eager,tfjs:wasm",
        "--new-tokens",
        "3",
    )
    sizes = ("--batch-sizes", "1", "--prompt-lens", "4", "--protocol", "hf2019")
    code, _, err = fwbench_here(capsys, *run_args(*flags, *sizes, db=db_path))
    assert code == 0, err[-3000:]
    with Store.open(db_path) as store:
        timed = {row.runtime: row.details["generation"]["timed_generations"] for row in store.results()}
    assert timed == {"torch:eager": 3 * BLOCKS_PER_ROUND, "tfjs:wasm": 3 * BLOCKS_PER_ROUND}


@pytest.mark.slow
@needs_node
def test_a_tfjs_cache_written_one_position_late_is_a_mismatch_at_the_first_decode_step(
    tmp_path: Path, db_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """kvcache.mjs with every decode call's key and value written one position late: the prefill is right, the first
    decode step reads a zero where its own key belongs."""
    late = ("indices[n++] = start + i;", "indices[n++] = start + i + (s === 1 ? 1 : 0);")
    use_faulty_models(monkeypatch, tmp_path / "models", "kvcache", *late)
    flags = ("--phase", "generate", "--models", "llama-tiny", "--runtimes", "tfjs:wasm", "--new-tokens", "4")
    code, _, err = fwbench_here(capsys, *run_args(*flags, "--batch-sizes", "1", "--prompt-lens", "8", db=db_path))
    assert code == 0, err[-3000:]  # a mismatch is a result, stored with its reason
    ((status, reason),) = stored(db_path).values()
    assert status == "mismatch" and reason is not None and reason.startswith("generation step 1"), reason


@pytest.mark.slow
@needs_node
def test_the_2019_protocol_times_tfjs_in_blocks_of_three(db_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = run_args("--models", "mlp", "--runtimes", "tfjs:cpu", "--protocol", "hf2019", db=db_path)
    assert fwbench_here(capsys, *args)[0] == 0
    with Store.open(db_path) as store:
        (row,) = store.results()
    assert row.status == "ok" and row.calls_per_sample == 3


# make test keeps what this checks: the diffs of the unmodified models (below) run the same verify workers
# (fwbench.runner.verify.verify_arrays) and find every checkpoint and output within its share; the next test, a
# faulty model, checks verify's tfjs rows.
@pytest.mark.slow
@pytest.mark.matrix
@needs_node
def test_verify_passes_both_tfjs_backends_on_an_unmodified_model(capsys: pytest.CaptureFixture[str]) -> None:
    """Both backends verified against the float64 reference (each judged against it, whatever the order: no
    Python runtime needed beside them)."""
    code, out, err = fwbench_here(capsys, "verify", "--models", "bert-tiny", "--runtimes", ",".join(TFJS))
    assert code == 0, out + err
    rows = [line for line in out.splitlines() if "tfjs:" in line]
    assert len(rows) == 4 and all(line.rstrip(" │").endswith("ok") for line in rows), rows  # 2 outputs × 2 runtimes


@pytest.mark.slow
@needs_node
def test_verify_covers_tfjs_and_a_defect_in_a_js_model_file_is_a_located_mismatch(
    tmp_path: Path, db_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A defect in bert.mjs: verify and run name where it diverges."""
    use_faulty_models(monkeypatch, tmp_path / "models", "bert", *ATTENTION_DEFECT)
    code, out, err = fwbench_here(capsys, "verify", "--models", "bert-tiny", "--runtimes", "tfjs:wasm")
    assert code == 1, out + err
    assert "mismatch" in out
    assert "encoder.layer.0.attention.output" in out  # located by the worker, as a Python worker's

    args = run_args("--models", "bert-tiny", "--runtimes", "tfjs:cpu", "--seq-lens", "8", db=db_path, max_time=0.2)
    assert fwbench_here(capsys, *args)[0] == 0
    ((status, reason),) = stored(db_path).values()
    assert status == "mismatch" and reason is not None and "outputs differ from the reference" in reason
    assert "first divergence: encoder.layer.0.attention.output" in reason


@pytest.mark.slow
@needs_node
def test_diff_names_the_layer_of_a_defect_in_a_js_model_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    use_faulty_models(monkeypatch, tmp_path / "models", "bert", *ATTENTION_DEFECT)
    code, out, err = fwbench_here(capsys, "diff", "bert-tiny", "--runtimes", ",".join(TFJS), "--format", "json")
    assert code == 1, out + err
    for runtime in json.loads(out)["runtimes"]:
        assert runtime["status"] == "ok", runtime
        first = runtime["first_divergence"]
        assert first is not None and first["name"] == "encoder.layer.0.attention.output", first
        assert first["rel_l2"] > 3 * first["limit"]
        before = runtime["layers"][: [layer["name"] for layer in runtime["layers"]].index(first["name"])]
        assert all(layer["rel_l2"] <= 0.1 * layer["limit"] for layer in before), before


@pytest.mark.slow
@needs_node
@pytest.mark.parametrize("model", ["mlp", "bert-tiny", "gpt2-tiny", "llama-tiny", "resnet-tiny"])
def test_diff_of_unmodified_tfjs_models_shows_every_checkpoint_within_its_share(
    model: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each backend's checkpoints and outputs against the float64 reference's (a Python runtime's are
    tests/test_diff.py's)."""
    code, out, err = fwbench_here(capsys, "diff", model, "--runtimes", ",".join(TFJS), "--format", "json")
    assert code == 0, out + err
    diff = json.loads(out)
    assert [runtime["runtime"] for runtime in diff["runtimes"]] == list(TFJS)
    for runtime in diff["runtimes"]:
        assert runtime["status"] == "ok" and runtime["first_divergence"] is None, runtime
        checkpoints = [layer["name"] for layer in runtime["layers"] if layer["kind"] == "checkpoint"]
        assert checkpoints == list(get_model(model).checkpoint_names()), runtime["runtime"]  # ResNet's: NCHW


def hanging_run(tmp_path: Path, db_path: Path, timeout_s: int) -> tuple[list[str], dict[str, str], Path, str]:
    """A run of tfjs:wasm on an mlp.mjs that never finishes building: its arguments, environment (marked with a
    FWBENCH_TEST_MARKER of its own), temporary folder and marker."""
    marker = f"{os.getpid()}-{time.time_ns()}"
    env, scratch = scratch_env(tmp_path, faulty_models(tmp_path / "models", "mlp", *HANG))
    env["FWBENCH_TEST_MARKER"] = marker
    args = run_args(
        "--models", "mlp", "--runtimes", "tfjs:wasm", "--timeout", str(timeout_s), db=db_path, max_time=0.2
    )  # fmt: skip
    return args, env, scratch, marker


# Long enough for the Python worker to start, prepare and exec Node.js, and for Node.js to import TensorFlow.js and
# reach mlp.mjs's build: 4 to 5 s on a 2-core machine at a load average of 7 (at 4 s the worker was still importing),
# far less on a core of its own as under make test; "during build" below says the hang was reached. 20 s: a margin of
# 4x over that for a busier CI machine.
HANG_TIMEOUT_S = 20


@pytest.mark.slow
@needs_node
def test_a_hanging_tfjs_worker_is_a_timeout_and_leaves_nothing(tmp_path: Path, db_path: Path) -> None:
    args, env, scratch, marker = hanging_run(tmp_path, db_path, HANG_TIMEOUT_S)
    result = run_cli(*args, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    ((status, reason),) = stored(db_path).values()
    assert status == "timeout" and reason is not None, (status, reason)
    assert reason.startswith(f"exceeded --timeout {HANG_TIMEOUT_S} s during build"), reason  # in Node.js, in mlp.mjs
    assert external_workers(marker) == []
    assert list(scratch.glob(f"{EXTERNAL_PREFIX}*")) == []  # the manager removed what the killed worker left


@pytest.mark.slow
@needs_node
def test_kill_9_of_the_manager_leaves_no_node_process(tmp_path: Path, db_path: Path) -> None:
    args, env, scratch, marker = hanging_run(tmp_path, db_path, 300)
    manager = subprocess.Popen(
        [sys.executable, "-m", "fwbench", *args], env=env, cwd=REPO_DIR, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip

    def node_workers() -> list[int]:
        return [pid for pid in external_workers(marker) if b"worker.mjs" in cmdline(pid)]

    try:
        deadline = time.monotonic() + 120
        while not node_workers() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert node_workers(), "no node worker started in time"
    finally:
        manager.send_signal(signal.SIGKILL)
        manager.wait()
    deadline = time.monotonic() + 10
    while external_workers(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    leftover = external_workers(marker)
    for pid in leftover:  # never leave one behind, also when the assertion fails
        os.kill(pid, signal.SIGKILL)
    assert leftover == [], "a worker outlived its manager"
    # its folder is the next run's to remove (named after the dead worker's pid: fwbench.runner.tempfolders)
    left = sorted(str(path) for path in scratch.glob(f"{EXTERNAL_PREFIX}*"))
    assert sorted(path for path in remove_stale(str(scratch)) if EXTERNAL_PREFIX in path) == left
    assert list(scratch.glob(f"{EXTERNAL_PREFIX}*")) == []


def test_without_node_list_says_so_and_a_run_skips_tfjs(
    db_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(external.NODE_ENV, "/nonexistent/node")
    expected = "Node.js is not installed ($FWBENCH_NODE=/nonexistent/node is not an executable): install Node.js 18.0.0"
    assert (external.missing() or "").startswith(expected)
    code, out, _ = fwbench_here(capsys, "list")
    assert code == 0 and "Node.js is not installed" in out
    args = run_args("--models", "mlp", "--runtimes", "tfjs:wasm", db=db_path, max_time=0.2)
    code, _, err = fwbench_here(capsys, *args)
    assert code == 0, err[-2000:]
    ((status, reason),) = stored(db_path).values()
    assert status == "skipped" and reason is not None and "Node.js is not installed" in reason


def test_tfjs_cells_outside_interleaved_rounds_are_refused_with_the_reason(
    db_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = run_args("--models", "mlp", "--runtimes", "tfjs:cpu", "--interleave", "off", db=db_path, max_time=0.2)
    code, _, err = fwbench_here(capsys, *args)
    assert code == 2  # asked for by name: bad input, one line, before anything runs
    assert "tfjs:cpu is timed in interleaved rounds only" in err
    assert not db_path.exists()


def test_a_model_without_a_js_file_is_refused_with_the_reason() -> None:
    from fwbench.frameworks import get_runtime, missing_implementation

    assert missing_implementation(get_runtime("tfjs:wasm"), "gemm") == "no tfjs implementation of gemm yet"
    for arch in ("mlp", "bert", "gpt2", "llama", "resnet"):
        assert missing_implementation(get_runtime("tfjs:wasm"), arch) is None


def test_the_estimate_counts_tfjs_on_one_thread_at_its_share_of_the_nominal_throughput() -> None:
    from fwbench.frameworks import get_runtime
    from fwbench.runner.estimate import PER_CALL_OVERHEAD_S, call_s
    from fwbench.spec import Settings

    settings = Settings(threads=2)
    native = call_s(10**10, settings, "torch:eager") - PER_CALL_OVERHEAD_S
    for name in TFJS:
        share = get_runtime(name).throughput_share
        assert call_s(10**10, settings, name) - PER_CALL_OVERHEAD_S == pytest.approx(native * 2 / share)


# -- a worker in another language, without Node.js: tests/fake_external_worker.py --------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(("scale", "status"), [("1", "ok"), ("1.01", "mismatch")])
def test_a_worker_in_another_language_runs_a_cell_through_the_protocol(
    plugin_env: dict[str, str],
    tmp_path: Path,
    db_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    scale: str,
    status: str,
) -> None:
    monkeypatch.setenv("FAKE_EXTERNAL_SCALE", scale)
    scratch = scratch_here(tmp_path, monkeypatch)
    args = run_args("--models", "mlp", "--runtimes", "fakeext:numpy", db=db_path, rounds=2, max_time=0.4)
    code, _, err = fwbench_here(capsys, *args)
    assert code == 0, err[-2000:]
    with Store.open(db_path) as store:
        (row,) = store.results()
    assert row.status == status, row.reason
    assert row.details["parity"]["shape"] == [2, None]  # checked by python -m fwbench.runner.external compare
    if status == "ok":
        assert row.median_s is not None and row.median_s > 0 and row.calls_per_sample is not None
    else:
        assert row.reason is not None and row.reason.startswith("outputs differ from the reference: logits")
        assert "no checkpoints to locate it" in row.reason  # the fake worker writes its outputs only
    assert list(scratch.glob(f"{EXTERNAL_PREFIX}*")) == []
