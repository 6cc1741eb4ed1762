"""LiteRT backend (:mod:`fwbench.frameworks.exported`). Mode ``tensorflow``: our tf.Module's ``tf.function`` at the
cell's input signature (every shape fixed) converted by ``tf.lite.TFLiteConverter.from_concrete_functions``
(float32, no quantisation; ``--dtype int8``: dynamic-range quantisation), run by ``ai_edge_litert.interpreter.Interpreter`` with its default XNNPACK delegate
and ``num_threads`` = the thread budget. The timed call is the ``serving_default`` signature runner called on
numpy inputs: it copies each input into the interpreter's tensor, ``invoke()``s and copies each output out (its
API has no in-place inputs; ORT and OpenVINO use the inputs in place).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from importlib.metadata import version
from typing import Any

import numpy as np
from ai_edge_litert.interpreter import Interpreter

from fwbench.frameworks.exported import ExportedBackend
from fwbench.frameworks.roles import TfliteExporter, as_tflite_exporter
from fwbench.spec import Settings

SIGNATURE = "serving_default"


class LiteRtBackend(ExportedBackend):
    framework = "litert"
    modes = ("tensorflow",)
    suffix = ".tflite"
    cuda_unavailable = "LiteRT's GPU delegate runs on mobile GPUs, not CUDA"

    def __init__(
        self, mode: str, device: str, settings: Settings, *, dtype: str = "fp32", phase: str = "inference"
    ) -> None:
        super().__init__(mode, device, settings, dtype=dtype, phase=phase)
        self._interpreter: Interpreter | None = None
        self._runner: Any = None
        self._outputs: list[str] = []

    @functools.cached_property
    def exporter(self) -> TfliteExporter:
        """The exporting framework's ``deploy.py`` in its exporter role."""
        return as_tflite_exporter(self.deploy)

    def engine_threads(self) -> dict[str, Any]:
        return {"num_threads": self.threads}

    def configure_precision(self) -> dict[str, object]:
        if self.dtype == "int8":
            return {
                "litert_precision": "dynamic-range int8: int8 weights, activations quantised per call by the int8 "
                "kernels (XNNPACK), float32 elsewhere"
            }
        return {"litert_precision": "float32 model, XNNPACK delegate in float32 (no quantisation, no fp16)"}

    def export(self, inputs: Sequence[np.ndarray], path: str) -> dict[str, Any]:
        how = self.exporter.to_tflite(self.model, inputs, path, quantize=self.dtype == "int8")
        if self.dtype == "int8":
            details = Interpreter(model_path=path).get_tensor_details()
            how["int8_tensors"] = sum(1 for tensor in details if tensor["dtype"] == np.int8)
            if not how["int8_tensors"]:  # the file would run in float32 and be reported as int8
                raise RuntimeError("the TFLite converter quantised no tensor of the model")
        return how

    def load(self, path: str, inputs: Sequence[np.ndarray]) -> dict[str, Any]:
        interpreter = Interpreter(model_path=path, num_threads=self.threads)
        signature = interpreter.get_signature_list()[SIGNATURE]
        if len(signature["inputs"]) != len(inputs):
            raise RuntimeError(f"the converted model takes inputs {signature['inputs']}, the model {len(inputs)}")
        interpreter.allocate_tensors()  # here, not in the first call: tensors and XNNPACK's packed weights
        self._runner = interpreter.get_signature_runner(SIGNATURE)
        self._interpreter = interpreter
        self._outputs = sorted(signature["outputs"], key=lambda name: int(name.rsplit("_", 1)[1]))
        return {"signature": f"{SIGNATURE}: {', '.join(signature['inputs'])} -> {', '.join(self._outputs)}"}

    def release(self) -> None:
        self._runner = self._interpreter = None

    def infer(self, inputs: Sequence[Any]) -> tuple[np.ndarray, ...]:
        assert self._runner is not None, "compile() first"
        result = self._runner(**{f"input_{i}": a for i, a in enumerate(inputs)})
        return tuple(result[name] for name in self._outputs)

    def kernel_libraries(self, step: Callable[[], object], inputs: Sequence[Any]) -> list[dict[str, Any]]:
        """The interpreter's ops: the XNNPACK delegate's and the built-in kernels' (litert/kernels.py)."""
        if self._interpreter is None:
            return super().kernel_libraries(step, inputs)
        from fwbench.frameworks.litert import kernels

        return kernels.kernel_libraries(self._interpreter)

    def versions(self) -> dict[str, str]:
        return {"ai-edge-litert": version("ai-edge-litert"), **self.exporter.versions()}


def create_backend(
    mode: str, device: str, settings: Settings, *, dtype: str = "fp32", phase: str = "inference"
) -> LiteRtBackend:
    return LiteRtBackend(mode, device, settings, dtype=dtype, phase=phase)
