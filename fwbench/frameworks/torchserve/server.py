"""TorchServe as it ships, started for one cell: the model archived with torch-model-archiver (fwbench's handler,
the cell's weights, a model config setting TorchServe's batching), then TorchServe's Java frontend started directly
(not through the ``torchserve`` script, whose one pid file per temporary folder would make two runs collide) on
127.0.0.1, with its threads set to the cell's budget. It dies with the process that started it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from fwbench.models.base import ModelDescription
from fwbench.models.weights_io import save_weights
from fwbench.orphans import die_with_parent
from fwbench.ranks import free_ports
from fwbench.serving.server import HOST, bind

READY_TIMEOUT_S = 180.0
# TorchServe's own log4j2.xml writes an access-log line and metrics lines for every request; fwbench's server
# writes none (uvicorn's access log is off): warnings and errors only, to the console (torchserve.log).
QUIET_LOG4J = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration>
  <Appenders><Console name="STDOUT" target="SYSTEM_OUT"><PatternLayout pattern="%d %p %c: %m%n"/></Console></Appenders>
  <Loggers><Root level="warn"><AppenderRef ref="STDOUT"/></Root></Loggers>
</Configuration>
"""


def java_version() -> str:
    """The first line of ``java -version`` (empty when java is missing)."""
    java = shutil.which("java")
    if java is None:
        return ""
    done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    return (done.stderr or done.stdout).strip().splitlines()[0] if (done.stderr or done.stdout).strip() else ""


def versions() -> dict[str, str]:
    return {
        "torchserve": version("torchserve"),
        "torch-model-archiver": version("torch-model-archiver"),
        "torch": version("torch"),
        "java": java_version(),
    }


