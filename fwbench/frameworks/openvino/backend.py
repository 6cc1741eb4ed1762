"""OpenVINO backend (:mod:`fwbench.frameworks.exported`). Mode ``torch``: the same ONNX file ``onnxruntime:torch``
runs (our torch model through ``torch.onnx.export(dynamo=True)``, weights inside; OpenVINO's own tracing of torch
fails on ``nn.MultiheadAttention``), read and compiled by ``openvino.Core().compile_model(path, "CPU", config)``.
The timed call is one synchronous ``InferRequest.infer(feed, share_inputs=True)`` on numpy inputs (used in
place, as ORT uses them; the outputs copied out).

Settings: ``PERFORMANCE_HINT=LATENCY``, ``NUM_STREAMS=1``, ``INFERENCE_NUM_THREADS`` = the thread budget, and
``INFERENCE_PRECISION_HINT=f32`` always: on a CPU with bf16 units OpenVINO otherwise computes a float32 model in
bf16. What the compiled model reports for each is stored (``details.compile_report.compiled``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import openvino as ov
import openvino.properties as props
import openvino.properties.hint as hints

from fwbench.frameworks.exported import ExportedBackend
from fwbench.frameworks.roles import OnnxExporter, as_onnx_exporter
from fwbench.spec import Settings

DEVICE = "CPU"
# The compiled model's properties stored with every export, by OpenVINO's names.
REPORTED = (
    hints.inference_precision(),
    hints.performance_mode(),
    hints.execution_mode(),
    props.streams.num(),
    props.inference_num_threads(),
    hints.enable_cpu_pinning(),
)


def plain(value: Any) -> bool | int | float | str:
    """A property value as JSON: an element type by its short name (``f32``), an enum by its name."""
    if isinstance(value, ov.Type):
        return str(value.to_string())
    if isinstance(value, bool | int | float | str):
        return value
    name = getattr(value, "name", None)
    return name if isinstance(name, str) else str(value)


class OpenVinoBackend(ExportedBackend):
    framework = "openvino"
    modes = ("torch",)
    suffix = ".onnx"
    shares_export = True  # fp32: the exporter's ONNX file as it is (onnxruntime:torch and openvino:torch share it)
    cuda_unavailable = "OpenVINO runs on Intel GPUs, not CUDA"

    def __init__(
        self, mode: str, device: str, settings: Settings, *, dtype: str = "fp32", phase: str = "inference"
    ) -> None:
        super().__init__(mode, device, settings, dtype=dtype, phase=phase)
        self.core = ov.Core()
        self._request: ov.InferRequest | None = None

    @functools.cached_property
    def exporter(self) -> OnnxExporter:
        """The exporting framework's ``deploy.py`` in its exporter role."""
        return as_onnx_exporter(self.deploy)

    def config(self) -> dict[str, Any]:
        """What ``compile_model`` is given."""
        return {
            hints.performance_mode(): hints.PerformanceMode.LATENCY,
            props.streams.num(): 1,
            props.inference_num_threads(): self.threads,
            hints.inference_precision(): ov.Type.f32,
        }

    def engine_threads(self) -> dict[str, Any]:
        """The settings compile_model is given; what each compiled model reports is in its export's record."""
        return {"inference_num_threads": self.threads, "num_streams": 1, "performance_hint": "LATENCY"}

    def configure_precision(self) -> dict[str, object]:
        return {
            "openvino_precision": "INFERENCE_PRECISION_HINT=f32 (OpenVINO's CPU default is bf16 where the CPU has "
            "bf16 units)",
            "cpu_optimization_capabilities": list(self.core.get_property(DEVICE, props.device.capabilities())),
        }

    def export(self, inputs: Sequence[np.ndarray], path: str) -> dict[str, Any]:
        return self.exporter.to_onnx(self.model, inputs, path)

    def load(self, path: str, inputs: Sequence[np.ndarray]) -> dict[str, Any]:
        compiled = self.core.compile_model(path, DEVICE, self.config())
        if len(compiled.inputs) != len(inputs):
            raise RuntimeError(f"the compiled model takes {len(compiled.inputs)} inputs, the model {len(inputs)}")
        self._request = compiled.create_infer_request()
        return {"compiled": {name: plain(compiled.get_property(name)) for name in REPORTED}}

    def release(self) -> None:
        self._request = None

    def infer(self, inputs: Sequence[Any]) -> tuple[np.ndarray, ...]:
        assert self._request is not None, "compile() first"
        # The inputs used in place (as ORT uses contiguous numpy inputs); the outputs copied out of the request's
        # buffers, which its next call reuses.
        return self._request.infer(dict(enumerate(inputs)), share_inputs=True).to_tuple()

    def loaded_call(self) -> Callable[[Sequence[np.ndarray]], Sequence[np.ndarray]]:
        request = self._request
        assert request is not None, "compile() first"
        return lambda inputs: request.infer(dict(enumerate(inputs)), share_inputs=True).to_tuple()

    def kernel_libraries(self, step: Callable[[], object], inputs: Sequence[Any]) -> list[dict[str, Any]]:
        """The runtime model's primitive types, per library and ISA (openvino/kernels.py)."""
        if self._request is None:
            return super().kernel_libraries(step, inputs)
        from fwbench.frameworks.openvino import kernels

        return kernels.kernel_libraries(self._request)

    def versions(self) -> dict[str, str]:
        return {"openvino": ov.get_version(), **self.exporter.versions()}


def create_backend(
    mode: str, device: str, settings: Settings, *, dtype: str = "fp32", phase: str = "inference"
) -> OpenVinoBackend:
    return OpenVinoBackend(mode, device, settings, dtype=dtype, phase=phase)
