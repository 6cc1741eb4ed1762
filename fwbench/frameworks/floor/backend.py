"""Runtime ``floor:identity``: a model whose outputs are its inputs, computed by nothing. Served by the same server,
batcher and load generator as every runtime (phase serving), it is the floor: the latency and capacity of the
harness alone (HTTP, the protocol's encoding, batching, the client), so a report can say how much of a runtime's
p99 is the framework. Its parity check under load is exact: every answer must equal its request."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from fwbench.frameworks.base import Backend
from fwbench.models.base import ModelDescription
from fwbench.spec import Settings


class IdentityBackend(Backend):
    """Echoes its inputs; builds nothing (the weights are not read)."""

    framework = "floor"
    modes = ("identity",)
    echoes_inputs: ClassVar[bool] = True

    def configure_threads(self, intra_op: int, inter_op: int) -> dict[str, Any]:
        return {"computes": "nothing"}

    def configure_precision(self) -> dict[str, object]:
        return {"computes": "nothing"}

    def build(self, description: ModelDescription, weights: dict[str, np.ndarray]) -> None:
        self.description = description
        self._names: tuple[str, ...] = ()

    def make_inputs(self, arrays: dict[str, np.ndarray]) -> tuple[Any, ...]:
        self._names = tuple(arrays)
        return tuple(arrays.values())

    def compile(self, inputs: Sequence[Any]) -> None:
        return None

    def infer(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
        return tuple(inputs)

    def sync(self, outputs: Any) -> None:
        return None

    def to_numpy(self, outputs: Sequence[Any]) -> dict[str, np.ndarray]:
        return {name: np.asarray(array) for name, array in zip(self._names, outputs)}

    def versions(self) -> dict[str, str]:
        return {"numpy": np.__version__}


def create_backend(
    mode: str, device: str, settings: Settings, *, dtype: str = "fp32", phase: str = "serving"
) -> IdentityBackend:
    return IdentityBackend(mode, device, settings, dtype=dtype, phase=phase)
