"""ONNX Runtime GenAI (``onnxruntime-genai``): ONNX Runtime's own generation loop as it ships, phase generate only.
Mode ``torch``: our torch decoder exported once per model by ``torch.onnx.export(dynamo=True)`` in GenAI's decoder
contract (torch ``deploy.genai_to_onnx``: input_ids, attention_mask, past_key_values.N.key/value → logits,
present.N.key/value, every batch, length and cache axis free), with a ``genai_config.json`` written here from the
model's shape: model type ``llama`` (separate key and value caches; GPT-2's ``gpt2`` type wants them stacked), the
cache buffer shared between past and present (``past_present_share_buffer``: GenAI's static cache of
``max_length`` = prompt + new tokens), greedy search, the CPU provider with ``intra_op_num_threads`` = the cell's
thread budget. No tokenizer: the loop is fed token ids.

A generation is GenAI's own: ``og.Generator`` (its cache allocated), ``append_tokens(prompt)`` (the prefill), then
per token ``generate_next_token()``. GenAI runs the model lazily: a decode step's model call happens when its logits
are first needed, so each step reads them (``get_logits``, a copy of batch × vocab floats) and then picks the token
(``generate_next_token``, the argmax, and ``get_next_tokens``) — the same work every runtime's decode call does.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from importlib.metadata import version
from typing import Any

import numpy as np
import onnxruntime_genai as og

from fwbench.frameworks.base import Decoder
from fwbench.frameworks.exported import ExportedBackend
from fwbench.models.decoder import CausalDecoder
from fwbench.spec import Settings

CONFIG_FILE = "genai_config.json"
MODEL_FILE = "model.onnx"


def genai_config(description: CausalDecoder, threads: int) -> dict[str, Any]:
    """``genai_config.json`` for the exported decoder: the vocabulary with the extra never-picked id (GenAI's
    end-of-sequence, padding and start ids, all one id the model never generates), the model's heads and layers,
    GenAI's input and output names, greedy search over the shared cache buffer."""
    c = description.config
    never = c.vocab_size  # the exported logits' extra column (torch deploy.GenAiStep)
    head_size = c.hidden // c.heads
    return {
        "model": {
            "type": "llama",
            "vocab_size": c.vocab_size + 1,
            "context_length": c.max_positions,
            "bos_token_id": never,
            "eos_token_id": never,
            "pad_token_id": never,
            "decoder": {
                "filename": MODEL_FILE,
                "session_options": {
                    "log_id": "fwbench",
                    "intra_op_num_threads": threads,
                    "inter_op_num_threads": 1,
                    "provider_options": [],
                },
                "head_size": head_size,
                "hidden_size": c.hidden,
                "num_attention_heads": c.heads,
                "num_key_value_heads": description.cache_width() // head_size,
                "num_hidden_layers": c.layers,
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value",
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
            },
        },
        "search": {
            "do_sample": False,
            "num_beams": 1,
            "num_return_sequences": 1,
            "top_k": 1,
            "min_length": 0,
            "max_length": c.max_positions,
            "past_present_share_buffer": True,
            "repetition_penalty": 1.0,
        },
    }


