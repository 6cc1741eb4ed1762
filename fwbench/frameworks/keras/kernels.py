"""The kernel libraries a Keras 3 cell ran (``details.kernels``, :meth:`fwbench.frameworks.base.Backend.kernel_libraries`),
by its Keras backend's framework's own probe: keras:torch as torch:eager's (oneMKL and oneDNN verbose of one more
predict call, ATen's capability), keras:tensorflow as tensorflow:function's (or the XLA cluster's HLO when Keras
compiled with XLA: not reported), keras:jax from the compiled HLO of the ``jax.jit`` predict step Keras made (found
in its predict function's closure, lowered for the state and batch the timed call passes). Each framework is
imported only by its own branch: one process holds one Keras backend.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Sequence
from typing import Any

from fwbench.frameworks.kernel_reports import not_reported_entry


def jitted_in(function: Any) -> Any | None:
    """The first ``jax.jit`` object (it has ``lower``) reachable through ``function``'s closures, or None."""
    seen: set[int] = set()
    pending = [function]
    while pending:
        item = pending.pop(0)
        if id(item) in seen:
            continue
        seen.add(id(item))
        if hasattr(item, "lower") and callable(item):
            return item
        if isinstance(item, types.FunctionType):
            pending.extend(cell.cell_contents for cell in item.__closure__ or () if _filled(cell))
    return None


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018 (an empty cell raises)
    except ValueError:
        return False
    return True


def jax_entries(step: Callable[[], object], predict: Any, state: Callable[[], Any], batch: Any) -> list[dict[str, Any]]:
    """keras:jax: the HLO of Keras' jitted predict step, lowered for ``state()`` (read after the probe call: each
    call donates the state it is given) and ``batch``."""
    from fwbench.frameworks.jax import kernels

    jitted = jitted_in(predict)
    if jitted is None:
        return [not_reported_entry("Keras' predict function holds no jax.jit step (run eagerly?): no compiled HLO")]
    return kernels.kernel_libraries(jitted, (), step, later=lambda: (state(), batch))


def kernel_libraries(
    keras_backend: str, step: Callable[[], object], inputs: Sequence[Any], device: str, **keras: Any
) -> list[dict[str, Any]]:
    """``details.kernels`` of a Keras cell on ``keras_backend``; ``keras``: ``jit_compile`` (Keras' resolution),
    and for jax ``predict`` (the predict function), ``state`` (a callable giving the current state), ``batch``."""
    if keras_backend == "torch":
        from fwbench.frameworks.torch import kernels as torch_kernels

        return torch_kernels.kernel_libraries(step, "eager", device)
    if keras_backend == "tensorflow":
        if keras.get("jit_compile"):
            return [not_reported_entry("Keras compiled its predict step with XLA: fwbench reads no HLO of it")]
        from fwbench.frameworks.tensorflow import kernels as tf_kernels

        return tf_kernels.kernel_libraries(step, None, inputs, "function")
    if keras_backend == "jax":
        return jax_entries(step, keras["predict"], keras["state"], keras["batch"])
    return [not_reported_entry(f"no kernel-library probe for the Keras backend {keras_backend}")]
