"""Test-only backends that retrace on every call, on purpose (registered by ``fwbench_test_plugin``).

``retrace:jax`` jits the model with a static argument that changes at every call, and
``retrace:tensorflow`` calls a tf.function with a new Python integer at every call: both trace (and
compile) again inside the timed loop, which the worker must detect and the report must flag. ``retrace:torch``
(phase generate) gives torch.compile's decode step its position as a Python int: it compiles again at every step.
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
    if mode == "torch":
        return _int_position_torch(mode, device, settings, dtype=dtype, phase=phase)
    raise ValueError(f"no retracing backend for {mode!r}")


def _int_position_torch(mode: str, device: str, settings: Settings, *, dtype: str, phase: str) -> Any:
    """torch:compile's phase generate with the decode position a Python int instead of a 0-d tensor: Dynamo
    specialises on the int, so every decode step compiles again (the shape-unstable variant)."""
    from fwbench.frameworks.torch.backend import TorchBackend, dynamo_counters
    from fwbench.frameworks.torch.generate import DecodeProgram

    class IntPositions(DecodeProgram):
        def position(self, position: int) -> Any:
            return position

    class IntPositionTorch(TorchBackend):
        modes = ("torch",)

        def make_decoder(self, batch: int, prompt_len: int, new_tokens: int) -> Any:
            self._enter_inference_mode()
            max_len = prompt_len + new_tokens
            # Dynamo's graphs without inductor's code generation: what is counted is the same, in a fraction of the time
            return IntPositions(self.arch_module(), self.model, batch, max_len, "compile", "default", compiler="eager")

        def compile_counters(self) -> dict[str, int]:
            return dynamo_counters()

    return IntPositionTorch(mode, device, settings, dtype=dtype, phase=phase)
