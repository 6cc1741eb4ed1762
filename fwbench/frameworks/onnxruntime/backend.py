"""ONNX Runtime backend (:mod:`fwbench.frameworks.exported`). Modes name the exporting framework: ``torch`` (our
torch model through ``torch.onnx.export(dynamo=True)``) and ``tensorflow`` (our tf.Module's ``tf.function`` at the
cell's input signature through tf2onnx); the ONNX file (weights inside) runs in an
``onnxruntime.InferenceSession`` on the CPUExecutionProvider with graph optimisation ALL. The timed call is
``session.run(None, feed)`` on numpy inputs, as ORT users call it.

Thread budget: ``intra_op_num_threads`` = the budget, ``inter_op_num_threads`` = 1, sequential execution; the
intra-op pool's spin-waiting stays ORT's default (``session.intra_op.allow_spinning`` = 1, stored; with one
thread there is no pool to spin). On the CPU only here: the CUDA provider needs ``onnxruntime-gpu``. ``--dtype
int8``: the float32 file dynamically quantised (:data:`QUANTIZATION`), then run the same way.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from importlib.metadata import version
from typing import Any

import numpy as np
import onnxruntime as ort

from fwbench.frameworks.exported import ExportedBackend
from fwbench.frameworks.roles import OnnxExporter, as_onnx_exporter
from fwbench.spec import Settings

SPINNING = "1"  # ORT's default, stated: a pool thread spins briefly for work before it sleeps
# --dtype int8: onnxruntime.quantization.quantize_dynamic of the exported float32 file. reduce_range: 7-bit weights,
# so AVX2's u8×s8 multiply-adds (vpmaddubsw, which saturate at int16) compute what VNNI's do: one result everywhere.
QUANTIZATION = (
    "quantize_dynamic: MatMul/Gemm/Conv... weights QInt8 per tensor, reduce_range=True, activations uint8 per call"
)


class OnnxRuntimeBackend(ExportedBackend):
    framework = "onnxruntime"
    modes = ("torch", "tensorflow")
    suffix = ".onnx"
    shares_export = True  # fp32: the exporter's ONNX file as it is (onnxruntime:torch and openvino:torch share it)
    cuda_unavailable = "the CUDA provider needs onnxruntime-gpu, which is not installed"

    def __init__(
        self, mode: str, device: str, settings: Settings, *, dtype: str = "fp32", phase: str = "inference"
    ) -> None:
        super().__init__(mode, device, settings, dtype=dtype, phase=phase)
        self._session: ort.InferenceSession | None = None
        self._input_names: list[str] = []

    @functools.cached_property
    def exporter(self) -> OnnxExporter:
        """The exporting framework's ``deploy.py`` in its exporter role."""
        return as_onnx_exporter(self.deploy)

    def _session_options(self) -> ort.SessionOptions:
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.add_session_config_entry("session.intra_op.allow_spinning", SPINNING)
        return options

    def engine_threads(self) -> dict[str, Any]:
        """Read back from the options object the sessions are made with."""
        options = self._session_options()
        return {
            "intra_op": options.intra_op_num_threads,
            "inter_op": options.inter_op_num_threads,
            "execution_mode": str(options.execution_mode).rsplit(".", 1)[-1],
            "allow_spinning": options.get_session_config_entry("session.intra_op.allow_spinning"),
        }

    def configure_precision(self) -> dict[str, object]:
        if self.dtype == "int8":
            return {"onnxruntime_precision": f"dynamic int8 quantisation ({QUANTIZATION}) on the CPUExecutionProvider"}
        return {"onnxruntime_precision": "float32 graph on the CPUExecutionProvider (no reduced-precision mode)"}

    def export(self, inputs: Sequence[np.ndarray], path: str) -> dict[str, Any]:
        if self.dtype != "int8":
            return self.exporter.to_onnx(self.model, inputs, path)
        from onnxruntime.quantization import QuantType, quantize_dynamic

        float_path = f"{path}.float.onnx"
        how = self.exporter.to_onnx(self.model, inputs, float_path)
        try:
            quantize_dynamic(float_path, path, weight_type=QuantType.QInt8, reduce_range=True)
        finally:
            os.unlink(float_path)
        quantized = quantized_nodes(path)
        if not quantized:  # the file would run in float32 and be reported as int8
            raise RuntimeError("quantize_dynamic quantised no node of the exported model")
        return {**how, "quantization": QUANTIZATION, "quantized_ops": quantized}

    def load(self, path: str, inputs: Sequence[np.ndarray]) -> dict[str, Any]:
        session = ort.InferenceSession(path, self._session_options(), providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        if len(names) != len(inputs):
            raise RuntimeError(f"the exported graph takes inputs {names}, the model {len(inputs)}")
        self._session, self._input_names = session, names
        return {"providers": session.get_providers()}

    def release(self) -> None:
        self._session = None

    def infer(self, inputs: Sequence[Any]) -> tuple[np.ndarray, ...]:
        assert self._session is not None, "compile() first"
        return tuple(self._session.run(None, dict(zip(self._input_names, inputs))))

    def loaded_call(self) -> Callable[[Sequence[np.ndarray]], Sequence[np.ndarray]]:
        session, names = self._session, self._input_names
        assert session is not None, "compile() first"
        return lambda inputs: session.run(None, dict(zip(names, inputs)))

    def kernel_libraries(self, step: Callable[[], object], inputs: Sequence[Any]) -> list[dict[str, Any]]:
        """MLAS for the CPU execution provider (onnxruntime/kernels.py)."""
        if self._session is None:
            return super().kernel_libraries(step, inputs)
        from fwbench.frameworks.onnxruntime import kernels

        return kernels.kernel_libraries(self._session)

    def versions(self) -> dict[str, str]:
        return {"onnxruntime": ort.__version__, "onnx": version("onnx"), **self.exporter.versions()}


def quantized_nodes(path: str) -> dict[str, int]:
    """The integer and quantisation nodes of an ONNX file (MatMulInteger, ConvInteger, DynamicQuantizeLinear...) by op
    type; empty for a float32 graph."""
    import onnx

    counts: dict[str, int] = {}
    for node in onnx.load(path, load_external_data=False).graph.node:
        if "Integer" in node.op_type or "Quant" in node.op_type:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return dict(sorted(counts.items()))


def create_backend(
    mode: str, device: str, settings: Settings, *, dtype: str = "fp32", phase: str = "inference"
) -> OnnxRuntimeBackend:
    return OnnxRuntimeBackend(mode, device, settings, dtype=dtype, phase=phase)
