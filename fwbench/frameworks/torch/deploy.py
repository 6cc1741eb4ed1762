"""torch's side of the deployment runtimes (:class:`fwbench.frameworks.roles.OnnxExporter`): our torch model,
with the canonical weights, written as an ONNX file that ``onnxruntime:torch`` and ``openvino:torch`` run; for phase
generate (:class:`fwbench.frameworks.roles.OnnxDecoderExporter`), the decoder's cached call as a pure module."""

from __future__ import annotations

from collections.abc import Sequence
from importlib.metadata import version
from types import ModuleType
from typing import Any

import numpy as np
import torch

from fwbench.frameworks.roles import as_cached_decoder_arch


def configure(threads: int) -> None:
    """The exporter traces in full float32 with the cell's thread budget."""
    torch.set_num_threads(threads)
    torch.set_float32_matmul_precision("highest")


def to_onnx(model: Any, inputs: Sequence[np.ndarray], path: str) -> dict[str, Any]:
    """``torch.onnx.export(dynamo=True)`` of ``model`` (an ``nn.Module``) traced on ``inputs``; the weights are
    inside the one file (``external_data=False``), the input shapes fixed. Returns how it was exported and the
    default-domain opset of the written graph."""
    with torch.no_grad():
        program = torch.onnx.export(
            model.eval(),
            tuple(torch.from_numpy(np.require(a, requirements="C")) for a in inputs),  # 0-d stays 0-d
            path,
            dynamo=True,
            external_data=False,
            verbose=False,
        )
    assert program is not None, "torch.onnx.export(dynamo=True) returns the ONNXProgram it wrote"
    return {"exporter": "torch.onnx.export(dynamo=True)", "opset": program.model.opset_imports.get("")}


