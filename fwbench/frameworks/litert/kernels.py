"""The kernel libraries a LiteRT cell ran (``details.kernels``, :meth:`fwbench.frameworks.base.Backend.kernel_libraries`):
the interpreter's execution plan (``Interpreter._get_ops_details()``): the nodes the XNNPACK delegate took appear as
``DELEGATE`` ops, the rest run on LiteRT's built-in kernels (named by their op). Neither reports its ISA; both ship
inside ai-edge-litert (its version).
"""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

from ai_edge_litert.interpreter import Interpreter

from fwbench.frameworks.kernel_reports import kernel_entry

SOURCE = "ai_edge_litert Interpreter._get_ops_details()"
ISA_REASON = "LiteRT reports no ISA: XNNPACK and the built-in kernels choose theirs by CPUID inside the library"


def delegated_nodes(ops: list[dict[str, Any]]) -> set[int]:
    """The indices of the nodes a ``DELEGATE`` node replaced (``ops``: ``_get_ops_details()``, which lists every
    node of the graph, the replaced ones too): those that compute its outputs back to its inputs."""
    producers = {int(t): op["index"] for op in ops if op["op_name"] != "DELEGATE" for t in op["outputs"]}
    by_index = {op["index"]: op for op in ops}
    taken: set[int] = set()
    for delegate in (op for op in ops if op["op_name"] == "DELEGATE"):
        boundary = {int(t) for t in delegate["inputs"]}
        pending = [int(t) for t in delegate["outputs"]]
        while pending:
            node = producers.get(pending.pop())
            if node is None or node in taken:
                continue
            taken.add(node)
            pending.extend(int(t) for t in by_index[node]["inputs"] if t >= 0 and int(t) not in boundary)
    return taken


def kernel_libraries(interpreter: Interpreter) -> list[dict[str, Any]]:
    """``details.kernels`` of a cell run by ``interpreter`` (its tensors allocated, its delegates applied): the ops
    of the nodes XNNPACK took, and of those left to the built-in kernels."""
    ops = interpreter._get_ops_details()  # noqa: SLF001 (the interpreter's only listing of its nodes)
    taken = delegated_nodes(ops)
    delegated = {str(op["op_name"]) for op in ops if op["index"] in taken}
    builtin = {str(op["op_name"]) for op in ops if op["index"] not in taken and op["op_name"] != "DELEGATE"}
    release = version("ai-edge-litert")
    entries = []
    for library, names in (("XNNPACK", delegated), ("LiteRT built-in kernels", builtin)):
        if names:
            entries.append(
                kernel_entry(library, version=release, isa=None, ops=names, source=SOURCE, not_reported=ISA_REASON)
            )
    return entries
