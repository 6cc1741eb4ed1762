"""A test-only plugin model that the TensorFlow exporters cannot all express: ``gelu-mlp``, the plugin MLP with
Keras' exact GELU (``0.5·x·erfc(−x/√2)``, which lowers to TF's ``Erfc`` op: tf2onnx has no conversion for it)
in place of tanh, implemented in TensorFlow only. A deployment cell of it must be stored as ``error`` with the
exporter's message while the sweep goes on."""

from __future__ import annotations

import numpy as np
from scipy.special import erf

from fwbench.frameworks.roles import builtin_package
from fwbench.models import register_model
from fwbench_plugin_model import PluginMLP

ARCH = "gelu_mlp"


class GeluMLP(PluginMLP):
    """``x`` (batch, 8) float32 → exact GELU(x·W1ᵀ + b1) (batch, 16) → ``logits`` (batch, 4)."""

    name = "gelu-mlp"
    arch = ARCH
    implementations = {builtin_package("tensorflow"): f"{__name__}.tensorflow.{ARCH}"}

    def reference_forward(self, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        w = {name: value.astype(np.float64) for name, value in weights.items()}
        pre = inputs["x"].astype(np.float64) @ w["hidden.weight"].T + w["hidden.bias"]
        hidden = 0.5 * pre * (1.0 + erf(pre / np.sqrt(2.0)))
        return {"logits": hidden @ w["out.weight"].T + w["out.bias"]}

    def training_unsupported(self) -> str | None:
        return "gelu-mlp is an inference-only test model"


register_model(GeluMLP())
