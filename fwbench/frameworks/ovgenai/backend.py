"""OpenVINO GenAI (``openvino-genai``): OpenVINO's own generation loop as it ships, phase generate only. Mode
``torch``: our torch decoder exported once per model by ``torch.onnx.export(dynamo=True)`` with its cache growing
(torch ``deploy.stateful_genai_to_onnx``: input_ids, attention_mask, past_key_values.N.key/value → logits,
present.N.key/value, every batch and length axis free), read by OpenVINO and made stateful as optimum-intel makes a
Hugging Face decoder (:func:`make_stateful`: a ``beam_idx`` input gathering each past along the batch, each past and
present pair turned into one state by ``apply_make_stateful_transformation``, each state starting empty), saved as
``openvino_model.xml`` beside a ``config.json`` and ``generation_config.json`` written from the model's shape. No
tokenizer: the loop is fed token ids.

A generation is ``LLMPipeline.generate`` (its stateful "SDPA" backend: the paged-attention one needs attention as
one SDPA op, which the ONNX graph does not have), greedy, ``ignore_eos`` with ``max_new_tokens``, in float32
(``INFERENCE_PRECISION_HINT`` and ``KV_CACHE_PRECISION``: on a CPU with bf16 instructions OpenVINO otherwise computes
and caches in bf16). It runs the whole loop in one call and gives neither logits nor a step API, so a generation's
seconds are the loop's own clock (``perf_metrics.raw_metrics``: the time to the first token, then the gaps between
tokens: :func:`step_seconds`), and its tokens are checked without logits. Its own times are checked to fit inside the call that made them.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Sequence
from importlib.metadata import version
from typing import Any

import numpy as np
import openvino as ov
import openvino_genai as og  # type: ignore[import-untyped]
from openvino import opset13
from openvino._offline_transformations import apply_make_stateful_transformation

from fwbench.frameworks.base import WholeGeneration, WholeGenerationDecoder
from fwbench.frameworks.exported import ExportedBackend
from fwbench.models.decoder import CausalDecoder
from fwbench.spec import Settings

MODEL_XML = "openvino_model.xml"
MICROSECONDS = 1e-6


def make_stateful(model: ov.Model, layers: int) -> None:
    """``model`` (the growing-cache export, read by OpenVINO) made stateful in place: a ``beam_idx`` (batch,) int32
    input gathering every past along the batch (the pipeline reorders its cache with it), each past → present pair
    one state, each state starting as zeros of (batch, kv heads, 0, head size)."""
    past = [f"past_key_values.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    present = [f"present.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    beam_idx = opset13.parameter(name="beam_idx", dtype=ov.Type.i32, shape=ov.PartialShape([-1]))
    beam_idx.output(0).get_tensor().add_names({"beam_idx"})
    model.add_parameters([beam_idx])
    for name in past:
        port = model.input(name)
        consumers = port.get_target_inputs()
        gathered = opset13.gather(port, beam_idx, opset13.constant(0))
        for consumer in consumers:
            consumer.replace_source_output(gathered.output(0))
    model.validate_nodes_and_infer_types()
    apply_make_stateful_transformation(model, dict(zip(past, present, strict=True)))
    ids_shape = opset13.shape_of(model.input("input_ids"), output_type="i64")
    batch = opset13.gather(ids_shape, opset13.constant([0]), opset13.constant(0))
    for op in model.get_ops():
        if op.get_type_name() == "ReadValue":
            dims: list[Any] = [d.min_length for d in op.get_output_partial_shape(0)]
            dims[0] = batch
            dims = [opset13.constant(np.array([d], dtype=np.int64)) if isinstance(d, int) else d for d in dims]
            zero = opset13.constant(0.0, dtype=op.get_output_element_type(0))
            op.set_arguments([opset13.broadcast(zero, opset13.concat(dims, axis=0))])
    model.validate_nodes_and_infer_types()


def model_configs(description: CausalDecoder) -> dict[str, dict[str, Any]]:
    """``config.json`` and ``generation_config.json``: the vocabulary with the export's extra never-picked id (the
    end, padding and start id the pipeline requires: torch deploy.GenAiStep), the positions."""
    c = description.config
    never = c.vocab_size
    ids = {"bos_token_id": never, "eos_token_id": never, "pad_token_id": never}
    return {
        "config.json": {
            "model_type": "llama",
            "vocab_size": c.vocab_size + 1,
            "max_position_embeddings": c.max_positions,
            **ids,
        },
        "generation_config.json": ids,
    }


class OvGenAiDecoder:
    """One cell's generations in ``LLMPipeline``: greedy, exactly ``new_tokens`` per row, from token ids."""

    def __init__(self, pipeline: og.LLMPipeline, new_tokens: int) -> None:
        self._pipeline = pipeline
        self._config = og.GenerationConfig(max_new_tokens=new_tokens, do_sample=False, ignore_eos=True)

    def generate_whole(self, prompt: np.ndarray, new_tokens: int) -> WholeGeneration:
        ids = np.ascontiguousarray(prompt, dtype=np.int64)
        inputs = og.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))
        started = time.perf_counter()
        result = self._pipeline.generate(inputs, self._config)
        wall_s = time.perf_counter() - started
        raw = result.perf_metrics.raw_metrics
        tokens = np.asarray(result.tokens, dtype=np.int64)
        batch = ids.shape[0]
        if tokens.shape != (batch, new_tokens):
            raise RuntimeError(f"LLMPipeline gave tokens {tokens.shape} for {batch} rows of {new_tokens} tokens")
        ttft_s = float(raw.m_times_to_first_token[0]) * MICROSECONDS
        steps = step_seconds(list(raw.m_durations), batch, new_tokens)
        if ttft_s + sum(steps) > wall_s:  # its own clock inside the call cannot exceed the call
            raise RuntimeError(
                f"LLMPipeline's own times add up to {ttft_s + sum(steps):.6f} s, more than its call's {wall_s:.6f} s"
            )
        return WholeGeneration(tokens, ttft_s, steps)


