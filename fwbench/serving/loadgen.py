"""The load generator: MLPerf LoadGen scenarios sent to a fwbench server through an asynchronous HTTP client
(aiohttp), in its own process (``python -m fwbench.serving.loadgen``) pinned to CPUs the server does not use.

LoadGen decides when each query is sent and counts its latency from that *scheduled* time, so a slow server cannot
hide its queue (the coordinated omission of closed-loop tools). Every query ends: answered, refused (503, ``dropped``:
a full queue, or a wait in it past the server's limit), past its deadline (``timed_out``), or failed (any other
answer, ``failed``). A Server or SingleStream query's deadline is the request timeout after its send; an Offline
query's, counted from the point's start, is ``OFFLINE_DURATIONS`` durations plus the timeout: a point ends by then,
whatever the server does. A point's achieved rate is its answers over the time from its first send to its last
answer (LoadGen's start and log writing left out). Before each point the client waits for the server's queue to
empty, so no point inherits another's backlog.

One pass (:func:`run_plan`), for one round of a serving cell: SingleStream (one query at a time: the unloaded
latency, and the client's own per-request times), Offline (every query at once, at most ``offline_in_flight`` in
flight, sized for the unloaded rate × ``max_batch``: the capacity), the Server scenario (Poisson arrivals) at each
``ladder`` fraction of that capacity, then ``peak_probes`` Server points bisecting for the highest load whose p99
stays under the bound with no query lost (:func:`peak_search`; above the capacity too when every ladder point met
the bound). The answers kept for the parity check are those of the heaviest Server point that had any (its first
answer to each of up to ``parity_samples`` samples).
Reads the plan (JSON) on stdin, writes the result (JSON) on stdout; imports no framework. The client's garbage
collector is off while a point runs (the instrument must not pause; the server's is left as a deployment has it).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fwbench.details import LoadPoint
from fwbench.orphans import die_with_manager
from fwbench.serving.protocol import HEADER_LENGTH, decode_response, encode_request

SINGLE_STREAM, OFFLINE, SERVER = "SingleStream", "Offline", "Server"
OFFLINE_DURATIONS = 4  # an Offline point sized for an overestimated capacity may take this many durations
PEAK_CEILING = 1.25  # the peak search's upper end (× capacity) when every ladder point met the bound
DRAIN_POLL_S = 0.02


@dataclass(frozen=True)
class Plan:
    """One pass of load against the server at ``infer_url`` (times in seconds, loads in queries per second)."""

    infer_url: str  # where queries go: fwbench's /v2/models/{name}/infer, or a native server's own
    stats_url: str | None  # the server's counters (fwbench's /v2/models/{name}/stats); None: it has none
    samples: str  # .npz of the query samples: every input as (samples, ...) arrays
    duration_s: float = 2.0  # each point's scheduled duration
    ladder: tuple[float, ...] = (0.25, 0.5, 0.75, 0.9)  # Server points as fractions of the Offline capacity
    p99_bound_s: float = 0.02
    peak_probes: int = 2
    request_timeout_s: float = 2.0
    offline_in_flight: int = 16  # Offline: requests in flight at once (the server's queue is not flooded)
    max_batch: int = 8  # the server's max batch size: sizes the Offline point
    parity_samples: int = 4  # answers kept from the heaviest Server point (checked against the reference)
    responses: str | None = None  # .npz the kept responses go to ("<sample>/<output>")
    seed: int = 0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        data = dict(data)
        data["ladder"] = tuple(data.get("ladder", cls.ladder))
        return cls(**data)


def meets(point: LoadPoint, bound_s: float) -> bool:
    """Whether ``point``'s p99 stayed under ``bound_s`` with no query lost."""
    return point.p99_s is not None and point.p99_s <= bound_s and point.lost == 0


def _seconds(value: Any) -> float | None:
    """A LoadGen nanosecond figure in seconds (None where it wrote none)."""
    return value / 1e9 if isinstance(value, (int, float)) else None


def loadgen_results(detail_log: Path) -> dict[str, Any]:
    """The ``result_*`` entries of LoadGen's detail log (its ``:::MLLOG`` JSON lines) by key."""
    results: dict[str, Any] = {}
    for line in detail_log.read_text().splitlines():
        if line.startswith(":::MLLOG"):
            entry = json.loads(line[len(":::MLLOG") :])
            if str(entry.get("key", "")).startswith("result_"):
                results[entry["key"]] = entry.get("value")
    return results