class GenAiDecoder:
    """One cell's generations in GenAI: a new ``og.Generator`` per generation (its cache buffer of ``max_len``
    positions), the prompt appended (the prefill), then one ``generate_next_token`` per token."""

    def __init__(self, model: og.Model, batch: int, max_len: int) -> None:
        self._model = model
        self._params = og.GeneratorParams(model)
        self._params.set_search_options(do_sample=False, max_length=max_len, batch_size=batch)
        self._generator: og.Generator | None = None

    def _next(self, generator: og.Generator) -> tuple[np.ndarray, np.ndarray]:
        logits = generator.get_logits()  # runs the pending model call (GenAI is lazy)
        generator.generate_next_token()  # the argmax of those logits
        return generator.get_next_tokens(), logits

    def prefill(self, prompt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self._generator = og.Generator(self._model, self._params)
        self._generator.append_tokens(prompt)
        return self._next(self._generator)

    def decode(self, token: np.ndarray, position: int) -> tuple[np.ndarray, np.ndarray]:
        assert self._generator is not None, "prefill() first"
        return self._next(self._generator)  # GenAI feeds its own last token at its own position

    def decode_loop(self, token: np.ndarray, position: int, steps: int) -> None:
        return None  # steps are taken one call at a time here too

    def numpy(self, value: np.ndarray) -> np.ndarray:
        """Tokens as they are; logits (batch, 1, vocab + 1) as (batch, vocab), the never-picked column dropped."""
        array = np.asarray(value)
        return array.reshape(array.shape[0], -1)[:, :-1] if array.dtype.kind == "f" else array


class OrtGenAiBackend(ExportedBackend):
    framework = "onnxruntime-genai"
    modes = ("torch",)
    suffix = ".onnx"
    cuda_unavailable = "the CUDA build of onnxruntime-genai is not installed"

    def __init__(
        self, mode: str, device: str, settings: Settings, *, dtype: str = "fp32", phase: str = "inference"
    ) -> None:
        super().__init__(mode, device, settings, dtype=dtype, phase=phase)
        self._model: og.Model | None = None

    def cache_kind(self) -> str:
        """One export serves every cell of a model (its axes are free): the export cache's kind says GenAI's."""
        return f"{self.suffix}:{self.mode}:genai-decoder"

    def axes_free(self) -> bool:
        return True  # GenAI's contract: every axis of the export free

    def engine_threads(self) -> dict[str, Any]:
        return {"intra_op": self.threads, "inter_op": 1, "where": f"{CONFIG_FILE} session_options"}

    def configure_precision(self) -> dict[str, object]:
        return {"onnxruntime_genai_precision": "float32 graph on the CPU provider"}

    def export(self, inputs: Sequence[np.ndarray], path: str) -> dict[str, Any]:
        assert self.description is not None, "build() first"
        return self.decoder_exporter.genai_to_onnx(self.arch_module(self.description), self.model, path)

    def load(self, path: str, inputs: Sequence[np.ndarray]) -> dict[str, Any]:
        """GenAI reads a folder: the ONNX file (linked) beside the config written for this cell's threads."""
        assert isinstance(self.description, CausalDecoder)
        config = genai_config(self.description, self.threads)
        with tempfile.TemporaryDirectory(prefix="fwbench-genai-") as folder:
            os.symlink(os.path.abspath(path), os.path.join(folder, MODEL_FILE))
            with open(os.path.join(folder, CONFIG_FILE), "w") as file:
                json.dump(config, file, indent=2)
            settings = og.Config(folder)
            settings.clear_providers()  # the CPU
            self._model = og.Model(settings)
        search = {key: value for key, value in config["search"].items() if key != "max_length"}  # set per generation
        return {"genai_config": {"model_type": config["model"]["type"], **search}}

    def release(self) -> None:
        self._model = None

    def infer(self, inputs: Sequence[Any]) -> tuple[np.ndarray, ...]:
        raise NotImplementedError("onnxruntime-genai runs phase generate only")

    def make_decoder(self, batch: int, prompt_len: int, new_tokens: int) -> Decoder:
        """The GenAI export loaded (through :meth:`compile`: one file per model in the export cache, whatever the
        cell's shape) and a generator per generation."""
        assert self.description is not None, "build() first"
        self.compile_model_wide()
        assert self._model is not None
        return GenAiDecoder(self._model, batch, prompt_len + new_tokens)

    def versions(self) -> dict[str, str]:
        return {
            "onnxruntime-genai": og.__version__,
            "onnxruntime": version("onnxruntime"),
            **self.decoder_exporter.versions(),
        }


def create_backend(
    mode: str, device: str, settings: Settings, *, dtype: str = "fp32", phase: str = "inference"
) -> OrtGenAiBackend:
    return OrtGenAiBackend(mode, device, settings, dtype=dtype, phase=phase)
