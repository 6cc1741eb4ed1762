"""A test-only plugin: runtimes of a numpy "fake" framework that misbehave on purpose.

Loaded through the real plugin mechanism ($FWBENCH_PLUGINS=fwbench_test_plugin with tests/ on
PYTHONPATH). Modes (``fake:<mode>``):
- ``sleep``   — well-behaved: the model's numpy reference, plus a sleep of $FAKE_SLEEP_S per call;
- ``crash``   — the worker dies of SIGSEGV at the first call;
- ``hang``    — never finishes building;
- ``hog``     — touches $FAKE_HOG_BYTES of memory and keeps it while building, then hangs;
- ``oom``     — raises MemoryError at the first call;
- ``wrong``   — returns outputs that differ from the reference (parity mismatch);
- ``spike``   — touches $FAKE_HOG_BYTES for a moment while building, frees it, then runs normally;
- ``slowsync`` — calls return at once; waiting for the result (``sync``) takes $FAKE_SLEEP_S;
- ``late``    — like ``sleep``, but dies of SIGSEGV at call $FAKE_CRASH_AFTER (default 200): mid-timing
  (with $FAKE_LATE_RAISE set it raises MemoryError there instead).
Also ``missing:eager``, whose framework package does not exist (recorded as skipped), and
``retrace:jax`` / ``retrace:tensorflow`` (``fwbench_retrace_backends``), which retrace at every call, ``retrace:torch``
(phase generate), whose decode steps compile one by one, and
``wronglr:torch`` (``fwbench_training_backends``), which trains with 1.5x the learning rate.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from fwbench.frameworks import RuntimeInfo, register_runtime
from fwbench.frameworks.base import Backend
from fwbench.spec import Settings

MODES = ("sleep", "crash", "hang", "hog", "oom", "wrong", "spike", "slowsync", "late")


class FakeBackend(Backend):
    framework = "fake"
    modes = MODES

    def configure_threads(self, intra_op: int, inter_op: int) -> dict[str, int]:
        return {"intra_op": intra_op, "inter_op": inter_op}

    def configure_precision(self) -> dict[str, object]:
        return {"numpy": "float64 reference"}

    def build(self, description: Any, weights: dict[str, np.ndarray]) -> None:
        description.check_weights(weights)
        self.description, self.weights = description, weights
        if self.mode == "hang":
            time.sleep(3600)
        if self.mode == "hog":
            self.hog = np.ones(int(os.environ.get("FAKE_HOG_BYTES", 1 << 30)), dtype=np.uint8)
            time.sleep(3600)
        if self.mode == "spike":
            spike = np.ones(int(os.environ.get("FAKE_HOG_BYTES", 1 << 30)), dtype=np.uint8)
            del spike

    def make_inputs(self, arrays: dict[str, np.ndarray]) -> tuple[Any, ...]:
        self.names = list(arrays)
        return tuple(arrays.values())

    def compile(self, inputs: Sequence[Any]) -> None:
        self.delay = float(os.environ.get("FAKE_SLEEP_S", "0.002"))

    def infer(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
        self.calls = getattr(self, "calls", 0) + 1
        late = self.mode == "late" and self.calls >= int(os.environ.get("FAKE_CRASH_AFTER", "200"))
        if late and os.environ.get("FAKE_LATE_RAISE"):
            raise MemoryError("fake allocation failure mid-timing")
        if self.mode == "crash" or late:
            ctypes.string_at(0)  # reads address 0: SIGSEGV
        if self.mode == "oom":
            raise MemoryError("fake allocation failure")
        if self.mode != "slowsync":
            time.sleep(self.delay)
        description = self.description
        assert description is not None, "build() first"
        outputs = description.reference_forward(self.weights, dict(zip(self.names, inputs)))
        assert outputs is not None, f"{description.name} has no numpy reference"
        if self.mode == "wrong":
            outputs = {name: value + 1.0 for name, value in outputs.items()}
        return tuple(outputs[name] for name in description.output_names)

    def sync(self, outputs: Any) -> None:
        if self.mode == "slowsync":
            time.sleep(self.delay)

    def to_numpy(self, outputs: Sequence[Any]) -> dict[str, np.ndarray]:
        assert self.description is not None, "build() first"
        return dict(zip(self.description.output_names, outputs))

    def versions(self) -> dict[str, str]:
        return {"fake": "0"}


def create_backend(
    mode: str, device: str, settings: Settings, *, dtype: str = "fp32", phase: str = "inference"
) -> FakeBackend:
    return FakeBackend(mode, device, settings, dtype=dtype, phase=phase)  # fp32 only: any other dtype is refused


for _mode in MODES:
    register_runtime(RuntimeInfo(f"fake:{_mode}", __name__, (), f"test-only numpy runtime ({_mode})"))
for _framework in ("jax", "tensorflow"):  # real frameworks, retracing at every call on purpose
    register_runtime(
        RuntimeInfo(
            f"retrace:{_framework}",
            "fwbench_retrace_backends",
            (_framework,),
            f"test-only {_framework} runtime that retraces at every call",
        )
    )
register_runtime(
    RuntimeInfo(
        "retrace:torch",
        "fwbench_retrace_backends",
        ("torch",),
        "test-only torch:compile generation whose decode position is a Python int (a compile per step)",
        phases=("generate",),
    )
)
register_runtime(
    RuntimeInfo(
        "wronglr:torch",
        "fwbench_training_backends",
        ("torch",),
        "test-only torch:eager training with 1.5x the learning rate",
        phases=("inference", "training"),
        training="torch:eager, learning rate x1.5",
    )
)
register_runtime(RuntimeInfo("missing:eager", __name__, ("fwbench_no_such_framework",), "never installed"))
register_runtime(  # a worker in another language, here a plain Python script that speaks only the protocol
    RuntimeInfo(
        "fakeext:numpy",
        "",
        (),
        "test-only external worker (tests/fake_external_worker.py)",
        external="fwbench_fake_external",
    )
)