class Client:
    """The asynchronous HTTP client on its own event-loop thread; LoadGen's threads hand it queries."""

    def __init__(self, plan: Plan, samples: dict[str, np.ndarray]) -> None:
        import aiohttp

        self.plan = plan
        self.infer_url = plan.infer_url
        self.stats_url = plan.stats_url
        count = len(next(iter(samples.values())))
        self.bodies: list[tuple[bytes, dict[str, str]]] = []
        for index in range(count):
            body, header_length = encode_request({name: array[index : index + 1] for name, array in samples.items()})
            self.bodies.append((body, {HEADER_LENGTH: str(header_length), "Content-Type": "application/octet-stream"}))
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="fwbench-client", daemon=True)
        self._thread.start()
        self._aiohttp = aiohttp
        self.session = self.call(self._open())
        self.counts: Counter[str] = Counter()
        self.first_failure: str | None = None
        self.kept: dict[int, dict[str, np.ndarray]] = {}  # this point's first answer to each of a few samples
        self.keep = False
        self.latencies_s: list[float] = []  # the client's own send-to-answer times (SingleStream)
        self.record_latencies = False
        self.in_flight: asyncio.Semaphore | None = None
        self.deadline: float | None = None  # a point's shared deadline (Offline), else each query's own timeout
        self.first_send: float | None = None
        self.last_answer: float | None = None

    async def _open(self) -> Any:
        connector = self._aiohttp.TCPConnector(limit=512, force_close=False)
        return self._aiohttp.ClientSession(connector=connector)

    def call(self, coroutine: Any) -> Any:
        """Run ``coroutine`` on the client's loop and wait for its value."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def issue(self, queries: Sequence[Any], complete: Callable[[int], None]) -> None:
        """Send each query (LoadGen's thread); ``complete(id)`` is called once it ended, whatever the outcome."""
        for query in queries:
            self.loop.call_soon_threadsafe(self._spawn, query.id, query.index, complete)

    def _spawn(self, query_id: int, index: int, complete: Callable[[int], None]) -> None:
        self.loop.create_task(self._send(query_id, index, complete))

    async def _send(self, query_id: int, index: int, complete: Callable[[int], None]) -> None:
        body, headers = self.bodies[index]
        started = time.perf_counter()
        if self.first_send is None:
            self.first_send = started
        limit = self.plan.request_timeout_s if self.deadline is None else max(0.0, self.deadline - started)
        try:
            outcome = await asyncio.wait_for(self._queued_post(body, headers, index), limit)
        except TimeoutError:
            outcome = "timed_out"
        except Exception as exc:  # refused connection, reset: the server is gone or broken
            outcome = "failed"
            self.first_failure = self.first_failure or f"{type(exc).__name__}: {exc}"
        self.counts[outcome] += 1
        finished = time.perf_counter()
        if outcome == "answered":
            self.last_answer = finished
            if self.record_latencies:
                self.latencies_s.append(finished - started)
        complete(query_id)

    async def _queued_post(self, body: bytes, headers: dict[str, str], index: int) -> str:
        """The post, after a place among those in flight where the point limits them (Offline)."""
        if self.in_flight is None:
            return await self._post(body, headers, index)
        async with self.in_flight:
            return await self._post(body, headers, index)

    async def _post(self, body: bytes, headers: dict[str, str], index: int) -> str:
        async with self.session.post(self.infer_url, data=body, headers=headers) as response:
            payload = await response.read()
            if response.status == 503:
                return "dropped"
            if response.status != 200:
                self.first_failure = (
                    self.first_failure or f"HTTP {response.status}: {payload[:300].decode(errors='replace')}"
                )
                return "failed"
            if self.keep and index not in self.kept and len(self.kept) < self.plan.parity_samples:
                self.kept[index] = decode_response(payload, response.headers.get(HEADER_LENGTH))
            return "answered"

    def server_stats(self) -> dict[str, Any] | None:
        """The server's counters (GET .../stats); None when it has none or does not answer."""
        stats_url = self.stats_url
        if stats_url is None:
            return None

        async def fetch() -> dict[str, Any] | None:
            try:
                async with asyncio.timeout(self.plan.request_timeout_s):  # a hung server: no counters, no hang
                    async with self.session.get(stats_url) as response:
                        return dict(await response.json()) if response.status == 200 else None
            except Exception:
                return None

        value: dict[str, Any] | None = self.call(fetch())
        return value

    def drain(self) -> None:
        """Wait until the server's queue is empty (its counters say so), at most the request timeout, so the next
        point starts on an idle server (a server without counters, TorchServe, is not waited for)."""
        deadline = time.monotonic() + self.plan.request_timeout_s
        while time.monotonic() < deadline:
            stats = self.server_stats()
            if stats is None or not stats.get("queued_rows"):
                return
            time.sleep(DRAIN_POLL_S)

    def close(self) -> None:
        self.call(self.session.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)


def _settings(scenario: str, plan: Plan, target_qps: float, count: int) -> Any:
    import mlperf_loadgen as lg

    settings = lg.TestSettings()
    settings.scenario = {SINGLE_STREAM: lg.TestScenario.SingleStream, OFFLINE: lg.TestScenario.Offline,
                         SERVER: lg.TestScenario.Server}[scenario]  # fmt: skip
    settings.mode = lg.TestMode.PerformanceOnly
    settings.min_duration_ms = int(plan.duration_s * 1000)  # Offline: the query count is expected QPS × this
    settings.max_duration_ms = int(plan.duration_s * 1000) if scenario == SINGLE_STREAM else 0
    settings.min_query_count = 1
    settings.performance_sample_count_override = count
    settings.qsl_rng_seed = settings.sample_index_rng_seed = settings.schedule_rng_seed = plan.seed
    if scenario == SERVER:
        settings.server_target_qps = target_qps
        settings.server_target_latency_ns = int(plan.p99_bound_s * 1e9)
    elif scenario == OFFLINE:
        settings.offline_expected_qps = target_qps
    else:
        settings.single_stream_expected_latency_ns = int(1e9 / max(target_qps, 1e-3))
    return settings


def run_point(client: Client, scenario: str, label: str, target_qps: float, fraction: float | None = None) -> LoadPoint:
    """One LoadGen run of ``scenario`` (Server: Poisson arrivals at ``target_qps``; Offline: ``target_qps`` × the
    duration queries at once; SingleStream: one at a time for the duration) against the client's server."""
    import mlperf_loadgen as lg

    plan = client.plan
    count = len(client.bodies)
    client.drain()
    client.counts.clear()
    client.first_failure = None
    client.in_flight = None
    client.kept = {}
    client.first_send = client.last_answer = None
    client.record_latencies = scenario == SINGLE_STREAM
    client.keep = scenario == SERVER

    def complete(query_id: int) -> None:
        lg.QuerySamplesComplete([lg.QuerySampleResponse(query_id, 0, 0)])

    sut = lg.ConstructSUT(lambda queries: client.issue(queries, complete), lambda: None)
    qsl = lg.ConstructQSL(count, count, lambda indices: None, lambda indices: None)
    before = client.server_stats()
    gc.collect()
    gc.freeze()  # what exists now is never scanned again; no collection pauses the client while LoadGen sends
    gc.disable()
    try:
        cpu_before, started = time.process_time(), time.perf_counter()
        if scenario == OFFLINE:
            client.in_flight = client.call(_semaphore(plan.offline_in_flight))
            client.deadline = started + OFFLINE_DURATIONS * plan.duration_s + plan.request_timeout_s
        with tempfile.TemporaryDirectory(prefix="fwbench-loadgen-") as folder:
            log = lg.LogSettings()
            log.log_output.outdir = folder
            log.log_output.copy_summary_to_stdout = False
            log.enable_trace = False
            lg.StartTestWithLogSettings(sut, qsl, _settings(scenario, plan, target_qps, count), log)
            results = loadgen_results(Path(folder) / "mlperf_log_detail.txt")
        wall_s = time.perf_counter() - started
    finally:
        gc.enable()
        client.deadline = None
    client_cpu_s = time.process_time() - cpu_before
    after = client.server_stats()
    lg.DestroyQSL(qsl)
    lg.DestroySUT(sut)
    counts = client.counts
    scheduled = results.get("result_scheduled_samples_per_sec")
    server: dict[str, Any] = {}
    if before is not None and after is not None:
        rows = Counter({k: int(v) for k, v in after["batch_rows"].items()})
        rows.subtract({k: int(v) for k, v in before["batch_rows"].items()})
        server = {
            "server_cpu_s": float(after["cpu_s"]) - float(before["cpu_s"]),
            "batch_rows": {k: v for k, v in sorted(rows.items(), key=lambda kv: int(kv[0])) if v > 0},
            "padded_rows": int(after["padded_rows"]) - int(before["padded_rows"]),
        }
    return LoadPoint(
        scenario=scenario,
        label=label,
        fraction=fraction,
        target_qps=target_qps,
        offered_qps=float(scheduled) if scenario == SERVER and isinstance(scheduled, (int, float)) else None,
        achieved_qps=answered_rate(counts["answered"], client.first_send, client.last_answer),
        queries=sum(counts.values()),
        answered=counts["answered"],
        dropped=counts["dropped"],
        timed_out=counts["timed_out"],
        failed=counts["failed"],
        p50_s=_seconds(results.get("result_50.00_percentile_latency_ns")),
        p90_s=_seconds(results.get("result_90.00_percentile_latency_ns")),
        p99_s=_seconds(results.get("result_99.00_percentile_latency_ns")),
        p999_s=_seconds(results.get("result_99.90_percentile_latency_ns")),
        mean_s=_seconds(results.get("result_mean_latency_ns")),
        max_s=_seconds(results.get("result_max_latency_ns")),
        wall_s=wall_s,
        client_cpu_s=client_cpu_s,
        first_failure=client.first_failure,
        **server,
    )


def answered_rate(answered: int, first_send: float | None, last_answer: float | None) -> float | None:
    """Answers per second from the first send to the last answer (None: fewer than 2 answers)."""
    if answered < 2 or first_send is None or last_answer is None or last_answer <= first_send:
        return None
    return answered / (last_answer - first_send)


async def _semaphore(size: int) -> asyncio.Semaphore:
    return asyncio.Semaphore(size)


@dataclass
class PassResult:
    """One pass: every point in the order run, the SingleStream requests' client-side times, the capacity."""

    points: list[LoadPoint]
    single_stream_s: list[float]
    capacity_qps: float | None
    peak_qps: float | None  # the highest achieved load of a point that met the bound, None when none did
    kept_responses: int
    kept_from: str | None  # the point the kept answers come from

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "points": [p.to_dict() for p in self.points]}


