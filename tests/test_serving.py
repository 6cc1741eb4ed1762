"""Phase serving (fwbench.serving): the KServe v2 protocol, the server's answers to bad input, dynamic batching
against the direct path, an overloaded point that ends with its drops counted, and serving cells run by the manager
(parity under load; a killed server is an error and leaves no process). No timing thresholds: every bound below
holds by construction (a point ends within its duration plus the request timeout)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from conftest import REPO_DIR, fwbench_here, listening_off_loopback, marked_processes_left, require, run_args, run_cli
from fwbench.details import LoadPoint
from fwbench.models import get_model
from fwbench.serving.batcher import CallerThreadExecutor, DynamicBatcher
from fwbench.serving.loadgen import (
    OFFLINE,
    OFFLINE_DURATIONS,
    PEAK_CEILING,
    SERVER,
    Client,
    Plan,
    meets,
    peak_search,
    run_point,
)
from fwbench.serving.model import ServedModel, buckets_for, pad_rows, specs_of
from fwbench.serving.protocol import HEADER_LENGTH, ProtocolError, decode_request, decode_response, encode_request
from fwbench.spec import Settings
from headless_chromium import chromium_path, inspect_page

aiohttp = require("aiohttp")
for _extra in ("mlperf_loadgen", "starlette", "uvicorn"):  # the serving extra: skipped (not broken) without it
    require(_extra)

from fwbench.serving.app import make_app  # noqa: E402
from fwbench.serving.server import HttpServer, PortInUse, bind  # noqa: E402


class Doubler:
    """A numpy model for the server's own tests: y = 2 x, optionally slow (seconds per batch); it raises on a batch
    holding a negative value."""

    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds = seconds

    def make_inputs(self, arrays: dict[str, np.ndarray]) -> tuple[Any, ...]:
        return (arrays["x"],)

    def infer(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
        if self.seconds:
            time.sleep(self.seconds)
        if (inputs[0] < 0).any():
            raise ArithmeticError("a negative input")
        return (inputs[0] * 2,)

    def to_numpy(self, outputs: Sequence[Any]) -> dict[str, np.ndarray]:
        return {"y": np.asarray(outputs[0])}


def doubler_model(max_batch: int = 4, seconds: float = 0.0) -> ServedModel:
    x = {"x": np.zeros((1, 3), np.float32)}
    runners = {bucket: Doubler(seconds) for bucket in buckets_for(max_batch)}
    return ServedModel("double", runners, specs_of(x), specs_of({"y": x["x"]}), "test")


def post(url: str, body: bytes, headers: Mapping[str, str] | None = None) -> tuple[int, bytes, str | None]:
    """(status, body, the response's header length) of one POST."""

    async def send() -> tuple[int, bytes, str | None]:
        async with aiohttp.ClientSession() as session:
            async with session.post(url, data=body, headers=dict(headers or {})) as response:
                return response.status, await response.read(), response.headers.get(HEADER_LENGTH)

    return asyncio.run(send())


@pytest.fixture
def model_thread() -> Iterator[ThreadPoolExecutor]:
    """A thread of its own for a numpy model (a framework's model runs on the thread that built it)."""
    with ThreadPoolExecutor(max_workers=1) as executor:
        yield executor


@pytest.fixture
def doubler_server(model_thread: ThreadPoolExecutor) -> Iterator[HttpServer]:
    with HttpServer(make_app(DynamicBatcher(doubler_model(), 4, 0.001, 16, model_thread))) as server:
        yield server


def test_requests_round_trip_as_json_and_as_binary_tensors() -> None:
    arrays: dict[str, np.ndarray] = {
        "ids": np.arange(6, dtype=np.int64).reshape(2, 3),
        "x": np.linspace(0, 1, 4, dtype=np.float32),
    }
    for binary in (False, True):
        body, header_length = encode_request(arrays, binary=binary, request_id="7")
        assert (header_length is None) == (not binary)
        parsed = decode_request(body, None if header_length is None else str(header_length))
        assert parsed.id == "7" and parsed.binary_outputs == binary and list(parsed.inputs) == ["ids", "x"]
        for name, array in arrays.items():
            assert parsed.inputs[name].dtype == array.dtype and np.array_equal(parsed.inputs[name], array)


SHORT_BINARY = (
    b'{"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "parameters": {"binary_data_size": 12}}]}'
)


@pytest.mark.parametrize(
    ("body", "header_length", "says"),
    [
        (b"not json", None, "not JSON"),
        (b'{"inputs": []}', None, "non-empty inputs"),
        (b'{"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP99", "data": [1, 2, 3]}]}', None, "datatype"),
        (b'{"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2]}]}', None, "2 values"),
        (b'{"inputs": [{"name": "x", "shape": [1, -3], "datatype": "FP32", "data": []}]}', None, "non-negative"),
        (SHORT_BINARY + b"\x00\x00", str(len(SHORT_BINARY)), "does not fit"),
        (b"{}", "999", "outside the body"),
    ],
)  # fmt: skip
def test_malformed_payloads_are_refused(body: bytes, header_length: str | None, says: str) -> None:
    with pytest.raises(ProtocolError, match=says) as raised:
        decode_request(body, header_length)
    assert raised.value.status == 400


def test_bad_requests_get_4xx_and_the_server_keeps_answering(doubler_server: HttpServer) -> None:
    infer = f"{doubler_server.url}/v2/models/double/infer"
    good, _ = encode_request({"x": np.ones((1, 3), np.float32)}, binary=False)
    bad = {
        "junk": (infer, b"\xff\x00junk", {}),
        "wrong dtype": (infer, encode_request({"x": np.ones((1, 3), np.float64)}, binary=False)[0], {}),
        "wrong shape": (infer, encode_request({"x": np.ones((1, 5), np.float32)}, binary=False)[0], {}),
        "too many rows": (infer, encode_request({"x": np.ones((5, 3), np.float32)}, binary=False)[0], {}),
        "unknown input": (infer, encode_request({"z": np.ones((1, 3), np.float32)}, binary=False)[0], {}),
        "bad header length": (infer, good, {HEADER_LENGTH: "many"}),
        "unknown model": (f"{doubler_server.url}/v2/models/other/infer", good, {}),
    }
    for case, (url, body, headers) in bad.items():
        status, answer, _ = post(url, body, headers)
        assert 400 <= status < 500, (case, status, answer)
        assert json.loads(answer)["error"], case
        status, answer, _ = post(infer, good)  # still serving, and right
        assert status == 200, case
        assert json.loads(answer)["outputs"][0]["data"] == [2.0, 2.0, 2.0]


def test_a_model_that_raises_fails_its_batch_with_500_and_the_server_keeps_answering(
    doubler_server: HttpServer,
) -> None:
    infer = f"{doubler_server.url}/v2/models/double/infer"
    status, answer, _ = post(infer, encode_request({"x": -np.ones((1, 3), np.float32)}, binary=False)[0])
    assert status == 500 and "ArithmeticError: a negative input" in json.loads(answer)["error"]
    status, answer, _ = post(infer, encode_request({"x": np.ones((1, 3), np.float32)}, binary=False)[0])
    assert status == 200 and json.loads(answer)["outputs"][0]["data"] == [2.0, 2.0, 2.0]
    status, answer, _ = post(
        infer, b'{"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "parameters": 7}]}'
    )
    assert status == 400 and "parameters must be an object" in json.loads(answer)["error"]


def _point(fraction: float, p99_s: float, lost: int = 0) -> LoadPoint:
    return LoadPoint("Server", f"at {fraction}", fraction, achieved_qps=1000 * fraction, p99_s=p99_s, dropped=lost)


@pytest.mark.parametrize(
    ("knee", "probed", "peak"),
    [
        (0.6, [0.25, 0.5, 0.75, 0.9, 0.625, 0.5625], 562.5),  # the ladder brackets the knee, the probes halve it
        (2.0, [0.25, 0.5, 0.75, 0.9, (0.9 + PEAK_CEILING) / 2, (0.9 + 3 * PEAK_CEILING) / 4], None),  # never fails
        (0.1, [0.25, 0.5, 0.75, 0.9, 0.125, 0.0625], 62.5),  # even the lightest step fails: below it
    ],
)
def test_the_peak_search_brackets_the_highest_load_under_the_bound(
    knee: float, probed: list[float], peak: float | None
) -> None:
    """A server whose p99 meets the bound up to ``knee`` × capacity: the ladder, then bisection toward the knee
    (above the capacity when every step met the bound); the peak is the highest achieved load that met it."""
    seen: list[float] = []

    def measure(fraction: float) -> LoadPoint:
        seen.append(fraction)
        return _point(fraction, 0.01 if fraction <= knee else 0.05)

    points, found = peak_search((0.25, 0.5, 0.75, 0.9), 2, measure, 0.02)
    assert seen == pytest.approx(probed) and [p.fraction for p in points] == seen
    assert found == pytest.approx(peak if peak is not None else 1000 * probed[-1])
    _, lossy = peak_search((0.5,), 0, lambda f: _point(f, 0.001, lost=1), 0.02)
    assert lossy is None  # a point that lost a query never meets the bound, however low its p99


def test_a_binary_request_gets_a_binary_answer(doubler_server: HttpServer) -> None:
    x = np.array([[1.5, 2.0, 3.25]], np.float32)
    body, header_length = encode_request({"x": x})
    status, answer, answer_header = post(
        f"{doubler_server.url}/v2/models/double/infer", body, {HEADER_LENGTH: str(header_length)}
    )
    assert status == 200 and answer_header is not None
    assert np.array_equal(decode_response(answer, answer_header)["y"], 2 * x)


def test_a_port_in_use_is_a_clear_error() -> None:
    taken = bind(0)
    try:
        with pytest.raises(PortInUse, match=rf"port {taken.getsockname()[1]} on 127.0.0.1 is in use"):
            bind(taken.getsockname()[1])
    finally:
        taken.close()


def test_padding_repeats_the_last_row_and_answers_only_the_real_rows() -> None:
    model = doubler_model(max_batch=4)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert pad_rows({"x": x}, 4)["x"].tolist() == [*x.tolist(), x[1].tolist(), x[1].tolist()]
    out = model.run({"x": x})
    assert np.array_equal(out["y"], 2 * x) and model.padded_rows == 2 and model.bucket_for(2) == 4


def test_an_overloaded_point_ends_on_time_with_its_drops_counted(
    tmp_path: Path, model_thread: ThreadPoolExecutor
) -> None:
    """A server computing 50 batches/s at most, offered 2000 requests/s: it sheds what its queue cannot hold (503),
    and the point ends once its duration and the request timeout have passed, every query accounted for; an Offline
    point sized for a far higher rate ends by its own deadline, its late queries timed out."""
    samples = tmp_path / "samples.npz"
    np.savez(samples, x=np.random.default_rng(0).random((8, 3), dtype=np.float32))
    batcher = DynamicBatcher(doubler_model(max_batch=1, seconds=0.02), 1, 0.0, 4, model_thread, max_wait_s=0.5)
    with HttpServer(make_app(batcher)) as server:
        plan = Plan(
            infer_url=f"{server.url}/v2/models/double/infer",
            stats_url=f"{server.url}/v2/models/double/stats",
            samples=str(samples),
            duration_s=0.5,
            request_timeout_s=1.0,
            offline_in_flight=2,
        )
        client = Client(plan, {"x": np.load(samples)["x"]})
        try:
            started = time.monotonic()
            point = run_point(client, SERVER, "overload", 2000.0, 10.0)
            elapsed = time.monotonic() - started
            started = time.monotonic()
            offline = run_point(client, OFFLINE, "offline", 2000.0)  # 1000 queries, 2 in flight, 50 answers/s
            offline_s = time.monotonic() - started
        finally:
            client.close()
    assert offline.timed_out and offline.queries == (offline.answered or 0) + offline.lost
    assert offline_s < OFFLINE_DURATIONS * 0.5 + 1.0 + 30  # its deadline, then LoadGen's end (slack for a slow CI)
    answered, queries = point.answered or 0, point.queries or 0
    assert point.dropped and queries == answered + point.lost and queries > answered and not meets(point, 1.0)
    assert point.batch_rows and set(point.batch_rows) == {"1"}  # max batch 1: the direct path
    # by construction: the last query is scheduled by 0.5 s and ends within the 1 s timeout (slack for a slow CI)
    assert elapsed < 0.5 + 1.0 + 30


def test_the_batching_path_and_the_direct_path_give_the_same_outputs() -> None:
    """A real backend (torch:eager, bert-tiny): each request alone (batch 1) and the same requests batched together
    (bucket 4, one of them padded) agree within the fp32 parity limit, and they did run as one batch."""
    require("torch")
    from fwbench.frameworks import create_backend

    description = get_model("bert-tiny")
    weights = description.canonical_weights(0)
    runners = {}
    for bucket in (1, 4):
        backend = create_backend("torch:eager", "cpu", Settings())
        backend.configure_threads(1, 1)
        backend.configure_precision()
        backend.build(description, weights)
        backend.compile(backend.make_inputs(description.make_inputs(bucket, 16, 0)))
        runners[bucket] = backend
    arrays = description.make_inputs(3, 16, 1)
    probe = runners[1].to_numpy(runners[1].infer(runners[1].make_inputs(description.make_inputs(1, 16, 0))))
    model = ServedModel("bert-tiny", runners, specs_of(arrays), specs_of(probe), "test")
    rows = [{name: array[i : i + 1] for name, array in arrays.items()} for i in range(3)]
    direct = [model.run(row) for row in rows]

    executor = CallerThreadExecutor()  # the backends run here, where they were built (as in a serving worker)
    batcher = DynamicBatcher(model, 4, 0.5, 16, executor)  # a long delay: the three requests meet in one batch

    async def batched() -> list[dict[str, np.ndarray]]:
        try:
            return list(await asyncio.gather(*(batcher.submit(row, 1) for row in rows)))
        finally:
            await batcher.close()

    with ThreadPoolExecutor(max_workers=1) as loop_thread:
        answering = loop_thread.submit(asyncio.run, batched())
        executor.serve_until(answering.done)
        answers, stats = answering.result(), batcher.stats
    assert dict(stats.batch_rows) == {3: 1}
    reference = description.reference_forward(weights, arrays)
    assert reference is not None
    for name in reference:
        one_by_one = np.concatenate([d[name] for d in direct])
        together = np.concatenate([a[name] for a in answers])
        scale = float(np.linalg.norm(one_by_one)) or 1.0
        assert float(np.linalg.norm(together - one_by_one)) / scale < 1e-5, name
        assert float(np.linalg.norm(together - reference[name])) / float(np.linalg.norm(reference[name])) < 1e-4


def _rows(db: Path) -> list[dict[str, object]]:
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(row) for row in conn.execute("SELECT * FROM results ORDER BY id")]


