"""Test-only plugin: ``llama-tiny-stale-cache``, llama-tiny (same weights, same float64 reference) whose only
implementation is torch's Llama model file with one defect in its key/value cache (``torch_llama``): a decode step
writes its key and value one position late, so its query reads the stale (never written) entry where its own key
belongs. The prefill is right, so phase generate must name step 1, the first decode step, as the first that
differs (tests/test_generate.py)."""

from __future__ import annotations

from fwbench.models import register_model
from fwbench.models.llama import LLAMA_TINY, Llama

MODEL = "llama-tiny-stale-cache"
FIRST_WRONG_STEP = 1  # the first decode step: the prefill writes its keys where they belong


class StaleCacheLlama(Llama):
    implementations = {"fwbench.frameworks.torch": f"{__name__}.torch_llama"}


register_model(StaleCacheLlama(MODEL, LLAMA_TINY.config))
