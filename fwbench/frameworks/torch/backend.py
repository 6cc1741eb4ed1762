"""PyTorch backend. Modes:

- ``eager``: the nn.Module, called under ``torch.inference_mode()``;
- ``script``: ``torch.jit.trace`` on the cell's inputs, then ``torch.jit.freeze`` (the 2019 study's
  TorchScript; deprecated upstream since PyTorch 2.9, whose warnings are left as they are);
- ``compile``: ``torch.compile(fullgraph=True)`` with inductor; compilation happens in the first call.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import numpy as np
import torch

from fwbench.frameworks.base import Backend
from fwbench.spec import Settings


class TorchBackend(Backend):
    framework = "torch"
    modes = ("eager", "script", "compile")

    def configure_threads(self, intra_op: int, inter_op: int) -> dict[str, int]:
        torch.set_num_threads(intra_op)
        try:
            torch.set_num_interop_threads(inter_op)
        except RuntimeError:  # already set once in this process; report what is in force
            pass
        return {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads()}

    def configure_precision(self) -> dict[str, object]:
        torch.set_float32_matmul_precision("highest")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        return {
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        }

    def make_inputs(self, arrays: dict[str, np.ndarray]) -> tuple[torch.Tensor, ...]:
        return tuple(torch.from_numpy(np.ascontiguousarray(a)).to(self.device) for a in arrays.values())

    def compile(self, inputs: Sequence[Any]) -> None:
        # One worker runs one inference cell, so autograd is switched off for the whole process:
        # no per-call context manager inside the timed loop.
        if not hasattr(self, "_inference_mode"):
            self._inference_mode = torch.inference_mode()
            self._inference_mode.__enter__()
        if self.mode == "script":
            traced = torch.jit.trace(self.model, tuple(inputs), check_trace=False)
            self._forward = torch.jit.freeze(traced)
        elif self.mode == "compile":
            self._forward = torch.compile(self.model, fullgraph=True)
        else:
            self._forward = self.model

    def infer(self, inputs: Sequence[Any]) -> tuple[torch.Tensor, ...]:
        return self._forward(*inputs)

    def sync(self, outputs: Any) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def make_step(self, inputs: Sequence[Any]) -> Callable[[], object]:
        if self.device == "cpu":  # CPU kernels finish before the call returns: nothing to wait for
            return functools.partial(self._forward, *inputs)
        return super().make_step(inputs)

    def to_numpy(self, outputs: Sequence[torch.Tensor]) -> dict[str, np.ndarray]:
        assert self.description is not None
        return {name: t.detach().float().cpu().numpy() for name, t in zip(self.description.output_names, outputs)}

    def reset_peak_memory(self) -> None:
        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()

    def memory_stats(self) -> dict[str, int | None]:
        if self.device == "cuda":
            return {"allocator_peak_bytes": int(torch.cuda.max_memory_allocated())}
        return {"allocator_peak_bytes": None}

    def versions(self) -> dict[str, str]:
        return {"torch": torch.__version__, "mkldnn": str(torch.backends.mkldnn.is_available())}

    def is_oom(self, exc: BaseException) -> bool:
        if isinstance(exc, torch.OutOfMemoryError):
            return True
        return super().is_oom(exc) or (isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc))


def create_backend(mode: str, device: str, settings: Settings) -> TorchBackend:
    return TorchBackend(mode, device, settings)
