"""The kernel libraries a TensorFlow cell ran (``details.kernels``, :meth:`fwbench.frameworks.base.Backend.kernel_libraries`).

- xla: the compiled cluster's optimised HLO (``experimental_get_compiler_ir(...)(stage="optimized_hlo")``), parsed
  as JAX's is: XLA:CPU's own dots and convolutions (or a library's custom fusions). XLA reports no ISA.
- eager, function, savedmodel: TensorFlow's own kernels, oneDNN's where TensorFlow says its oneDNN ops are on
  (``IsMklEnabled``), Eigen's for the rest. TensorFlow reads ``ONEDNN_VERBOSE`` once, at start-up, and exports no
  ``dnnl_set_verbose``, so oneDNN cannot be made to report in-process: its ISA and version are "not reported" unless
  ``ONEDNN_VERBOSE`` was set in the worker's environment, when the probe call's verbose lines (captured from file
  descriptor 1) are parsed. Eigen reports neither.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf
from tensorflow.python.util import _pywrap_util_port

from fwbench.frameworks.kernel_reports import (
    VERBOSE_ENVIRONMENT,
    captured_stdout,
    kernel_entry,
    parse_hlo,
    parse_onednn,
)

MKL_QUERY = "tensorflow.python.util._pywrap_util_port.IsMklEnabled()"
ONEDNN_SILENT = (
    "TensorFlow reads ONEDNN_VERBOSE once, at start-up, and exports no dnnl_set_verbose: oneDNN cannot report "
    "its ISA or version in-process (set ONEDNN_VERBOSE=1 in the worker's environment to have them parsed)"
)
EIGEN_SILENT = "Eigen is compiled into TensorFlow and reports neither its version nor the ISA it was built for"


def xla_text(forward: Any, inputs: Sequence[Any]) -> str:
    """The optimised HLO the tf.function(jit_compile=True) ``forward`` compiles to for ``inputs`` (its parameters after
    them at their defaults, as the timed call leaves them, e.g. resnet's ``taps``: the binding asks for them)."""
    parameters = list(inspect.signature(forward.python_function).parameters.values())[len(inputs) :]
    defaults = {
        p.name: p.default
        for p in parameters
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is not p.empty
    }
    return str(forward.experimental_get_compiler_ir(*inputs, **defaults)(stage="optimized_hlo"))


def native_entries(verbose: str) -> list[dict[str, Any]]:
    """TensorFlow's own kernels: oneDNN's (from ``verbose``, its lines in the probe call when ONEDNN_VERBOSE was set
    at start-up, else named by TensorFlow's query and not reported) where its oneDNN ops are on, and Eigen's."""
    onednn_on = bool(_pywrap_util_port.IsMklEnabled())
    entries = parse_onednn(verbose) if onednn_on else []
    if onednn_on and not entries:
        extra: dict[str, Any] = {VERBOSE_ENVIRONMENT: {"ONEDNN_VERBOSE": "1"}}
        reason = ONEDNN_SILENT
        if os.environ.get("ONEDNN_VERBOSE", "0") not in ("", "0", "none"):
            reason, extra = "ONEDNN_VERBOSE was set, yet the probe call printed no oneDNN primitive", {}
        entries.append(
            kernel_entry("oneDNN", version=None, isa=None, ops=(), source=MKL_QUERY, not_reported=reason, **extra)
        )
    eigen_ops = ("the ops oneDNN does not take",) if onednn_on else ("all ops",)
    entries.append(
        kernel_entry("Eigen", version=None, isa=None, ops=eigen_ops, source=MKL_QUERY, not_reported=EIGEN_SILENT)
    )
    return entries


def kernel_libraries(
    step: Callable[[], object], forward: Any, inputs: Sequence[Any], mode: str
) -> list[dict[str, Any]]:
    """``details.kernels`` of a cell in ``mode`` whose timed call ``step`` runs ``forward`` on ``inputs``."""
    with captured_stdout() as captured:
        step()
    if mode == "xla":
        return parse_hlo(xla_text(forward, inputs), tf.__version__) + parse_onednn(captured.text)
    return native_entries(captured.text)
