"""torch's side of the deployment runtimes (:class:`fwbench.frameworks.roles.OnnxExporter`): our torch model,
with the canonical weights, written as an ONNX file that ``onnxruntime:torch`` and ``openvino:torch`` run."""

from __future__ import annotations

from collections.abc import Sequence
from importlib.metadata import version
from typing import Any

import numpy as np
import torch


def configure(threads: int) -> None:
    """The exporter traces in full float32 with the cell's thread budget."""
    torch.set_num_threads(threads)
    torch.set_float32_matmul_precision("highest")


def to_onnx(model: Any, inputs: Sequence[np.ndarray], path: str) -> dict[str, Any]:
    """``torch.onnx.export(dynamo=True)`` of ``model`` (an ``nn.Module``) traced on ``inputs``; the weights are
    inside the one file (``external_data=False``), the input shapes fixed. Returns how it was exported and the
    default-domain opset of the written graph."""
    with torch.no_grad():
        program = torch.onnx.export(
            model.eval(),
            tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in inputs),
            path,
            dynamo=True,
            external_data=False,
            verbose=False,
        )
    assert program is not None, "torch.onnx.export(dynamo=True) returns the ONNXProgram it wrote"
    return {"exporter": "torch.onnx.export(dynamo=True)", "opset": program.model.opset_imports.get("")}


def versions() -> dict[str, str]:
    return {"torch": torch.__version__, "onnxscript": version("onnxscript")}
