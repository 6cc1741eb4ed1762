"""The kernel libraries a JAX cell ran (``details.kernels``, :meth:`fwbench.frameworks.base.Backend.kernel_libraries`):
the jitted forward lowered and compiled for the timed inputs (XLA's compilation cache makes this the timed program),
its optimised HLO text parsed: dots and convolutions in YNNPACK custom fusions (``__ynn_fusion``) are YNNPACK's,
the rest XLA:CPU's own. XLA reports no ISA. oneDNN's verbose lines are parsed too, should a jaxlib hand work to it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jaxlib

from fwbench.frameworks.kernel_reports import captured_stdout, parse_hlo, parse_onednn


def compiled_text(function: Any, *arguments: Any) -> str:
    """The optimised HLO module XLA compiled ``function`` (a ``jax.jit`` object) into for ``arguments``."""
    return str(function.lower(*arguments).compile().as_text())


def kernel_libraries(
    function: Any,
    arguments: Sequence[Any],
    step: Callable[[], object],
    *,
    later: Callable[[], Sequence[Any]] | None = None,
) -> list[dict[str, Any]]:
    """``details.kernels`` of a cell whose timed call ``step`` runs the jitted ``function`` on ``arguments`` (or on
    ``later()``'s, read after the probe call: a call that donates its arguments)."""
    with captured_stdout() as captured:
        step()
    lowered_for = later() if later is not None else arguments
    return parse_hlo(compiled_text(function, *lowered_for), jaxlib.__version__) + parse_onednn(captured.text)
