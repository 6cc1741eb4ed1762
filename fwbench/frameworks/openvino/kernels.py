"""The kernel libraries an OpenVINO cell ran (``details.kernels``, :meth:`fwbench.frameworks.base.Backend.kernel_libraries`):
the compiled model's runtime model, whose every executed layer says in its ``rt_info`` which primitive ran it
(``primitiveType``: ``<implementation>_<isa>_<precision>``, e.g. ``brgemm_avx512_f32``, ``gemm_mlas_f32``), aggregated
per (library, ISA) (fwbench.frameworks.kernel_reports.parse_openvino). Nothing is run again.
"""

from __future__ import annotations

from typing import Any

import openvino as ov

from fwbench.frameworks.kernel_reports import parse_openvino

SOURCE = "OpenVINO runtime model rt_info primitiveType"


def layer_primitives(compiled: ov.CompiledModel) -> list[tuple[str, str]]:
    """(layer type, primitiveType) of every layer of ``compiled``'s runtime model, in execution order."""
    layers = []
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        layers.append((str(info["layerType"].astype(str)), str(info["primitiveType"].astype(str))))
    return layers


def kernel_libraries(request: ov.InferRequest) -> list[dict[str, Any]]:
    """``details.kernels`` of a cell whose timed call runs ``request``."""
    return parse_openvino(layer_primitives(request.get_compiled_model()), ov.get_version(), SOURCE)
