"""The ASGI application (starlette) serving one :class:`~fwbench.serving.model.ServedModel` over the Open Inference
Protocol (KServe v2), through a :class:`~fwbench.serving.batcher.DynamicBatcher`.

Routes: ``GET /v2/health/live``, ``GET /v2/health/ready``, ``GET /v2/models/{name}`` (metadata),
``POST /v2/models/{name}/infer`` (JSON or binary tensors) and ``GET /v2/models/{name}/stats`` (fwbench's: the
batcher's counters and the server process's CPU seconds). Answers: 400 for a request the protocol or the model
refuses, 404 for another model, 503 when the queue is full, 500 when the model raised; the server keeps serving.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from fwbench.serving.batcher import DynamicBatcher, Overloaded
from fwbench.serving.protocol import (
    BINARY_CONTENT_TYPE,
    HEADER_LENGTH,
    JSON_CONTENT_TYPE,
    ProtocolError,
    decode_request,
    encode_response,
)


def error(status: int, message: str) -> JSONResponse:
    """The v2 error body."""
    return JSONResponse({"error": message}, status_code=status)


def make_app(batcher: DynamicBatcher) -> Starlette:
    """The application serving ``batcher.model``."""
    routes = V2Routes(batcher)
    return Starlette(
        routes=[
            Route("/v2/health/live", routes.live),
            Route("/v2/health/ready", routes.ready),
            Route("/v2/models/{name}", routes.metadata),
            Route("/v2/models/{name}/stats", routes.stats),
            Route("/v2/models/{name}/infer", routes.infer, methods=["POST"]),
        ],
        lifespan=routes.lifespan,
    )


class V2Routes:
    """The endpoints of :func:`make_app` for ``batcher.model``, and the lifespan that closes the batcher."""

    def __init__(self, batcher: DynamicBatcher) -> None:
        self.batcher = batcher
        self.model = batcher.model

    def unknown(self, name: str) -> JSONResponse | None:
        """404 for a model other than this server's, None for its own."""
        model = self.model
        return None if name == model.name else error(404, f"no model {name!r}; this server has {model.name!r}")

    async def live(self, request: Request) -> JSONResponse:
        return JSONResponse({"live": True})

    async def ready(self, request: Request) -> JSONResponse:
        return JSONResponse({"ready": True})

    async def metadata(self, request: Request) -> JSONResponse:
        model, batcher = self.model, self.batcher
        return self.unknown(request.path_params["name"]) or JSONResponse(
            {
                "name": model.name,
                "platform": model.platform,
                "inputs": [spec.metadata() for spec in model.inputs],
                "outputs": [spec.metadata() for spec in model.outputs],
                "parameters": {
                    "max_batch_size": batcher.max_batch,
                    "max_queue_delay_s": batcher.max_delay_s,
                    "buckets": list(model.runners),
                },
            }
        )

    async def stats(self, request: Request) -> JSONResponse:
        return self.unknown(request.path_params["name"]) or JSONResponse(
            {
                **self.batcher.stats.to_dict(),
                "padded_rows": self.model.padded_rows,
                "queued_rows": self.batcher.queued_rows,
                "cpu_s": time.process_time(),
            }
        )

    async def infer(self, request: Request) -> Response:
        missing = self.unknown(request.path_params["name"])
        if missing is not None:
            return missing
        body = await request.body()
        try:
            parsed = decode_request(body, request.headers.get(HEADER_LENGTH))
            rows = self.model.check(parsed.inputs)
        except ProtocolError as exc:
            return error(exc.status, str(exc))
        try:
            outputs = await self.batcher.submit(parsed.inputs, rows)
        except Overloaded as exc:
            return error(503, f"overloaded: {exc}")
        except Exception as exc:  # the model failed on this batch: say so, keep serving
            return error(500, f"{type(exc).__name__}: {exc}")
        payload, header_length = encode_response(self.model.name, outputs, parsed.binary_outputs, parsed.id)
        if header_length is None:
            return Response(payload, media_type=JSON_CONTENT_TYPE)
        return Response(payload, media_type=BINARY_CONTENT_TYPE, headers={HEADER_LENGTH: str(header_length)})

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        yield
        await self.batcher.close()