class DecoderStep(torch.nn.Module):
    """The model file's ``cached_forward`` as a pure call for export: (ids (B, S), start 0-d int64, keys_0, values_0,
    keys_1, ...) → (token (B,) int64, logits (B, vocab), keys_0, values_0, ...), the caches returned with positions
    start .. start + S - 1 written (a copy of each cache written out of place: an exported graph has no state)."""

    def __init__(self, arch: ModuleType, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self._cached_forward = as_cached_decoder_arch(arch).cached_forward

    def forward(self, ids: torch.Tensor, start: torch.Tensor, *flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        cache = [(flat[i].clone(), flat[i + 1].clone()) for i in range(0, len(flat), 2)]
        logits = self._cached_forward(self.model, ids, start, cache)
        return (logits.argmax(dim=-1), logits, *(tensor for pair in cache for tensor in pair))


def decoder_cache(arch: ModuleType, model: torch.nn.Module, batch: int, max_len: int) -> list[np.ndarray]:
    return [t.numpy() for pair in as_cached_decoder_arch(arch).new_cache(model, batch, max_len) for t in pair]


def _export_free_axes(
    module: torch.nn.Module, args: tuple[torch.Tensor, ...], path: str, names: dict[str, list[str]], free: Any
) -> int | None:
    """``module`` through ``torch.onnx.export(dynamo=True)`` (weights inside) with the axes ``free`` names left free;
    returns the written graph's default-domain opset."""
    with torch.no_grad():
        program = torch.onnx.export(
            module.eval(),
            args,
            path,
            dynamo=True,
            external_data=False,
            verbose=False,
            input_names=names["inputs"],
            output_names=names["outputs"],
            dynamic_shapes=free,
        )
    assert program is not None, "torch.onnx.export(dynamo=True) returns the ONNXProgram it wrote"
    opset: int | None = program.model.opset_imports.get("")
    return opset


def decoder_to_onnx(arch: ModuleType, model: torch.nn.Module, path: str) -> dict[str, Any]:
    """:class:`DecoderStep` with the batch, token and cache-length axes free (traced at sizes 2, 3 and 12: no axis
    specialised to 0 or 1), so one file serves the prefill and every decode step of every cell of the model."""
    cache = decoder_cache(arch, model, 2, 12)
    names = [f"{layer}.{kind}" for layer in range(len(cache) // 2) for kind in ("key", "value")]
    batch, tokens, length = (torch.export.Dim(n) for n in ("batch", "tokens", "max_length"))
    opset = _export_free_axes(
        DecoderStep(arch, model),
        (torch.zeros(2, 3, dtype=torch.int32), torch.tensor(0, dtype=torch.int64), *map(torch.from_numpy, cache)),
        path,
        {
            "inputs": ["input_ids", "start", *(f"past.{n}" for n in names)],
            "outputs": ["token", "logits", *(f"present.{n}" for n in names)],
        },
        {"ids": {0: batch, 1: tokens}, "start": None, "flat": tuple({0: batch, 2: length} for _ in names)},
    )
    return {"exporter": "torch.onnx.export(dynamo=True), batch, token and cache axes free", "opset": opset}


class GenAiStep(torch.nn.Module):
    """ONNX Runtime GenAI's decoder contract over the model file's ``cached_forward``: (input_ids (B, S) int64,
    attention_mask (B, T) int64, T the tokens so far with these, past_key_values.N.key / .value (B, kv heads,
    max_length, head size)) → (logits (B, 1, vocab + 1): the last position's, one more column at float32's lowest,
    present.N.key / .value: the cache with slots T − S .. T − 1 written). The extra column is the end-of-sequence id
    GenAI requires inside the vocabulary, which greedy decoding never picks; GenAI reads logits of one position as
    the last position's."""

    def __init__(self, arch: ModuleType, model: torch.nn.Module, growing: bool = False) -> None:
        """``growing``: the past holds the T − S positions so far, and the present is it with this call's S positions
        appended (OpenVINO GenAI's stateful contract), instead of a buffer of max_length positions written in place."""
        super().__init__()
        self.model, self.growing = model, growing
        self._cached_forward = as_cached_decoder_arch(arch).cached_forward

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *past: torch.Tensor) -> tuple[Any, ...]:
        start = torch.tensor(attention_mask.shape[1] - input_ids.shape[1], dtype=torch.int64)
        if self.growing:  # positions start .. start + S - 1 appended as zeros, then written by cached_forward
            appended = [
                torch.cat([t, t.new_zeros((t.shape[0], t.shape[1], input_ids.shape[1], t.shape[3]))], 2) for t in past
            ]
            cache = list(zip(appended[::2], appended[1::2], strict=True))
        else:
            cache = [(past[i].clone(), past[i + 1].clone()) for i in range(0, len(past), 2)]
        logits = self._cached_forward(self.model, input_ids, start, cache)
        never = torch.full_like(logits[:, :1], torch.finfo(torch.float32).min)
        return (torch.cat([logits, never], dim=-1)[:, None, :], *(tensor for pair in cache for tensor in pair))


def genai_to_onnx(arch: ModuleType, model: torch.nn.Module, path: str) -> dict[str, Any]:
    """:class:`GenAiStep` with the batch, new-token, total-length and cache-length axes free (traced at sizes 2, 3, 8
    and 12: no axis specialised to 0 or 1), by GenAI's names."""
    opset = _export_genai_step(arch, model, path, growing=False)
    return {"exporter": "torch.onnx.export(dynamo=True), batch, length and cache axes free", "opset": opset}


def stateful_genai_to_onnx(arch: ModuleType, model: torch.nn.Module, path: str) -> dict[str, Any]:
    """:class:`GenAiStep` growing its cache (past: the positions so far; present: them and this call's), every batch
    and length axis free (traced at batch 2, 3 new tokens after 5: no axis specialised to 0 or 1): OpenVINO GenAI's
    contract once made stateful."""
    opset = _export_genai_step(arch, model, path, growing=True)
    return {"exporter": "torch.onnx.export(dynamo=True), the cache growing, batch and length axes free", "opset": opset}


def _export_genai_step(arch: ModuleType, model: torch.nn.Module, path: str, *, growing: bool) -> int | None:
    """:class:`GenAiStep` (``growing`` or over a buffer) by GenAI's names, traced at batch 2, 3 new tokens, 8 in all,
    with a past of 5 positions (growing) or a buffer of 12; every batch and length axis free."""
    cache = decoder_cache(arch, model, 2, 5 if growing else 12)
    names = [f"{layer}.{kind}" for layer in range(len(cache) // 2) for kind in ("key", "value")]
    batch, new, total, length = (
        torch.export.Dim(n)
        for n in (
            "batch",
            "sequence_length",
            "total_sequence_length",
            "past_sequence_length" if growing else "max_length",
        )
    )
    return _export_free_axes(
        GenAiStep(arch, model, growing=growing),
        (torch.zeros(2, 3, dtype=torch.int64), torch.ones(2, 8, dtype=torch.int64), *map(torch.from_numpy, cache)),
        path,
        {
            "inputs": ["input_ids", "attention_mask", *(f"past_key_values.{n}" for n in names)],
            "outputs": ["logits", *(f"present.{n}" for n in names)],
        },
        {
            "input_ids": {0: batch, 1: new},
            "attention_mask": {0: batch, 1: total},
            "past": tuple({0: batch, 2: length} for _ in names),
        },
    )


def versions() -> dict[str, str]:
    return {"torch": torch.__version__, "onnxscript": version("onnxscript")}