class TorchServe:
    """One TorchServe for one model; a context manager (stopped on exit). ``infer_url``: its predictions URL."""

    def __init__(
        self,
        folder: Path,
        description: ModelDescription,
        weights: dict[str, np.ndarray],
        *,
        max_batch: int,
        max_delay_s: float,
        buckets: Sequence[int],
        seq_len: int | None,
        threads: int,
        seed: int,
        warmup_calls: int,
        queue_rows: int,
        port: int = 0,
    ) -> None:
        self.folder = folder
        self.name = description.name
        delay_ms = max_delay_s * 1000
        if abs(delay_ms - round(delay_ms)) > 1e-9:
            raise ValueError(
                f"TorchServe's maxBatchDelay is whole milliseconds: --max-delay {delay_ms:g}ms cannot be given to it"
            )
        self.max_delay_ms = round(delay_ms)
        store = folder / "model-store"
        store.mkdir(parents=True)
        weights_file = folder / "weights.safetensors"
        save_weights(description, weights, weights_file, seed)
        config = {
            "minWorkers": 1,
            "maxWorkers": 1,
            "batchSize": max_batch,
            "maxBatchDelay": self.max_delay_ms,
            "responseTimeout": 120,
            "deviceType": "cpu",
            "handler": {"model": description.name, "seq_len": seq_len, "buckets": list(buckets), "threads": threads,
                        "seed": seed, "warmup_calls": warmup_calls},
        }  # fmt: skip
        config_file = folder / "model-config.yaml"
        config_file.write_text(json.dumps(config))  # JSON is YAML
        archiver = Path(sys.executable).with_name("torch-model-archiver")
        handler = Path(__file__).with_name("handler.py")
        archived = subprocess.run(
            [str(archiver), "--model-name", self.name, "--version", "1.0", "--handler", str(handler),
             "--serialized-file", str(weights_file), "--config-file", str(config_file), "--export-path", str(store),
             "--archive-format", "no-archive", "--force"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if archived.returncode != 0:
            lines = [line for line in (archived.stderr or archived.stdout).strip().splitlines() if line.strip()]
            raise RuntimeError(
                f"torch-model-archiver failed (exit {archived.returncode}): {lines[-1] if lines else ''}"
            )
        if port:
            bind(port).close()  # PortInUse, in fwbench's words, before TorchServe says it in its log
        free = free_ports(5)
        self.inference_port = port or free[4]
        self.management_port, metrics_port, grpc_inference, grpc_management = free[:4]
        (folder / "log4j2.xml").write_text(QUIET_LOG4J)
        properties = {
            "inference_address": f"http://{HOST}:{self.inference_port}",
            "management_address": f"http://{HOST}:{self.management_port}",
            "metrics_address": f"http://{HOST}:{metrics_port}",
            "grpc_inference_address": HOST,
            "grpc_management_address": HOST,
            "grpc_inference_port": grpc_inference,
            "grpc_management_port": grpc_management,
            "number_of_netty_threads": 1,
            "netty_client_threads": 1,
            "default_workers_per_model": 1,
            "job_queue_size": queue_rows,
            "disable_system_metrics": "true",
            "model_store": str(store),
        }
        self.properties = properties
        (folder / "config.properties").write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
        self.infer_url = f"http://{HOST}:{self.inference_port}/predictions/{self.name}"
        self._store = store
        self.proc: subprocess.Popen[bytes] | None = None

    def report(self) -> dict[str, Any]:
        """What was started: TorchServe's properties (threads, queue, addresses) and its batching."""
        return {"torchserve_properties": self.properties, "max_batch_delay_ms": self.max_delay_ms, "log": "warnings"}

    def command(self) -> list[str]:
        """The Java frontend's command line, as the ``torchserve`` script builds it."""
        import ts

        home = Path(ts.__file__).resolve().parent.parent
        java = shutil.which("java")
        if java is None:
            raise FileNotFoundError("java is not on PATH: TorchServe's frontend needs a JDK (17 here)")
        return [
            java, f"-Dmodel_server_home={home}", f"-Djava.io.tmpdir={self.folder}",
            f"-Dlog4j.configurationFile=file://{self.folder / 'log4j2.xml'}", "-cp",
            f".:{home / 'ts' / 'frontend' / '*'}", "org.pytorch.serve.ModelServer", "--python", sys.executable,
            "-f", str(self.folder / "config.properties"), "-s", str(self._store), "-ncs", "--disable-token-auth",
            "--enable-model-api", "-m", f"{self.name}={self.name}",
        ]  # fmt: skip

    def __enter__(self) -> TorchServe:
        log = (self.folder / "torchserve.log").open("wb")
        self.proc = subprocess.Popen(
            self.command(), cwd=self.folder, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent
        )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self.ready():
            if self.proc.poll() is not None:
                self.stop()  # its model workers, if any started
                raise RuntimeError(f"TorchServe ended while starting: {self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(
                    f"TorchServe's model worker was not ready in {READY_TIMEOUT_S:g} s: {self.log_tail()}"
                )
            time.sleep(0.25)
        return self

    def ready(self) -> bool:
        """Whether the model's worker is READY (TorchServe's management API)."""
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.management_port}/models/{self.name}", timeout=2) as r:
                described: list[dict[str, Any]] = json.loads(r.read())
        except (urllib.error.URLError, OSError, ValueError):
            return False
        return any(w.get("status") == "READY" for m in described for w in m.get("workers", []))

    def processes(self) -> list[psutil.Process]:
        """The frontend and its model workers."""
        if self.proc is None:
            return []
        try:
            parent = psutil.Process(self.proc.pid)
            return [parent, *parent.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def cpu_seconds(self) -> float:
        """CPU seconds the frontend and its workers used so far."""
        total = 0.0
        for process in self.processes():
            try:
                times = process.cpu_times()
                total += times.user + times.system
            except psutil.NoSuchProcess:
                continue
        return total

    def log_tail(self, lines: int = 5) -> str:
        path = self.folder / "torchserve.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])

    def stop(self) -> None:
        """Stop the frontend and every model worker it started."""
        processes = self.processes()
        for process in processes:
            try:
                process.terminate()
            except psutil.NoSuchProcess:
                continue
        _, alive = psutil.wait_procs(processes, timeout=10)
        for process in alive:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                continue
        if self.proc is not None:
            self.proc.wait()

    def __exit__(self, *exc: object) -> None:
        self.stop()
