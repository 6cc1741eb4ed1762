"""The model registry: names users type, mapped to framework-free descriptions."""

from __future__ import annotations

from fwbench.models.base import ModelDescription, ParamSpec
from fwbench.models.bert import BERT_BASE, BERT_TINY, DISTILBERT_BASE
from fwbench.models.gemm import GEMM
from fwbench.models.gpt2 import GPT2_SMALL, GPT2_TINY
from fwbench.models.mlp import MLP
from fwbench.models.resnet import RESNET50, RESNET_TINY
from fwbench.spec import SpecError

MODELS: dict[str, ModelDescription] = {
    m.name: m
    for m in (MLP(), BERT_TINY, BERT_BASE, DISTILBERT_BASE, GPT2_TINY, GPT2_SMALL, RESNET_TINY, RESNET50, GEMM)
}


def get_model(name: str) -> ModelDescription:
    """The description of model ``name``; SpecError listing the known models otherwise."""
    try:
        return MODELS[name]
    except KeyError:
        raise SpecError(f"unknown model {name!r}; allowed: {', '.join(MODELS)}") from None


__all__ = ["MODELS", "ModelDescription", "ParamSpec", "get_model"]
