"""The kernel libraries an ONNX Runtime cell ran (``details.kernels``,
:meth:`fwbench.frameworks.base.Backend.kernel_libraries`): the CPU execution provider's heavy kernels (MatMul, Gemm,
Conv and their fusions) are MLAS's, which ships inside ONNX Runtime (its version is ONNX Runtime's). MLAS picks its
kernels by CPUID when it loads, and no ONNX Runtime API reports which ISA it picked: "not reported".
"""

from __future__ import annotations

from typing import Any

import onnxruntime as ort

from fwbench.frameworks.kernel_reports import kernel_entry

SOURCE = "onnxruntime.InferenceSession.get_providers()"
MLAS_ISA = (
    "MLAS chooses its kernels by CPUID when ONNX Runtime loads; no ONNX Runtime API reports that choice, nor which "
    "nodes of the optimised graph ran on MLAS"
)


def kernel_libraries(session: ort.InferenceSession) -> list[dict[str, Any]]:
    """``details.kernels`` of a cell run by ``session``: MLAS for the CPU execution provider; any other provider
    named, not reported."""
    entries = []
    for provider in session.get_providers():
        if provider == "CPUExecutionProvider":
            entries.append(
                kernel_entry("MLAS", version=ort.__version__, isa=None, ops=(), source=SOURCE, not_reported=MLAS_ISA)
            )
        else:
            reason = f"fwbench reads no kernel report of {provider}"
            entries.append(kernel_entry(provider, version=None, isa=None, ops=(), source=SOURCE, not_reported=reason))
    return entries
