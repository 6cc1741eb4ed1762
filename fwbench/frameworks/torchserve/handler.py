"""fwbench's TorchServe handler: runs in TorchServe's Python model worker (``handler:`` of the archive).

It builds fwbench's torch model (runtime ``torch:eager``) from the archived weights once per compiled batch size,
as fwbench's own server does (:class:`fwbench.serving.model.ServedModel`), and answers each of TorchServe's batches:
every request's KServe v2 binary body decoded, the rows run together (padded to a compiled batch size), each answer
encoded back with its ``Inference-Header-Content-Length``. A request the model refuses gets 400, alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from fwbench.serving.model import ServedModel, warmed_model
from fwbench.serving.protocol import HEADER_LENGTH, ProtocolError, decode_request, encode_response

WEIGHTS_FILE = "weights.safetensors"


class FwbenchHandler:
    """TorchServe's ``initialize(context)`` / ``handle(data, context)`` for one fwbench model."""

    def __init__(self) -> None:
        self.model: ServedModel | None = None

    def initialize(self, context: Any) -> None:
        from fwbench.frameworks.registry import create_backend
        from fwbench.models import get_model
        from fwbench.models.weights_io import load_weights
        from fwbench.spec import Settings

        config: dict[str, Any] = dict(context.model_yaml_config["handler"])
        description = get_model(config["model"])
        weights = load_weights(description, Path(context.system_properties["model_dir"]) / WEIGHTS_FILE)
        settings = Settings(threads=int(config["threads"]), interop_threads=1, seed=int(config["seed"]))

        def new_runner() -> Any:
            backend = create_backend("torch:eager", "cpu", settings)
            backend.configure_threads(settings.threads, settings.interop_threads)
            backend.configure_precision()
            backend.build(description, weights)
            return backend

        buckets = [int(bucket) for bucket in config["buckets"]]
        self.model = warmed_model(
            config["model"], "torchserve", description, buckets, config.get("seq_len"), settings.seed,
            int(config["warmup_calls"]), new_runner,
        )  # fmt: skip

    def handle(self, data: list[dict[str, Any]], context: Any) -> list[bytes]:
        """One TorchServe batch: an answer per request, in order."""
        assert self.model is not None, "initialize() first"
        answers: list[bytes | None] = [None] * len(data)
        parsed: list[tuple[int, Any, int]] = []
        for index, request in enumerate(data):
            body = request.get("body") or request.get("data") or b""
            try:
                request_obj = decode_request(bytes(body), context.get_request_header(index, HEADER_LENGTH))
                rows = self.model.check(request_obj.inputs)
            except ProtocolError as exc:
                context.set_response_status(exc.status, str(exc), index)
                answers[index] = json.dumps({"error": str(exc)}).encode()
                continue
            parsed.append((index, request_obj, rows))
        if parsed:
            names = [spec.name for spec in self.model.inputs]
            joined = {name: np.concatenate([p[1].inputs[name] for p in parsed]) for name in names}
            total = sum(p[2] for p in parsed)
            outputs = self.model.run(joined) if total <= self.model.max_batch else self._in_parts(parsed)
            offset = 0
            for index, request_obj, rows in parsed:
                part = {name: array[offset : offset + rows] for name, array in outputs.items()}
                offset += rows
                body, header_length = encode_response(self.model.name, part, True, request_obj.id)
                context.set_response_header(index, HEADER_LENGTH, str(header_length))
                context.set_response_content_type(index, "application/octet-stream")
                answers[index] = body
        return [answer or b"" for answer in answers]

    def _in_parts(self, parsed: list[tuple[int, Any, int]]) -> dict[str, np.ndarray]:
        """Requests of several rows each can add up to more than the max batch: run them one request at a time."""
        assert self.model is not None
        parts: list[dict[str, np.ndarray]] = []
        for _, request_obj, _ in parsed:
            parts.append(self.model.run(request_obj.inputs))
        return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}


_SERVICE = FwbenchHandler()


def handle(data: list[dict[str, Any]] | None, context: Any) -> list[bytes] | None:
    """TorchServe's module-level entry point: initialise once, then answer each batch (None: the warm-up call)."""
    if _SERVICE.model is None:
        _SERVICE.initialize(context)
    if data is None:
        return None
    return _SERVICE.handle(data, context)