def peak_search(
    ladder: Sequence[float], probes: int, measure: Callable[[float], LoadPoint], bound_s: float
) -> tuple[list[LoadPoint], float | None]:
    """The ladder's points (``measure(fraction)`` each), then ``probes`` more bisecting between the highest fraction
    that met the bound below the lowest that did not (from 0 when the lowest failed; up to PEAK_CEILING × capacity
    when none failed); every point in order and the highest achieved rate of a point that met the bound."""
    points: list[LoadPoint] = []
    peak: float | None = None
    passing, failing = 0.0, None
    for fraction in ladder:
        point = measure(fraction)
        points.append(point)
        if meets(point, bound_s):
            passing = max(passing, fraction)
            peak = max(peak or 0.0, point.achieved_qps or 0.0)
        elif failing is None or fraction < failing:
            failing = fraction
    low = passing if failing is None or passing < failing else 0.0
    high = PEAK_CEILING if failing is None else failing
    for _ in range(probes):
        fraction = (low + high) / 2
        if high - low < 0.02:
            break
        point = measure(fraction)
        points.append(point)
        if meets(point, bound_s):
            low, peak = fraction, max(peak or 0.0, point.achieved_qps or 0.0)
        else:
            high = fraction
    return points, peak


def run_plan(plan: Plan) -> PassResult:
    """SingleStream → Offline → the Server ladder → the peak probes (module docstring), against ``plan.infer_url``."""
    with np.load(plan.samples) as loaded:
        samples = {name: loaded[name] for name in loaded.files}
    client = Client(plan, samples)
    try:
        points = [run_point(client, SINGLE_STREAM, "single-stream", 1000.0)]
        single_stream_s = list(client.latencies_s)
        unloaded_qps = points[0].achieved_qps or 1.0
        offline = run_point(client, OFFLINE, "offline", unloaded_qps * plan.max_batch)
        points.append(offline)
        capacity = offline.achieved_qps
        peak: float | None = None
        kept: dict[int, dict[str, np.ndarray]] = {}
        kept_from: str | None = None
        kept_fraction = -1.0
        if capacity:

            def measure(fraction: float) -> LoadPoint:
                nonlocal kept, kept_from, kept_fraction
                label = f"server@{fraction:.2f}" if fraction in plan.ladder else f"peak@{fraction:.3f}"
                point = run_point(client, SERVER, label, capacity * fraction, fraction)
                if client.kept and fraction >= kept_fraction:  # the heaviest load with answers
                    kept, kept_from, kept_fraction = dict(client.kept), label, fraction
                return point

            server_points, peak = peak_search(plan.ladder, plan.peak_probes, measure, plan.p99_bound_s)
            points += server_points
        if plan.responses is not None and kept:
            saved: dict[str, Any] = {f"{i}/{name}": a for i, out in kept.items() for name, a in out.items()}
            np.savez(plan.responses, **saved)
        return PassResult(points, single_stream_s, capacity, peak, len(kept), kept_from)
    finally:
        client.close()


def main() -> int:
    plan = Plan.from_dict(json.loads(sys.stdin.readline()))
    result = run_plan(plan)
    sys.stdout.write(json.dumps(result.to_dict()) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="fwbench load generator (started by a serving worker)")
    parser.add_argument("--cpus", required=True, help="comma-separated CPUs to pin to")
    parser.add_argument("--parent", type=int, required=True, help="the serving worker's pid: die with it")
    args = parser.parse_args()
    die_with_manager(args.parent)
    os.sched_setaffinity(0, [int(cpu) for cpu in args.cpus.split(",")])
    sys.exit(main())
