"""A test-only plugin that adds a MODEL: ``plugin-mlp``, implemented in two frameworks inside this package.

Loaded through the real plugin mechanism ($FWBENCH_PLUGINS=fwbench_plugin_model with tests/ on PYTHONPATH),
it follows the checklist for adding a model from outside fwbench:
1. a framework-free description (:class:`PluginMLP`: parameter schema, seeded canonical weights, inputs,
   FLOPs, a float64 reference forward and loss), registered with ``fwbench.models.register_model``;
2. one model file per framework, with the same file name in each framework package of this plugin
   (``torch/plugin_mlp.py``, ``jax/plugin_mlp.py``), each providing what ``fwbench.frameworks.base``'s
   ``ArchModule`` and ``TrainingArch`` say, loading the canonical weights through the framework's checked
   name map;
3. ``PluginMLP.implementations`` naming those files for the built-in framework packages, so the built-in
   runtimes torch:eager and jax:jit build the model (the registry resolves the file; nothing in fwbench
   names this package);
4. a plugin runtime, ``pluginfw:torch``, whose framework package is this plugin's ``torch`` folder
   (``RuntimeInfo.package``): its backend is PyTorch's, its model files are looked up here.
"""

from __future__ import annotations

import numpy as np

from fwbench.frameworks import RuntimeInfo, register_runtime
from fwbench.frameworks.roles import builtin_package
from fwbench.models import register_model
from fwbench.models.base import ModelDescription, ParamSpec, tensor_rng
from fwbench.models.training import class_targets, reference_loss

PACKAGE = __name__
ARCH = "plugin_mlp"


class PluginMLP(ModelDescription):
    """``x`` (batch, 8) float32 → tanh(x·W1ᵀ + b1) (batch, 16) → ``logits`` (batch, 4). Parameters in
    nn.Linear's (out, in) layout."""

    name = "plugin-mlp"
    arch = ARCH
    has_sequence = False
    output_names = ("logits",)
    widths = (8, 16, 4)
    implementations = {builtin_package(framework): f"{PACKAGE}.{framework}.{ARCH}" for framework in ("torch", "jax")}

    def param_schema(self) -> list[ParamSpec]:
        (n_in, hidden, n_out) = self.widths
        return [
            ParamSpec("hidden.weight", (hidden, n_in)),
            ParamSpec("hidden.bias", (hidden,)),
            ParamSpec("out.weight", (n_out, hidden)),
            ParamSpec("out.bias", (n_out,)),
        ]

    def canonical_weights(self, seed: int = 0) -> dict[str, np.ndarray]:
        """N(0, 0.5) per tensor, seeded by name: biases non-zero, so a tensor mapped wrongly fails parity."""
        return {
            spec.name: tensor_rng(seed, spec.name).normal(0.0, 0.5, size=spec.shape).astype(np.float32)
            for spec in self.param_schema()
        }

    def make_inputs(self, batch_size: int, seq_len: int | None, seed: int = 0) -> dict[str, np.ndarray]:
        rng = tensor_rng(seed, f"inputs/x/{batch_size}")
        return {"x": rng.standard_normal((batch_size, self.widths[0])).astype(np.float32)}

    def forward_flops(self, batch_size: int, seq_len: int | None) -> int:
        """2·batch·Σ(in·out) of the two matmuls."""
        n_in, hidden, n_out = self.widths
        return 2 * batch_size * (n_in * hidden + hidden * n_out)

    def reference_forward(self, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        w = {name: value.astype(np.float64) for name, value in weights.items()}
        hidden = np.tanh(inputs["x"].astype(np.float64) @ w["hidden.weight"].T + w["hidden.bias"])
        return {"logits": hidden @ w["out.weight"].T + w["out.bias"]}

    def training_unsupported(self) -> str | None:
        return None

    def make_targets(self, batch_size: int, seq_len: int | None, seed: int = 0) -> dict[str, np.ndarray]:
        return class_targets(batch_size, self.widths[-1], seed)

    def reference_loss(
        self, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray], targets: dict[str, np.ndarray]
    ) -> float:
        logits = self.reference_forward(weights, inputs)["logits"]
        return reference_loss(logits, targets["labels"], targets["label_weights"])


PLUGIN_MLP = PluginMLP()
register_model(PLUGIN_MLP)
register_runtime(
    RuntimeInfo(
        "pluginfw:torch",
        f"{PACKAGE}.torch.backend",
        ("torch",),
        "test-only plugin framework: PyTorch's eager backend with its model files in fwbench_plugin_model.torch",
        phases=("inference", "training"),
        training="as torch:eager",
        dtypes=("fp32",),
        package=f"{PACKAGE}.torch",
    )
)
