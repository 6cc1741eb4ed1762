"""Phase serving: the cell's runtime behind fwbench's HTTP server (KServe v2, dynamic batching), driven by MLPerf
LoadGen from a second process pinned to the CPUs the server does not use (:mod:`fwbench.serving`).

The worker is the server: the backend it built (and one more per compiled batch size) answers every request
through ``make_inputs → infer → to_numpy``, the code an inference cell times. The cell's batch size is the
batcher's max batch size; its sequence length the only one the server accepts. One round (one worker) measures
SingleStream (the stored samples: each request's seconds, client-side), Offline (capacity), the Server scenario
at a ladder of fractions of that capacity, and the highest load whose p99 stays under ``--p99-bound``
(``details.serving``: every point). Answers kept from the heaviest loaded point are checked against the float64
reference (``floor:identity``: equal to their requests); a wrong answer makes the cell ``mismatch``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fwbench.details import CompileHealth
from fwbench.frameworks import RuntimeInfo
from fwbench.models.base import ModelDescription
from fwbench.runner import estimate
from fwbench.runner.cell import Cell, parity
from fwbench.runner.phases.base import Phase
from fwbench.runner.phases.inference import mismatch_reason
from fwbench.runner.tempfolders import SERVING_PREFIX, run_folder
from fwbench.serving.loadgen import OFFLINE_DURATIONS
from fwbench.spec import DTYPES, Case, Settings

if TYPE_CHECKING:
    from fwbench.frameworks.base import Backend

QUERY_SAMPLES = 64  # distinct single-row requests the load generator cycles through
PARITY_SAMPLES = 4  # of them, the ones whose answers under load are checked
QUEUE_BATCHES = 16  # the batcher's queue holds this many max batches of rows before it drops requests
LADDER = (0.25, 0.5, 0.75, 0.9)  # Server points: fractions of the Offline capacity
PEAK_PROBES = 2
REQUEST_TIMEOUT_S = 2.0
POINT_OVERHEAD_S = 0.15  # LoadGen's start and log writing, the stats requests, per point (~0.06 s measured)


def points_per_round() -> int:
    """Load points in one round: SingleStream, Offline, the ladder, the peak probes."""
    return 2 + len(LADDER) + PEAK_PROBES


def load_budget_s(settings: Settings) -> float:
    """The most seconds one round's load may take: each point's duration, the wait for an empty queue before it and
    a request timeout after it (every query ends by then: loadgen's module docstring), LoadGen's overhead, and the
    Offline point's longer deadline."""
    point = settings.serve_point_s + 2 * REQUEST_TIMEOUT_S + POINT_OVERHEAD_S
    return points_per_round() * point + (OFFLINE_DURATIONS - 1) * settings.serve_point_s


def client_cpus(server_cpus: set[int]) -> tuple[list[int], bool]:
    """The CPUs for the load generator: those the manager may use (the machine's, or a container's cpuset) other
    than the server's, else the server's (shared: True)."""
    try:
        allowed = set(os.sched_getaffinity(os.getppid()))
    except OSError:  # the manager is gone (the worker dies with it) or not ours to read
        allowed = set(range(os.cpu_count() or 1))
    others = sorted(allowed - server_cpus)
    return (others, False) if others else (sorted(server_cpus), True)


def serving_unavailable() -> str | None:
    """Why this installation cannot run phase serving (its packages missing), None when it can."""
    for module in ("mlperf_loadgen", "starlette", "uvicorn", "aiohttp"):
        if importlib.util.find_spec(module) is None:
            return f"phase serving needs {module}: pip install 'fwbench[serving]'"
    return None


class Serving(Phase):
    """build → compile each batch size → serve → LoadGen's scenarios from another process → parity of answers."""

    name = "serving"
    dtypes = DTYPES
    interleavable = False  # a server under load needs the machine: its rounds never overlap another cell's
    compared_by_speedup = False  # its figures are under load (capacity, p99 against offered load): its own section
    report_sections = ("serving",)

    def default_threads(self, cores: int) -> int:
        """One core fewer (at least 1): the load generator's, beside the server."""
        return max(1, cores - 1)

    def runtime_unsupported(self, info: RuntimeInfo, settings: Settings) -> str | None:
        if "serving" not in info.phases and "inference" not in info.phases:
            return f"{info.name} has no inference phase to serve"
        return serving_unavailable()

    def flops_per_call(self, description: ModelDescription, case: Case, settings: Settings) -> int | None:
        """One SingleStream request: a forward of one row."""
        return description.forward_flops(1, case.seq_len)

    def estimate_cell_s(self, case: Case, settings: Settings) -> float:
        """Per round: start-up and one compile per batch size, then the points' durations and overheads."""
        startup, compile_s = estimate.startup_and_compile_s(case.runtime)
        per_round = startup + 2 * compile_s + points_per_round() * (settings.serve_point_s + POINT_OVERHEAD_S) + 1.0
        return settings.rounds * per_round

    def merged_details(self, rounds: list[dict[str, Any]]) -> dict[str, Any]:
        """``serving`` of the first round, with every round's capacity, peak and points under ``rounds``."""
        passes = [r["serving"] for r in rounds if isinstance(r.get("serving"), dict)]
        if not passes:
            return {}
        kept = ("capacity_qps", "peak_qps", "points", "checked_answers", "checked_from")
        return {"serving": {**passes[0], "rounds": [{key: p.get(key) for key in kept} for p in passes]}}

    def measure(self, cell: Cell, backend: Backend, description: ModelDescription) -> None:
        case, settings = cell.job.case, cell.job.settings
        from fwbench.serving.model import buckets_for

        buckets = buckets_for(case.batch_size)
        arrays = description.make_inputs(QUERY_SAMPLES, case.seq_len, settings.seed + 1)
        server_cpus = set(os.sched_getaffinity(0))
        cpus, shared = client_cpus(server_cpus)
        cell.result["serving_cpus"] = {"server": sorted(server_cpus), "client": cpus, "shared": shared}
        with run_folder(SERVING_PREFIX) as folder:  # named after this worker: a killed one's is removed by the next run
            samples, responses = Path(folder) / "samples.npz", Path(folder) / "responses.npz"
            saved: dict[str, Any] = dict(arrays)
            np.savez(samples, **saved)
            plan = {
                "samples": str(samples),
                "duration_s": settings.serve_point_s,
                "ladder": list(LADDER),
                "p99_bound_s": settings.serve_p99_bound_s,
                "peak_probes": PEAK_PROBES,
                "request_timeout_s": REQUEST_TIMEOUT_S,
                "offline_in_flight": 2 * case.batch_size,
                "max_batch": case.batch_size,
                "parity_samples": PARITY_SAMPLES,
                "responses": str(responses),
                "seed": settings.seed,
            }
            if getattr(backend, "serves_itself", False):
                result = self.serve_natively(cell, backend, buckets, plan, cpus, Path(folder))
            else:
                result = self.serve(cell, backend, description, buckets, plan, cpus)
            kept: dict[str, np.ndarray] = {}
            if responses.exists():
                with np.load(responses) as loaded:
                    kept = {name: loaded[name] for name in loaded.files}
        self.record(cell, result, buckets)
        self.check_answers(cell, backend, description, arrays, kept)
        cell.stage("done")

    def serve(
        self, cell: Cell, backend: Backend, description: ModelDescription, buckets: tuple[int, ...],
        plan: dict[str, Any], cpus: list[int],
    ) -> dict[str, Any]:  # fmt: skip
        """fwbench's server: the runtime compiled for each bucket (one backend each, ``backend`` the first), served
        while the load generator runs ``plan``; the pass's result (loadgen.PassResult as JSON)."""
        from fwbench.serving.app import make_app
        from fwbench.serving.batcher import CallerThreadExecutor, DynamicBatcher
        from fwbench.serving.model import warmed_model
        from fwbench.serving.server import HttpServer

        case, settings = cell.job.case, cell.job.settings
        cell.stage("compile")
        spare = [backend]  # the built backend serves the first bucket; each other bucket gets one more

        def new_runner() -> Backend:
            return spare.pop() if spare else cell.another_backend(description)

        model = warmed_model(
            case.model, f"fwbench:{case.runtime}", description, buckets, case.seq_len, settings.seed,
            settings.warmup_calls, new_runner,
        )  # fmt: skip
        cell.record_compile_report(backend)
        executor = CallerThreadExecutor()  # the model runs here, on the thread that built and compiled it
        rows = QUEUE_BATCHES * case.batch_size
        batcher = DynamicBatcher(model, case.batch_size, settings.serve_max_delay_s, rows, executor, REQUEST_TIMEOUT_S)
        counters_before = backend.compile_counters()
        with HttpServer(make_app(batcher), settings.serve_port) as server:
            plan = {
                **plan,
                "infer_url": f"{server.url}/v2/models/{model.name}/infer",
                "stats_url": f"{server.url}/v2/models/{model.name}/stats",
            }
            cell.stage("timing")
            generator = LoadGenerator(plan, cpus, load_budget_s(settings) + 60.0)
            executor.serve_until(generator.finished, poll_s=0.05)
            executor.cancel_pending()
            result = generator.result()
        cell.result["compile_health"] = CompileHealth.measured(counters_before, backend.compile_counters()).to_dict()
        return result

    def serve_natively(
        self, cell: Cell, backend: Backend, buckets: tuple[int, ...], plan: dict[str, Any], cpus: list[int],
        folder: Path,
    ) -> dict[str, Any]:  # fmt: skip
        """A runtime with its own server (``torchserve:torch``): started with the same max batch, delay, buckets
        and queue (stage compile: archiving, starting, the model worker ready), then driven like fwbench's."""
        case, settings = cell.job.case, cell.job.settings
        cell.stage("compile")
        started = time.perf_counter()
        server = backend.start_server(  # type: ignore[attr-defined]
            folder / "server", max_batch=case.batch_size, max_delay_s=settings.serve_max_delay_s, buckets=buckets,
            seq_len=case.seq_len, queue_rows=QUEUE_BATCHES * case.batch_size, port=settings.serve_port,
        )  # fmt: skip
        with server:
            cell.result["compile_report"] = {"start_s": time.perf_counter() - started, **server.report()}
            cpu_before = server.cpu_seconds()
            cell.stage("timing")
            generator = LoadGenerator({**plan, "infer_url": server.infer_url, "stats_url": None}, cpus,
                                      load_budget_s(settings) + 60.0)  # fmt: skip
            while not generator.finished():
                time.sleep(0.05)
            result = generator.result()
            cell.result["server_cpu_s"] = server.cpu_seconds() - cpu_before
        return result

    def record(self, cell: Cell, result: dict[str, Any], buckets: tuple[int, ...]) -> None:
        """The pass's points and figures in ``details.serving``; the SingleStream requests as the samples."""
        case, settings = cell.job.case, cell.job.settings
        cell.result["serving"] = {
            "max_batch": case.batch_size,
            "buckets": list(buckets),
            "padding": "a batch runs in the smallest compiled batch size holding it, padded with copies of its "
            "last row; a request of another sequence length, dtype or row shape is refused (400)",
            "max_delay_s": settings.serve_max_delay_s,
            "max_queue_rows": QUEUE_BATCHES * case.batch_size,
            "p99_bound_s": settings.serve_p99_bound_s,
            "point_s": settings.serve_point_s,
            "request_timeout_s": REQUEST_TIMEOUT_S,
            "capacity_qps": result["capacity_qps"],
            "peak_qps": result["peak_qps"],
            "points": result["points"],
            "checked_answers": result["kept_responses"],
            "checked_from": result.get("kept_from"),
        }
        samples = result["single_stream_s"]
        if not samples:
            raise RuntimeError("no SingleStream request was answered")
        cell.result.update(status="ok", samples_s=samples, calls_per_sample=1, stop_reason="serving")

    def check_answers(
        self, cell: Cell, backend: Backend, description: ModelDescription, arrays: dict[str, np.ndarray],
        kept: dict[str, np.ndarray],
    ) -> None:  # fmt: skip
        """The answers kept under load (``<sample>/<output>``) against the float64 reference of their requests
        (against the requests themselves for a runtime that echoes them); ``mismatch`` when they differ."""
        if not cell.job.check_parity:
            return
        indices = sorted({int(key.split("/", 1)[0]) for key in kept})
        if not indices:
            raise RuntimeError("no answer under load to check: every query of every Server point was lost")
        cell.stage("parity")
        rows = {name: array[indices] for name, array in arrays.items()}
        if getattr(backend, "echoes_inputs", False):
            reference: dict[str, np.ndarray] | None = rows
        else:
            reference = description.reference_forward(cell.weights(description), rows)
        if reference is None:
            return
        names = {key.split("/", 1)[1] for key in kept}
        answers = {name: np.concatenate([kept[f"{i}/{name}"] for i in indices]) for name in names}
        check = parity(answers, reference, cell.job.case.dtype, description.name)
        if getattr(backend, "echoes_inputs", False):  # the floor: every answer is its request, bit for bit
            exact = set(answers) == set(reference) and all(np.array_equal(answers[n], reference[n]) for n in answers)
            check.update(ok=exact, exact=True)
        check["shape"] = [len(indices), cell.job.case.seq_len]
        check["under_load"] = True
        cell.result["parity"] = check
        if not check["ok"]:
            cell.fail_check(f"answers under load: {mismatch_reason(check)}")


class LoadGenerator:
    """``python -m fwbench.serving.loadgen`` pinned to ``cpus``, given ``plan`` on its stdin. It dies with this
    process (PR_SET_PDEATHSIG; the manager also kills the worker's process group); its output goes to nameless files."""

    def __init__(self, plan: dict[str, Any], cpus: list[int], budget_s: float) -> None:
        """``budget_s``: wall seconds it may run before it is killed."""
        command = [sys.executable, "-m", "fwbench.serving.loadgen", "--cpus", ",".join(map(str, cpus)),
                   "--parent", str(os.getpid())]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        self._output = tempfile.TemporaryFile(prefix="fwbench-loadgen-")
        self._errors = tempfile.TemporaryFile(prefix="fwbench-loadgen-")
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=self._output, stderr=self._errors, env=env)
        self._started = time.monotonic()
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(plan) + "\n").encode())
        self.proc.stdin.close()
        self.budget_s = budget_s

    def finished(self) -> bool:
        """Whether it ended, or ran past its budget (then it is killed)."""
        if self.proc.poll() is not None:
            return True
        if time.monotonic() - self._started > self.budget_s:
            self.proc.kill()
            self.proc.wait()
            return True
        return False

    def result(self) -> dict[str, Any]:
        """Its result (loadgen.PassResult as JSON); RuntimeError saying why when it failed or was killed."""
        code = self.proc.wait()
        self._output.seek(0)
        self._errors.seek(0)
        out, err = self._output.read().decode(), self._errors.read().decode(errors="replace")
        self._output.close()
        self._errors.close()
        if code != 0:
            lines = [line for line in err.strip().splitlines() if line.strip()]
            why = f"killed past its {self.budget_s:.0f} s" if code == -9 else f"exit {code}"
            raise RuntimeError(f"the load generator failed ({why}): {lines[-1] if lines else 'no message'}")
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return result
