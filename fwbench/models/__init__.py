"""The model registry: names users type, mapped to framework-free descriptions."""

from __future__ import annotations

from fwbench.models.base import ModelDescription, ParamSpec
from fwbench.models.mlp import MLP
from fwbench.spec import SpecError

MODELS: dict[str, ModelDescription] = {m.name: m for m in (MLP(),)}


def get_model(name: str) -> ModelDescription:
    """The description of model ``name``; SpecError listing the known models otherwise."""
    try:
        return MODELS[name]
    except KeyError:
        raise SpecError(f"unknown model {name!r}; allowed: {', '.join(MODELS)}") from None


__all__ = ["MODELS", "ModelDescription", "ParamSpec", "get_model"]
