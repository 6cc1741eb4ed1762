"""The model registry: names users type, mapped to framework-free descriptions.

Plugins (see :mod:`fwbench.frameworks`: the ``fwbench.plugins`` entry points and ``$FWBENCH_PLUGINS``) add
models by calling :func:`register_model` when imported; :func:`get_model`, :func:`model_names` and
:func:`all_models` load the plugins first.
"""

from __future__ import annotations

from fwbench.models.base import ModelDescription, ParamSpec
from fwbench.models.bert import BERT_BASE, BERT_TINY, DISTILBERT_BASE
from fwbench.models.gemm import GEMM
from fwbench.models.gpt2 import GPT2_SMALL, GPT2_TINY
from fwbench.models.llama import LLAMA_TINY, SMOLLM_135M
from fwbench.models.mlp import MLP
from fwbench.models.resnet import RESNET50, RESNET_TINY
from fwbench.plugins import load_plugins
from fwbench.spec import SpecError

MODELS: dict[str, ModelDescription] = {
    m.name: m
    for m in (
        MLP(),
        BERT_TINY,
        BERT_BASE,
        DISTILBERT_BASE,
        GPT2_TINY,
        GPT2_SMALL,
        LLAMA_TINY,
        SMOLLM_135M,
        RESNET_TINY,
        RESNET50,
        GEMM,
    )
}


def register_model(description: ModelDescription) -> None:
    """Add a model (plugins call this on import); ValueError if its name is taken by another description."""
    known = MODELS.get(description.name)
    if known is not None and known is not description:
        raise ValueError(f"model {description.name!r} is already registered")
    MODELS[description.name] = description


def all_models() -> dict[str, ModelDescription]:
    """Every registered model, built-in first, by name (plugins loaded)."""
    load_plugins()
    return dict(MODELS)


def model_names() -> tuple[str, ...]:
    """The names of every registered model (plugins loaded)."""
    return tuple(all_models())


def get_model(name: str) -> ModelDescription:
    """The description of model ``name``; SpecError listing the known models otherwise."""
    if name not in MODELS:
        load_plugins()
    try:
        return MODELS[name]
    except KeyError:
        raise SpecError(f"unknown model {name!r}; allowed: {', '.join(MODELS)}") from None


def implementations(arch: str) -> dict[str, str]:
    """The model files registered models bring for architecture ``arch``: framework package → module name
    (``ModelDescription.implementations``); empty for the built-in models, whose files are in each package."""
    found: dict[str, str] = {}
    for description in all_models().values():
        if description.arch == arch:
            found.update(description.implementations)
    return found


__all__ = [
    "MODELS",
    "ModelDescription",
    "ParamSpec",
    "all_models",
    "get_model",
    "implementations",
    "model_names",
    "register_model",
]
