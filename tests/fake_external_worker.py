"""The test-only external worker (fwbench_fake_external): the mlp in numpy, speaking fwbench's worker protocol
with the standard library only, as a worker in any language would (docs/architecture.md, "A worker in another
language"). Not a test module: the Python worker of a ``fakeext:numpy`` cell becomes this script."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any

import numpy as np
from safetensors.numpy import load_file, save_file

args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
if os.getppid() != int(args["--manager-pid"]):
    sys.exit(3)
channel = os.fdopen(int(args["--result-fd"]), "w")
folder = args["--folder"]
with open(os.path.join(folder, "cell.json")) as file:
    cell: dict[str, Any] = json.load(file)


def send(kind: str, **fields: Any) -> None:
    channel.write(json.dumps({"type": kind, **fields}) + "\n")
    channel.flush()


def forward(weights: dict[str, np.ndarray], x: np.ndarray) -> dict[str, np.ndarray]:
    scale = float(os.environ.get("FAKE_EXTERNAL_SCALE", "1"))
    for i, prefix in enumerate(cell["layers"]):
        x = x @ weights[f"{prefix}.weight"].T + weights[f"{prefix}.bias"]
        x = np.maximum(x, 0) if i < len(cell["layers"]) - 1 else x
    return {"logits": x * scale}


result: dict[str, Any] = {"stage_seconds": {}}
try:
    send("stage", stage="import")
    send("stage", stage="build")
    weights = load_file(os.path.join(folder, "weights.safetensors"))
    x = load_file(os.path.join(folder, "inputs.safetensors"))["x"]
    send("stage", stage="first_call")
    start = time.perf_counter()
    forward(weights, x)
    result["first_call_s"] = time.perf_counter() - start
    send("stage", stage="timing")
    send("ready", peak_memory_bytes=None)
    samples: list[float] = []
    calls = int(cell["hf2019_number"])
    for line in sys.stdin:  # the commands the manager writes after ready
        command = json.loads(line)
        if command["command"] == "finish":
            break
        if command["command"] == "calibrate":
            send("calibrated", calls_per_block=calls, block_s=0.01)
            continue
        calls = int(command.get("calls") or calls)
        start = time.perf_counter()
        for _ in range(calls):
            forward(weights, x)
        seconds = time.perf_counter() - start
        samples.append(seconds / calls)
        send("block", seconds=seconds, calls=calls, start_unix_s=time.time())
    result.update(status="ok", samples_s=samples, calls_per_sample=calls, stop_reason="interleaved")
    if cell["parity"] is not None:
        send("stage", stage="parity")
        stored = load_file(cell["parity"])
        got = os.path.join(folder, "got.safetensors")
        save_file({k: v.astype(np.float32) for k, v in forward(weights, stored["input/x"]).items()}, got)
        answer = subprocess.run(
            [cell["python"], "-m", "fwbench.runner.external", "compare", folder, got],
            capture_output=True,
            text=True,
            check=True,
        )
        verdict = json.loads(answer.stdout.strip().splitlines()[-1])
        result["parity"] = verdict["parity"]
        if verdict["reason"] is not None:
            result.update(status="mismatch", reason=verdict["reason"], samples_s=[])
    send("stage", stage="done")
except Exception as exc:  # noqa: BLE001 (the protocol: one result, whatever happened)
    result.update(status="error", reason=f"{type(exc).__name__}: {exc}")
shutil.rmtree(folder, ignore_errors=True)
result["fake_pid"] = os.getpid()
send("result", **result)
