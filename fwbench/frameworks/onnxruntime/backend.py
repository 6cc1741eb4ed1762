"""ONNX Runtime backend. Mode ``torch``: the torch model (fwbench/frameworks/torch's model files, the same
canonical weights) exported with ``torch.onnx.export(dynamo=True)`` at the cell's input shapes, the weights
inside the one ``.onnx`` file, run by an ``onnxruntime.InferenceSession`` on the CPUExecutionProvider with graph
optimisation ALL. The timed call is ``session.run(None, feed)`` on numpy inputs, as ORT users call it.

Thread budget: ``intra_op_num_threads`` = the budget, ``inter_op_num_threads`` = 1, sequential execution; the
intra-op pool's spin-waiting stays ORT's default (``session.intra_op.allow_spinning`` = 1, stored; with one
thread there is no pool to spin). A shape not exported yet (the parity shape) is exported again; every export
is in ``compile_report`` (export seconds, session seconds: load and graph optimisation, file size, opset).
fp32 on the CPU only here: the CUDA provider needs ``onnxruntime-gpu``.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch

from fwbench.frameworks.base import Backend, builtin_package, export_report
from fwbench.spec import Settings

SPINNING = "1"  # ORT's default, stated: a pool thread spins briefly for work before it sleeps


class OnnxRuntimeBackend(Backend):
    framework = "onnxruntime"
    modes = ("torch",)
    dtypes = ("fp32",)

    def __init__(
        self, mode: str, device: str, settings: Settings, *, dtype: str = "fp32", phase: str = "inference"
    ) -> None:
        super().__init__(mode, device, settings, dtype=dtype, phase=phase)
        if device != "cpu":
            raise NotImplementedError(f"onnxruntime:{mode} on {device} needs onnxruntime-gpu, which is not installed")
        self.package = builtin_package(mode)  # the exporting framework's model files
        self._intra_op = 1
        self._signature: tuple[tuple[tuple[int, ...], str], ...] | None = None
        self._session: ort.InferenceSession | None = None
        self._input_names: list[str] = []
        self._exports: list[dict[str, Any]] = []

    def _session_options(self) -> ort.SessionOptions:
        options = ort.SessionOptions()
        options.intra_op_num_threads = self._intra_op
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.add_session_config_entry("session.intra_op.allow_spinning", SPINNING)
        return options

    def configure_threads(self, intra_op: int, inter_op: int) -> dict[str, Any]:
        """ORT's session options (read back from the options object the sessions are made with); torch, which
        only exports, gets the same budget."""
        self._intra_op = intra_op
        torch.set_num_threads(intra_op)
        options = self._session_options()
        return {
            "intra_op": options.intra_op_num_threads,
            "inter_op": options.inter_op_num_threads,
            "execution_mode": str(options.execution_mode).rsplit(".", 1)[-1],
            "allow_spinning": options.get_session_config_entry("session.intra_op.allow_spinning"),
        }

    def configure_precision(self) -> dict[str, object]:
        torch.set_float32_matmul_precision("highest")  # the export traces in full float32
        return {"onnxruntime_precision": "float32 graph on the CPUExecutionProvider (no reduced-precision mode)"}

    def make_inputs(self, arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
        return tuple(np.ascontiguousarray(a) for a in arrays.values())

    def compile(self, inputs: Sequence[Any]) -> None:
        """Export and open a session for these shapes, unless the session is already for them."""
        signature = tuple((tuple(a.shape), str(a.dtype)) for a in inputs)
        if signature == self._signature:
            return
        self._session = None  # the previous shape's session goes before the next one is made
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="fwbench-onnx-") as folder:
            path = os.path.join(folder, "model.onnx")
            with torch.no_grad():
                torch.onnx.export(
                    self.model.eval(),
                    tuple(torch.from_numpy(a) for a in inputs),
                    path,
                    dynamo=True,
                    external_data=False,
                    verbose=False,
                )
            exported_at = time.perf_counter()
            opset = max((o.version for o in onnx.load(path).opset_import if o.domain in ("", "ai.onnx")), default=None)
            size = os.path.getsize(path)
            session = ort.InferenceSession(path, self._session_options(), providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        if len(names) != len(inputs):
            raise RuntimeError(f"the exported graph takes inputs {names}, the model {len(inputs)}")
        self._session, self._input_names, self._signature = session, names, signature
        self._exports.append(
            {
                "input_shapes": [list(shape) for shape, _ in signature],
                "export_s": exported_at - started,
                "session_s": time.perf_counter() - exported_at,
                "artefact_bytes": size,
                "artefact": "ONNX file, weights inside",
                "opset": opset,
                "providers": session.get_providers(),
            }
        )

    def infer(self, inputs: Sequence[Any]) -> tuple[np.ndarray, ...]:
        assert self._session is not None, "compile() first"
        return tuple(self._session.run(None, dict(zip(self._input_names, inputs))))

    def sync(self, outputs: Any) -> None:
        """Nothing to wait for: ``run`` returns computed numpy arrays."""

    def to_numpy(self, outputs: Sequence[Any]) -> dict[str, np.ndarray]:
        assert self.description is not None
        return {name: np.asarray(o, dtype=np.float32) for name, o in zip(self.description.output_names, outputs)}

    def compile_report(self) -> dict[str, Any]:
        """The export for the timed shapes; ``reexports`` lists those for other shapes made later (parity)."""
        return export_report(self._exports)

    def versions(self) -> dict[str, str]:
        import onnxscript

        return {
            "onnxruntime": ort.__version__,
            "onnx": onnx.__version__,
            "onnxscript": onnxscript.__version__,
            "torch": torch.__version__,
        }


def create_backend(
    mode: str, device: str, settings: Settings, *, dtype: str = "fp32", phase: str = "inference"
) -> OnnxRuntimeBackend:
    return OnnxRuntimeBackend(mode, device, settings, dtype=dtype, phase=phase)
