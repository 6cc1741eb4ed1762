"""``torchserve:torch``'s backend: the model and settings TorchServe will serve (phase serving only). It computes
nothing itself; :meth:`TorchServeBackend.start_server` archives the model and starts TorchServe
(:mod:`fwbench.frameworks.torchserve.server`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from fwbench.frameworks.base import Backend
from fwbench.frameworks.torchserve import server
from fwbench.models.base import ModelDescription
from fwbench.spec import Settings

ONLY_SERVED = "torchserve:torch runs in phase serving only: TorchServe computes, behind its own server"


class TorchServeBackend(Backend):
    framework = "torchserve"
    modes = ("torch",)
    serves_itself: ClassVar[bool] = True

    def configure_threads(self, intra_op: int, inter_op: int) -> dict[str, Any]:
        self.threads = intra_op
        return {
            "model_worker_torch_threads": intra_op,
            "model_workers": 1,
            "number_of_netty_threads": 1,
            "netty_client_threads": 1,
        }

    def configure_precision(self) -> dict[str, object]:
        return {"model_worker": "torch:eager's: float32 matmuls in full float32 (torch.set_float32_matmul_precision)"}

    def build(self, description: ModelDescription, weights: dict[str, np.ndarray]) -> None:
        description.check_weights(weights)
        self.description = description
        self._weights = weights  # archived with the model when the server starts

    def start_server(
        self, folder: Path, *, max_batch: int, max_delay_s: float, buckets: Sequence[int], seq_len: int | None,
        queue_rows: int, port: int,
    ) -> server.TorchServe:  # fmt: skip
        """TorchServe serving the built model (start it with ``with``)."""
        assert self.description is not None, "build() first"
        return server.TorchServe(
            folder, self.description, self._weights, max_batch=max_batch, max_delay_s=max_delay_s, buckets=buckets,
            seq_len=seq_len, threads=self.threads, seed=self.settings.seed, warmup_calls=self.settings.warmup_calls,
            queue_rows=queue_rows, port=port,
        )  # fmt: skip

    def make_inputs(self, arrays: dict[str, np.ndarray]) -> tuple[Any, ...]:
        raise NotImplementedError(ONLY_SERVED)

    def compile(self, inputs: Sequence[Any]) -> None:
        raise NotImplementedError(ONLY_SERVED)

    def infer(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
        raise NotImplementedError(ONLY_SERVED)

    def sync(self, outputs: Any) -> None:
        raise NotImplementedError(ONLY_SERVED)

    def to_numpy(self, outputs: Sequence[Any]) -> dict[str, np.ndarray]:
        raise NotImplementedError(ONLY_SERVED)

    def versions(self) -> dict[str, str]:
        return server.versions()


def create_backend(
    mode: str, device: str, settings: Settings, *, dtype: str = "fp32", phase: str = "serving"
) -> TorchServeBackend:
    if device != "cpu":
        raise NotImplementedError("torchserve:torch is measured on the CPU here")
    return TorchServeBackend(mode, device, settings, dtype=dtype, phase=phase)
