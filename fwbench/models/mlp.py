"""The seed article's 64-64-10 MLP: Dense 64 ReLU, Dense 64 ReLU, Dense 10 (logits).

Parameters use PyTorch's ``nn.Linear`` layout: ``fcN.weight`` is (out_features, in_features).
Input ``x``: (batch, in_features) float32. Output ``logits``: (batch, out_features).
Training: softmax cross-entropy of ``logits`` against seeded class ids (every sample counts).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fwbench.models.base import ModelDescription, ParamSpec, tensor_rng
from fwbench.models.checkpoints import Taps, tap
from fwbench.models.training import class_targets, reference_loss
from fwbench.spec import SpecError


@dataclass(frozen=True)
class MLPConfig:
    """Layer widths of the MLP."""

    in_features: int = 64
    hidden: tuple[int, ...] = (64, 64)
    out_features: int = 10

    def __post_init__(self) -> None:
        for width in (self.in_features, *self.hidden, self.out_features):
            if width <= 0:
                raise SpecError(f"MLP widths must be positive, got {width}")

    @property
    def widths(self) -> tuple[int, ...]:
        return (self.in_features, *self.hidden, self.out_features)


class MLP(ModelDescription):
    name = "mlp"
    arch = "mlp"
    has_sequence = False
    output_names = ("logits",)

    def __init__(self, config: MLPConfig | None = None) -> None:
        self.config = config or MLPConfig()

    @property
    def layers(self) -> list[tuple[str, int, int]]:
        """(prefix, in_features, out_features) per linear layer, input first."""
        w = self.config.widths
        return [(f"fc{i + 1}", w[i], w[i + 1]) for i in range(len(w) - 1)]

    def param_schema(self) -> list[ParamSpec]:
        specs: list[ParamSpec] = []
        for prefix, fan_in, fan_out in self.layers:
            specs += [ParamSpec(f"{prefix}.weight", (fan_out, fan_in)), ParamSpec(f"{prefix}.bias", (fan_out,))]
        return specs

    def canonical_weights(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)), as nn.Linear initialises, seeded per tensor."""
        weights: dict[str, np.ndarray] = {}
        for prefix, fan_in, _ in self.layers:
            bound = 1.0 / np.sqrt(fan_in)
            for spec in (s for s in self.param_schema() if s.name.startswith(prefix + ".")):
                rng = tensor_rng(seed, spec.name)
                weights[spec.name] = rng.uniform(-bound, bound, size=spec.shape).astype(np.float32)
        return weights

    def make_inputs(self, batch_size: int, seq_len: int | None, seed: int = 0) -> dict[str, np.ndarray]:
        rng = tensor_rng(seed, f"inputs/x/{batch_size}")
        return {"x": rng.standard_normal((batch_size, self.config.in_features)).astype(np.float32)}

    def forward_flops(self, batch_size: int, seq_len: int | None) -> int:
        """2·batch·Σ(in·out) for the matmuls."""
        return 2 * batch_size * sum(fan_in * fan_out for _, fan_in, fan_out in self.layers)

    def checkpoint_names(self) -> tuple[str, ...]:
        """Every layer's output, after its ReLU (the last one is the logits)."""
        return tuple(prefix for prefix, _, _ in self.layers)

    def reference_forward(
        self, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray], taps: Taps = None
    ) -> dict[str, np.ndarray]:
        h = inputs["x"].astype(np.float64)
        for i, (prefix, _, _) in enumerate(self.layers):
            h = h @ weights[f"{prefix}.weight"].astype(np.float64).T + weights[f"{prefix}.bias"]
            if i < len(self.layers) - 1:
                h = np.maximum(h, 0.0)
            tap(taps, prefix, h)
        return {"logits": h}

    def reference_checkpoints(
        self, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        taps: dict[str, np.ndarray] = {}
        self.reference_forward(weights, inputs, taps)
        return taps

    def training_unsupported(self) -> str | None:
        return None

    def fit_unsupported(self) -> str | None:
        return None

    def make_targets(self, batch_size: int, seq_len: int | None, seed: int = 0) -> dict[str, np.ndarray]:
        """labels (batch,) int32 class ids in [0, out_features), seeded; label_weights (batch,) all 1."""
        return class_targets(batch_size, self.config.out_features, seed)

    def reference_loss(
        self, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray], targets: dict[str, np.ndarray]
    ) -> float:
        logits = self.reference_forward(weights, inputs)["logits"]
        return reference_loss(logits, targets["labels"], targets["label_weights"])
