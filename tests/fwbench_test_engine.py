"""A throwaway deployment runtime, written by docs/architecture.md's "add a deployment engine" checklist and nothing
else: this one file (the engine's backend and its registry record). ``ortbasic:onnx`` runs torch's ONNX export in
ONNX Runtime with every graph optimisation off; its mode is not the exporting framework's name, so the exporter's
``deploy.py`` is found through the record's ``package`` alone (tests/test_checklists.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fwbench.frameworks import RuntimeInfo, register_runtime
from fwbench.frameworks.exported import ExportedBackend
from fwbench.frameworks.roles import as_onnx_exporter, builtin_package
from fwbench.spec import Settings


class BasicOrtBackend(ExportedBackend):
    framework = "ortbasic"
    modes = ("onnx",)
    suffix = ".onnx"
    cuda_unavailable = "a test engine: CPU only"

    def __init__(
        self, mode: str, device: str, settings: Settings, *, dtype: str = "fp32", phase: str = "inference"
    ) -> None:
        super().__init__(mode, device, settings, dtype=dtype, phase=phase)
        self._session: Any = None

    def _options(self) -> Any:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = self.threads, 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        return options

    def engine_threads(self) -> dict[str, Any]:
        return {"intra_op": self._options().intra_op_num_threads}

    def configure_precision(self) -> dict[str, object]:
        return {"ortbasic_precision": "float32 graph, no optimisation"}

    def export(self, inputs: Sequence[np.ndarray], path: str) -> dict[str, Any]:
        return as_onnx_exporter(self.deploy).to_onnx(self.model, inputs, path)

    def load(self, path: str, inputs: Sequence[np.ndarray]) -> dict[str, Any]:
        import onnxruntime as ort

        self._session = ort.InferenceSession(path, self._options(), providers=["CPUExecutionProvider"])
        return {"optimisation": "ORT_DISABLE_ALL"}

    def release(self) -> None:
        self._session = None

    def infer(self, inputs: Sequence[Any]) -> tuple[np.ndarray, ...]:
        names = [i.name for i in self._session.get_inputs()]
        return tuple(self._session.run(None, dict(zip(names, inputs))))

    def versions(self) -> dict[str, str]:
        import onnxruntime as ort

        return {"onnxruntime": ort.__version__}


def create_backend(
    mode: str, device: str, settings: Settings, *, dtype: str = "fp32", phase: str = "inference"
) -> BasicOrtBackend:
    return BasicOrtBackend(mode, device, settings, dtype=dtype, phase=phase)


register_runtime(
    RuntimeInfo(
        name="ortbasic:onnx",
        module=__name__,
        requires=("onnxruntime", "onnx", "onnxscript", "torch"),
        description="torch's ONNX export in ONNX Runtime, graph optimisation off; session.run timed",
        package=builtin_package("torch"),  # the exporter's model files and deploy.py: torch's
        artefact="ONNX file",
        extras=("deploy", "torch"),
    )
)
