"""Test-only plugin: bert-tiny with one defect injected into one framework's copy of its model file, for
``fwbench diff`` (tests/test_diff.py) to find. Model ``bert-tiny-<defect>-<framework>`` is bert-tiny (same weights,
same float64 reference) whose only implementation is a copy of ``fwbench/frameworks/<framework>/bert.py`` with the
defect, imported as ``fwbench_faulty_models.<framework>_<defect>`` (built on first import by a finder installed here,
so the manager, which imports this plugin too, imports no framework).

Defects, and the checkpoint each must first show in:

- ``transposed-query``: layer 1's query weight transposed when loading → ``encoder.layer.1.attention.output``;
- ``layer-norm-eps``: every LayerNorm built with epsilon 0.1 instead of 1e-12 → ``embeddings``;
- ``tanh-gelu``: the tanh approximation of GELU instead of erf → ``encoder.layer.0.output.dense`` (with feed-forward
  input weights 5× the seeded ones: with the seeded ones both GELUs agree within the fp32 tolerance);
- ``attention-scale``: the attention scores scaled by 2/√d instead of 1/√d (the queries doubled before the framework's
  attention op) → ``encoder.layer.0.attention.output``.

And one defect of the backward pass alone, in torch: ``bert-tiny-gelu-backward-torch``, whose GELU computes the exact
forward but differentiates as Φ(x), forgetting x·φ(x). Its forward matches everywhere; its first gradient off, in
backward order, is layer 1's feed-forward input bias (GRADIENT_DEFECT). That model's jax implementation is the real
one, the base its gradients are compared with.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from fwbench.frameworks.roles import builtin_package
from fwbench.models import register_model
from fwbench.models.bert import BERT_TINY, Bert

FRAMEWORKS = ("torch", "tensorflow", "jax", "keras")
DEFECTS = {
    "transposed-query": "encoder.layer.1.attention.output",
    "layer-norm-eps": "embeddings",
    "tanh-gelu": "encoder.layer.0.output.dense",
    "attention-scale": "encoder.layer.0.attention.output",
}
WRONG_EPS = 0.1
FFN_IN_SCALE = 5.0  # tanh-gelu: the feed-forward input weights' factor (tests/test_diff.py writes those weights)
GRADIENT_MODEL = "bert-tiny-gelu-backward-torch"
GRADIENT_DEFECT = "encoder.layer.1.intermediate.dense.bias"


def model_name(defect: str, framework: str) -> str:
    return f"bert-tiny-{defect}-{framework}"


def module_name(defect: str, framework: str) -> str:
    return f"{__name__}.{framework}_{defect.replace('-', '_')}"


class Patched:
    """``real`` with some attributes replaced (a module the copied model file reads through, e.g. ``F`` or ``ops``)."""

    def __init__(self, real: Any, **replaced: Any) -> None:
        self._real, self._replaced = real, replaced

    def __getattr__(self, name: str) -> Any:
        return self._replaced[name] if name in self._replaced else getattr(self._real, name)


def doubled_queries(attention: Callable[..., Any]) -> Callable[..., Any]:
    """``attention`` with its first argument (the queries) doubled: scores scaled by 2/√d."""

    def wrong(query: Any, *args: Any, **kwargs: Any) -> Any:
        return attention(query * 2.0, *args, **kwargs)

    return wrong


def _code_defect(module: ModuleType, framework: str, defect: str) -> None:
    """Replace what the copied model file calls for GELU or attention with the defective version."""
    _CODE_DEFECTS[framework](vars(module), defect)


def _torch_code_defect(names: dict[str, Any], defect: str) -> None:
    F = names["F"]
    if defect == "gelu-backward":
        names["F"] = Patched(F, gelu=_gelu_without_its_density_term())
    elif defect == "tanh-gelu":
        names["F"] = Patched(F, gelu=lambda x, approximate="none": F.gelu(x, approximate="tanh"))
    else:
        names["F"] = Patched(F, scaled_dot_product_attention=doubled_queries(F.scaled_dot_product_attention))


def _tensorflow_code_defect(names: dict[str, Any], defect: str) -> None:
    if defect == "tanh-gelu":
        tf = names["tf"]
        names["gelu_erf"] = lambda x: tf.nn.gelu(x, approximate=True)
    else:
        names["precision"] = Patched(names["precision"], attention=doubled_queries(names["precision"].attention))


def _jax_code_defect(names: dict[str, Any], defect: str) -> None:
    jax = names["jax"]
    if defect == "tanh-gelu":
        gelu = jax.nn.gelu
        names["jax"] = Patched(jax, nn=Patched(jax.nn, gelu=lambda x, approximate=False: gelu(x, approximate=True)))
    else:
        names["precision"] = Patched(names["precision"], attention=doubled_queries(names["precision"].attention))


def _keras_code_defect(names: dict[str, Any], defect: str) -> None:
    ops = names["ops"]
    if defect == "tanh-gelu":
        names["ops"] = Patched(ops, gelu=lambda x, approximate=False: ops.gelu(x, approximate=True))
    else:
        names["ops"] = Patched(ops, dot_product_attention=doubled_queries(ops.dot_product_attention))


_CODE_DEFECTS: dict[str, Callable[[dict[str, Any], str], None]] = {
    "torch": _torch_code_defect,
    "tensorflow": _tensorflow_code_defect,
    "jax": _jax_code_defect,
    "keras": _keras_code_defect,
}


def _gelu_without_its_density_term() -> Callable[..., Any]:
    """Exact GELU whose backward is Φ(x) instead of Φ(x) + x·φ(x) (a torch.autograd.Function)."""
    import torch

    class WrongGelu(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            ctx.save_for_backward(x)
            return torch.nn.functional.gelu(x)

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            (x,) = ctx.saved_tensors
            return grad * 0.5 * (1.0 + torch.erf(x * 0.7071067811865476))

    def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
        return WrongGelu.apply(x)

    return gelu


def _load_defect(module: ModuleType, defect: str) -> None:
    """Wrap the copied file's build_model: another epsilon in the description it builds, or a transposed weight."""
    build = vars(module)["build_model"]

    def build_model(description: Bert, weights: dict[str, np.ndarray], device: str) -> Any:
        if defect == "layer-norm-eps":
            description = Bert(description.name, dataclasses.replace(description.config, layer_norm_eps=WRONG_EPS))
        else:
            name = description.param("query", 1)
            weights = {**weights, name: np.ascontiguousarray(weights[name].T)}
        return build(description, weights, device)

    module.build_model = build_model  # type: ignore[attr-defined]


