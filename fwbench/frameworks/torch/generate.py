"""Phase generate in PyTorch (:class:`DecodeProgram`): the model file's ``cached_forward`` over a preallocated
key/value cache (``new_cache``: every layer's keys and values for the whole generation, written in place at each
call's positions), called eagerly under ``torch.inference_mode()`` or ``torch.compile``d once (fullgraph, static
shapes): the position is a 0-d tensor, so the prefill's shape and the decode's (batch, 1) are the only two programs
and no decode step recompiles."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
import torch

from fwbench.frameworks.roles import as_cached_decoder_arch


class DecodeProgram:
    """One cell's prefill and decode calls over one cache (``mode``: eager or compile)."""

    def __init__(
        self, arch: ModuleType, model: torch.nn.Module, batch: int, max_len: int, mode: str, compile_mode: str,
        compiler: str = "inductor", dtype: str = "fp32",
    ) -> None:  # fmt: skip
        """``compiler``: torch.compile's backend (compile mode; inductor, or "eager" for Dynamo's graphs alone);
        ``dtype`` bf16: each call under ``torch.autocast(bfloat16)``, the weights and the cache float32."""
        bf16 = dtype == "bf16"
        decoder = as_cached_decoder_arch(arch)
        cached_forward = decoder.cached_forward
        device = next(model.parameters()).device
        self.cache = decoder.new_cache(model, batch, max_len)
        # one 0-d position tensor per position, made here: a decode step allocates nothing for its position
        self._positions = [torch.tensor(p, dtype=torch.int64, device=device) for p in range(max_len)]

        def step(ids: torch.Tensor, start: torch.Tensor, cache: Any) -> tuple[torch.Tensor, torch.Tensor]:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):  # the bf16 policy, as inference's
                logits = cached_forward(model, ids, start, cache)
            return logits.argmax(dim=-1), logits

        self._step: Callable[..., tuple[torch.Tensor, torch.Tensor]] = (
            torch.compile(step, fullgraph=True, dynamic=False, mode=compile_mode, backend=compiler)
            if mode == "compile"
            else step
        )

    def position(self, position: int) -> Any:
        """What the program gets for ``position``: its 0-d tensor."""
        return self._positions[position]

    def prefill(self, prompt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._step(prompt, self.position(0), self.cache)

    def decode(self, token: torch.Tensor, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._step(token[:, None], self.position(position), self.cache)

    def decode_loop(self, token: torch.Tensor, position: int, steps: int) -> None:
        return None  # torch has no compiled loop of its own: the decode steps are Python calls

    def numpy(self, value: torch.Tensor) -> np.ndarray:
        return value.detach().float().cpu().numpy() if value.is_floating_point() else value.cpu().numpy()