def step_seconds(durations_us: Sequence[float], batch: int, new_tokens: int) -> list[float]:
    """Each decode step's seconds from ``raw_metrics.m_durations`` (µs): openvino-genai 2026.4 records a step's gap
    between tokens once per row, divided by the batch (the time per generated token), so a step's seconds are the sum
    of its ``batch`` entries."""
    if len(durations_us) != batch * (new_tokens - 1):
        raise RuntimeError(f"LLMPipeline gave {len(durations_us)} token gaps for {batch} rows of {new_tokens} tokens")
    gaps = np.asarray(durations_us, dtype=np.float64).reshape(new_tokens - 1, batch)
    return (gaps.sum(axis=1) * MICROSECONDS).tolist()


class OvGenAiBackend(ExportedBackend):
    framework = "openvino-genai"
    modes = ("torch",)
    suffix = ".onnx"
    cuda_unavailable = "fwbench runs OpenVINO GenAI on the CPU only"

    def __init__(
        self, mode: str, device: str, settings: Settings, *, dtype: str = "fp32", phase: str = "inference"
    ) -> None:
        super().__init__(mode, device, settings, dtype=dtype, phase=phase)
        self._pipeline: og.LLMPipeline | None = None

    def axes_free(self) -> bool:
        return True  # one export per model: its batch and length axes free

    def cache_kind(self) -> str:
        return f"{self.suffix}:{self.mode}:stateful-decoder"

    def engine_threads(self) -> dict[str, Any]:
        return {"intra_op": self.threads, "inter_op": 1, "where": "LLMPipeline INFERENCE_NUM_THREADS"}

    def configure_precision(self) -> dict[str, object]:
        return {"openvino_genai_precision": "f32 (INFERENCE_PRECISION_HINT, KV_CACHE_PRECISION)"}

    def export(self, inputs: Sequence[np.ndarray], path: str) -> dict[str, Any]:
        assert self.description is not None, "build() first"
        return self.decoder_exporter.stateful_genai_to_onnx(self.arch_module(self.description), self.model, path)

    def load(self, path: str, inputs: Sequence[np.ndarray]) -> dict[str, Any]:
        """The ONNX file read by OpenVINO, made stateful and saved beside the configs in a folder the pipeline
        reads (then removed: the pipeline holds the compiled model)."""
        assert isinstance(self.description, CausalDecoder)
        model = ov.Core().read_model(path)
        make_stateful(model, self.description.config.layers)
        properties = {
            "ATTENTION_BACKEND": "SDPA",
            "INFERENCE_NUM_THREADS": self.threads,
            "INFERENCE_PRECISION_HINT": "f32",
            "KV_CACHE_PRECISION": "f32",
        }
        with tempfile.TemporaryDirectory(prefix="fwbench-ovgenai-") as folder:
            ov.save_model(model, os.path.join(folder, MODEL_XML), compress_to_fp16=False)
            for name, config in model_configs(self.description).items():
                with open(os.path.join(folder, name), "w") as file:
                    json.dump(config, file, indent=2)
            self._pipeline = og.LLMPipeline(folder, "CPU", **properties)
        return {
            "pipeline": {
                "backend": "stateful (SDPA)",
                **{k: v for k, v in properties.items() if k != "INFERENCE_NUM_THREADS"},
            }
        }

    def release(self) -> None:
        self._pipeline = None

    def infer(self, inputs: Sequence[Any]) -> tuple[np.ndarray, ...]:
        raise NotImplementedError("openvino-genai runs phase generate only")

    whole_generations = True

    def make_whole_decoder(self, batch: int, prompt_len: int, new_tokens: int) -> WholeGenerationDecoder:
        """The export made stateful and loaded (through :meth:`compile`: one file per model in the export cache,
        whatever the cell's shape) in one pipeline."""
        assert self.description is not None, "build() first"
        self.compile_model_wide()
        assert self._pipeline is not None
        return OvGenAiDecoder(self._pipeline, new_tokens)

    def versions(self) -> dict[str, str]:
        return {
            "openvino-genai": version("openvino-genai"),
            "openvino": ov.__version__,
            **self.decoder_exporter.versions(),
        }


def create_backend(
    mode: str, device: str, settings: Settings, *, dtype: str = "fp32", phase: str = "inference"
) -> OvGenAiBackend:
    return OvGenAiBackend(mode, device, settings, dtype=dtype, phase=phase)
