"""Test-only backend that trains with another learning rate, on purpose (registered by ``fwbench_test_plugin``).

``wronglr:torch`` is torch:eager whose optimizer gets 1.5× the shared learning rate: its inference matches
torch:eager exactly, its training curve does not, which ``fwbench verify --phase training`` must catch.
Imported only inside a worker, through the runtime registry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from fwbench.spec import Settings

LEARNING_RATE_FACTOR = 1.5


def create_backend(mode: str, device: str, settings: Settings, *, dtype: str = "fp32", phase: str = "inference") -> Any:
    from fwbench.frameworks.torch import training
    from fwbench.frameworks.torch.backend import TorchBackend

    class WrongLearningRate(TorchBackend):
        def make_train_step(self, inputs: Sequence[Any], targets: Sequence[Any]) -> Callable[[], object]:
            make_optimizer = training.make_optimizer

            def scaled(spec: Any, params: Any) -> Any:
                return make_optimizer(
                    dataclasses.replace(spec, learning_rate=spec.learning_rate * LEARNING_RATE_FACTOR), params
                )

            training.make_optimizer = scaled
            try:
                return super().make_train_step(inputs, targets)
            finally:
                training.make_optimizer = make_optimizer

    if mode != "torch":
        raise ValueError(f"no wrong-learning-rate backend for {mode!r}")
    return WrongLearningRate("eager", device, settings, dtype=dtype, phase=phase)
