"""A matmul microbenchmark as a model: one bias-free square linear layer, ``y = x @ W``.

It goes through exactly the worker path every model does (pinning, thread budget, precision,
first call, parity, timing), so its GFLOP/s at ``batch = n`` is the machine's fp32 matmul peak as
each framework reaches it (``fwbench env --peak``), and the yardstick for every other cell's
achieved GFLOP/s.

``n = 3072`` makes the call at ``batch = n`` (58 GFLOP) last a few tenths of a second on two
cores of a 2-core AMD EPYC (about 0.34 s in torch at ~170 GFLOP/s): long enough that call
overhead is nothing beside the matmul, short enough that the adaptive protocol collects a dozen
samples or more within its default 5 s budget. W and x are 36 MiB each in float32.

Parameter ``weight``: (n, n) float32 in (in_features, out_features) layout, so every framework
computes the same plain ``x @ W`` (no transpose). Input ``x``: (batch, n) float32. Output ``y``:
(batch, n).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fwbench.models.base import ModelDescription, ParamSpec, tensor_rng
from fwbench.spec import SpecError

GEMM_N = 3072


@dataclass(frozen=True)
class GemmConfig:
    """The side of the square weight matrix."""

    n: int = GEMM_N

    def __post_init__(self) -> None:
        if self.n <= 0:
            raise SpecError(f"gemm size n must be positive, got {self.n}")


class Gemm(ModelDescription):
    name = "gemm"
    arch = "gemm"
    has_sequence = False
    output_names = ("y",)

    def __init__(self, config: GemmConfig | None = None, name: str = "gemm") -> None:
        self.config = config or GemmConfig()
        self.name = name

    @property
    def n(self) -> int:
        return self.config.n

    def param_schema(self) -> list[ParamSpec]:
        return [ParamSpec("weight", (self.n, self.n))]

    def canonical_weights(self, seed: int = 0) -> dict[str, np.ndarray]:
        """N(0, 1/n): outputs keep the inputs' unit scale. Not symmetric, so a transposed W fails parity."""
        rng = tensor_rng(seed, "weight")
        return {"weight": (rng.standard_normal((self.n, self.n)) / np.sqrt(self.n)).astype(np.float32)}

    def make_inputs(self, batch_size: int, seq_len: int | None, seed: int = 0) -> dict[str, np.ndarray]:
        rng = tensor_rng(seed, f"inputs/x/{batch_size}")
        return {"x": rng.standard_normal((batch_size, self.n)).astype(np.float32)}

    def forward_flops(self, batch_size: int, seq_len: int | None) -> int:
        """2·batch·n·n (one multiply-add per weight per row)."""
        return 2 * batch_size * self.n * self.n

    def reference_forward(self, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"y": inputs["x"].astype(np.float64) @ weights["weight"].astype(np.float64)}

    def parity_shape(self) -> tuple[int, int | None]:
        """4 rows of n: every column of W is checked, and the float64 reference stays cheap."""
        return 4, None


GEMM = Gemm()
