"""Test-only backends that retrace on every call, on purpose (registered by ``fwbench_test_plugin``).

``retrace:jax`` jits the model with a static argument that changes at every call, and
``retrace:tensorflow`` calls a tf.function with a new Python integer at every call: both trace (and
compile) again inside the timed loop, which the worker must detect and the report must flag.
Imported only inside a worker, through the runtime registry.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from fwbench.spec import Settings


def create_backend(mode: str, device: str, settings: Settings, *, dtype: str = "fp32", phase: str = "inference") -> Any:
    if mode == "jax":
        import jax

        from fwbench.frameworks.jax.backend import JaxBackend

        class RetracingJax(JaxBackend):
            modes = ("jax",)

            def compile(self, inputs: Sequence[Any]) -> None:
                super().compile(inputs)
                apply = self.model.apply
                self._calls = itertools.count()
                self._retracing = jax.jit(lambda n, params, *xs: apply(params, *xs), static_argnums=0)

            def infer(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
                return self._retracing(next(self._calls), self._params, *inputs)

        return RetracingJax(mode, device, settings, dtype=dtype, phase=phase)
    if mode == "tensorflow":
        import tensorflow as tf

        from fwbench.frameworks.tensorflow.backend import TensorFlowBackend

        class RetracingTensorFlow(TensorFlowBackend):
            modes = ("tensorflow",)

            def compile(self, inputs: Sequence[Any]) -> None:
                model = self.model
                self._calls = itertools.count()
                self._forward = tf.function(lambda n, *xs: model(*xs))  # a Python int: one trace per value

            def infer(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
                return self._forward(next(self._calls), *inputs)

        return RetracingTensorFlow(mode, device, settings, dtype=dtype, phase=phase)
    raise ValueError(f"no retracing backend for {mode!r}")