# Points of 0.1 s: even TorchServe's lightest Server point gets queries (5 on a loaded 2-core machine, MLPerf LoadGen
# issues at least one), which is all the checks below need.
SERVING_FLAGS = ("--phase", "serving", "--batch-sizes", "4", "--point-duration", "0.1s")


@pytest.mark.slow
def test_serving_cells_answer_under_load_with_parity_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The floor, a framework behind fwbench's server and TorchServe as it ships: every load point recorded (in
    the details and the store's load_points), the answers under load checked (the floor's exactly), SingleStream
    requests stored as the samples, the client on a CPU of its own; the table and the HTML page show them."""
    require("mlperf_loadgen")
    require("ts")
    db = tmp_path / "s.db"
    runtimes = "floor:identity,torch:eager,torchserve:torch"
    marker = uuid.uuid4().hex
    env = {**os.environ, "FWBENCH_TEST_MARKER": marker}  # TorchServe's Java frontend and model worker inherit it
    done = run_cli(*run_args(*SERVING_FLAGS, "--models", "mlp", "--runtimes", runtimes, db=db), env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert marked_processes_left(marker) == []  # every server, load generator and TorchServe process ended
    assert "Serving under load" in done.stdout and "floor p99 @ 50%" in done.stdout
    # serving's own tables only: no speed-up over a baseline (the floor is no runtime to be "faster" than)
    assert "speed-up over" not in done.stdout and "vs torch:eager" not in done.stdout
    rows = {row["runtime"]: row for row in _rows(db)}
    for runtime, row in rows.items():
        assert row["status"] == "ok", (runtime, row["reason"])
        details = json.loads(str(row["details_json"]))
        serving = details["serving"]
        labels = [point["label"] for point in serving["points"]]
        assert labels[:6] == ["single-stream", "offline", "server@0.25", "server@0.50", "server@0.75", "server@0.90"]
        assert serving["max_batch"] == 4 and serving["buckets"] == [1, 4] and serving["capacity_qps"] > 0
        for point in serving["points"]:
            assert point["queries"] == point["answered"] + point["dropped"] + point["timed_out"] + point["failed"]
        assert details["parity"]["ok"] and details["parity"]["under_load"]
        assert serving["checked_answers"] > 0 and float(str(row["median_s"])) > 0
        cpus = details["serving_cpus"]
        if len(os.sched_getaffinity(0)) > 1:  # a CPU of its own for the load generator
            assert not cpus["shared"] and not set(cpus["client"]) & set(cpus["server"]), cpus
        assert serving["checked_from"].startswith(("server@", "peak@"))
    floor = json.loads(str(rows["floor:identity"]["details_json"]))["parity"]
    assert floor["exact"] and all(error["max_abs"] == 0.0 for error in floor["outputs"].values())
    native = json.loads(str(rows["torchserve:torch"]["details_json"]))
    assert native["compile_report"]["max_batch_delay_ms"] == 1 and native["server_cpu_s"] > 0
    assert native["compile_report"]["torchserve_properties"]["number_of_netty_threads"] == 1
    assert native["versions"]["torchserve"] == "0.12.0"
    with sqlite3.connect(db) as conn:
        stored = conn.execute(
            "SELECT r.runtime, COUNT(*), SUM(p.answered) FROM load_points p JOIN results r ON r.id = p.result_id "
            "GROUP BY r.runtime"
        ).fetchall()
    points = {runtime: len(json.loads(str(row["details_json"]))["serving"]["points"]) for runtime, row in rows.items()}
    assert {runtime: count for runtime, count, _ in stored} == points
    assert all(answered > 0 for _, _, answered in stored)
    page = tmp_path / "report.html"
    code, _, err = fwbench_here(capsys, "report", "--db", str(db), "--html", str(page))  # in this process
    assert code == 0, err
    if chromium_path() is not None:  # .ci/run installs it; the HTML tests say so when it is missing
        seen = inspect_page(page, tmp_path / "report.png", str(chromium_path()))
        assert seen.errors == [] and "Serving under load" in seen.body_text
        plots = [i for i in seen.images if str(i.get("alt", "")).startswith("p99 latency against offered load")]
        assert len(plots) == 1 and plots[0]["complete"] and plots[0]["naturalWidth"] > 200, seen.images
        assert len(seen.images) == 1, seen.images  # no heat map, no latency-against-shape plot, no empty panel
        assert "Summary against the baseline" not in seen.body_text and "Per model" not in seen.body_text


@pytest.mark.slow
def test_a_killed_server_is_an_error_and_leaves_no_process(tmp_path: Path) -> None:
    """SIGKILL the serving worker (the server) while the load generator drives it: the cell is stored as an error
    that says so, the sweep ends, and no process of the run is left (the load generator dies with its server)."""
    require("mlperf_loadgen")
    marker = uuid.uuid4().hex
    env = {**os.environ, "FWBENCH_TEST_MARKER": marker}
    db = tmp_path / "k.db"
    args = run_args(*SERVING_FLAGS, "--models", "mlp", "--runtimes", "floor:identity", "--point-duration", "5s", db=db)
    run = subprocess.Popen([sys.executable, "-m", "fwbench", *args], env=env, cwd=REPO_DIR,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        server = None
        deadline = time.monotonic() + 120
        while server is None and time.monotonic() < deadline and run.poll() is None:
            for process in psutil.process_iter(["cmdline"]):
                if "fwbench.serving.loadgen" in " ".join(process.info["cmdline"] or ()):
                    try:
                        if process.environ().get("FWBENCH_TEST_MARKER") == marker:
                            server = process.parent()
                    except (psutil.NoSuchProcess, psutil.AccessDenied):
                        continue
            time.sleep(0.1)
        assert server is not None, "the load generator never started"
        assert listening_off_loopback({server.pid}) == []
        os.kill(server.pid, signal.SIGKILL)
        out, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == 0, err[-2000:]
    (row,) = _rows(db)
    assert row["status"] == "error" and "SIGKILL" in str(row["reason"]), row["reason"]
    assert marked_processes_left(marker) == []


def test_phase_serving_leaves_the_load_generator_a_core_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --threads, a serving cell's budget is the physical cores less one (at least 1); other phases take
    them all; --threads wins."""
    from fwbench.measure import environment
    from fwbench.runner import planner
    from fwbench.runner.planner import PlanChoices, resolve_plan

    monkeypatch.setattr(planner, "check_threads_fit", lambda settings: None)  # budgets beyond this test's own CPUs
    for cores, served in ((4, 3), (2, 1), (1, 1)):
        monkeypatch.setattr(environment, "physical_core_count", lambda cores=cores: cores)
        serving = resolve_plan(PlanChoices(models="mlp", runtimes="floor:identity", phase="serving"))
        inference = resolve_plan(PlanChoices(models="mlp", runtimes="torch:eager", phase="inference"))
        assert (serving.settings.threads, inference.settings.threads) == (served, cores)
    given = resolve_plan(PlanChoices(models="mlp", runtimes="floor:identity", phase="serving", settings={"threads": 2}))
    assert given.settings.threads == 2