class _FaultyFiles(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Builds ``fwbench_faulty_models.<framework>_<defect>``: the framework's bert.py executed afresh, then patched."""

    known = {module_name(d, f): (f, d) for d in DEFECTS for f in FRAMEWORKS} | {
        module_name("gelu-backward", "torch"): ("torch", "gelu-backward")
    }

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.util.spec_from_loader(fullname, self) if fullname in self.known else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        framework, defect = self.known[module.__name__]
        original = importlib.import_module(f"{builtin_package(framework)}.bert")
        exec(compile(inspect.getsource(original), str(original.__file__), "exec"), vars(module))
        if defect in ("tanh-gelu", "attention-scale", "gelu-backward"):
            _code_defect(module, framework, defect)
        else:
            _load_defect(module, defect)


if not any(type(finder).__name__ == _FaultyFiles.__name__ for finder in sys.meta_path):  # once, across re-imports
    sys.meta_path.insert(0, _FaultyFiles())

for _defect in DEFECTS:
    for _framework in FRAMEWORKS:
        _arch = f"bert_{_framework}_{_defect.replace('-', '_')}"
        _class = type(
            f"FaultyBert_{_arch}",
            (Bert,),
            {"arch": _arch, "implementations": {builtin_package(_framework): module_name(_defect, _framework)}},
        )
        register_model(_class(model_name(_defect, _framework), BERT_TINY.config))
_class = type(
    "FaultyBert_gelu_backward",
    (Bert,),
    {
        "arch": "bert_torch_gelu_backward",
        "implementations": {
            builtin_package("torch"): module_name("gelu-backward", "torch"),
            builtin_package("jax"): f"{builtin_package('jax')}.bert",
        },
    },
)
register_model(_class(GRADIENT_MODEL, BERT_TINY.config))
