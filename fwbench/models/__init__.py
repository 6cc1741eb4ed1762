"""The model registry: names users type, mapped to framework-free descriptions.

Plugins (see :mod:`fwbench.frameworks`: the ``fwbench.plugins`` entry points and ``$FWBENCH_PLUGINS``) add
models by calling :func:`register_model` when imported; :func:`get_model`, :func:`model_names` and
:func:`all_models` load the plugins first.
"""

from __future__ import annotations

import os
from pathlib import Path

from fwbench.models.base import ModelDescription, ParamSpec
from fwbench.models.bert import BERT_BASE, BERT_TINY, DISTILBERT_BASE
from fwbench.models.checkpoint import CHECKPOINTS_ENV, describe_checkpoint, named_checkpoints
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


def register_checkpoint(folder: Path) -> ModelDescription:
    """A Hugging Face checkpoint directory's model (fwbench.models.checkpoint), registered under the directory's
    name and named in ``$FWBENCH_CHECKPOINTS`` for the workers this process starts; a directory named after a
    built-in model of the same shape is that model. SpecError for a config fwbench cannot build or a name taken."""
    description = describe_checkpoint(folder)
    known = MODELS.get(description.name)
    same = type(known) is type(description) and getattr(known, "config", None) == getattr(description, "config", 0)
    if known is not None and not same:
        raise SpecError(
            f"--weights {folder}: the directory's name {description.name!r} is another model's; rename the directory"
        )
    MODELS.setdefault(description.name, description)
    named = {str(p) for p in named_checkpoints()}
    if str(folder.resolve()) not in named:
        os.environ[CHECKPOINTS_ENV] = os.pathsep.join([*sorted(named), str(folder.resolve())])
    return MODELS[description.name]


def load_registrations() -> None:
    """The plugins, and the checkpoint directories this run named (``$FWBENCH_CHECKPOINTS``)."""
    load_plugins()
    for folder in named_checkpoints():
        description = describe_checkpoint(folder)
        MODELS.setdefault(description.name, description)


def all_models() -> dict[str, ModelDescription]:
    """Every registered model, built-in first, by name (plugins and named checkpoints loaded)."""
    load_registrations()
    return dict(MODELS)


def model_names() -> tuple[str, ...]:
    """The names of every registered model (plugins loaded)."""
    return tuple(all_models())


def get_model(name: str) -> ModelDescription:
    """The description of model ``name``; SpecError listing the known models otherwise."""
    if name not in MODELS:
        load_registrations()
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
