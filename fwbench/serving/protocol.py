"""The Open Inference Protocol (KServe v2) on numpy arrays: ``POST /v2/models/{name}/infer`` bodies, JSON or with
the binary tensor extension (a JSON header of ``Inference-Header-Content-Length`` bytes, then each tensor's raw
little-endian bytes in order, sized by its ``parameters.binary_data_size``).

A request that does not parse, names unknown inputs, or carries a wrong datatype or shape raises
:class:`ProtocolError` with the HTTP status to answer (400); the server keeps serving.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

HEADER_LENGTH = "Inference-Header-Content-Length"
BINARY_CONTENT_TYPE = "application/octet-stream"
JSON_CONTENT_TYPE = "application/json"

# KServe v2 datatype <-> numpy dtype (the ones fwbench's models take and return).
DATATYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "INT8": np.dtype(np.int8),
    "UINT8": np.dtype(np.uint8),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
}
DATATYPE_OF = {dtype: name for name, dtype in DATATYPES.items()}


class ProtocolError(ValueError):
    """A request the protocol or the model refuses: ``status`` is the HTTP status to answer."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def datatype_of(dtype: np.dtype[Any]) -> str:
    """The v2 datatype name of a numpy dtype; ProtocolError for one the protocol has no name for."""
    try:
        return DATATYPE_OF[np.dtype(dtype)]
    except KeyError:
        raise ProtocolError(f"no KServe v2 datatype for numpy {np.dtype(dtype)}", status=500) from None


@dataclass(frozen=True)
class InferRequest:
    """A parsed request: its ``id`` (echoed), its inputs by name, and whether outputs go back as binary."""

    id: str | None
    inputs: dict[str, np.ndarray]
    binary_outputs: bool


def _tensor_from_json(entry: Mapping[str, Any], binary: bytes | None) -> tuple[str, np.ndarray]:
    """One ``inputs`` entry as (name, array), its data from ``data`` or from ``binary`` (its raw bytes)."""
    if not isinstance(entry, Mapping):
        raise ProtocolError("each input must be an object with name, shape, datatype and data")
    name, shape, datatype = entry.get("name"), entry.get("shape"), entry.get("datatype")
    if not isinstance(name, str) or not name:
        raise ProtocolError("an input has no name")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ProtocolError(f"input {name}: shape must be a list of non-negative integers, got {shape!r}")
    if datatype not in DATATYPES:
        raise ProtocolError(f"input {name}: datatype {datatype!r} is not one of {', '.join(DATATYPES)}")
    dtype = DATATYPES[datatype]
    count = int(np.prod(shape, dtype=np.int64))
    if binary is not None:
        if len(binary) != count * dtype.itemsize:
            raise ProtocolError(
                f"input {name}: {len(binary)} bytes of binary data for shape {shape} of {datatype} "
                f"({count * dtype.itemsize} expected)"
            )
        array = np.frombuffer(binary, dtype=dtype.newbyteorder("<")).astype(dtype, copy=False)
    else:
        data = entry.get("data")
        if data is None:
            raise ProtocolError(f"input {name} has neither data nor binary_data_size")
        try:
            array = np.asarray(data, dtype=dtype).ravel()
        except (TypeError, ValueError, OverflowError) as exc:
            raise ProtocolError(f"input {name}: data is not {datatype}: {exc}") from None
        if array.size != count:
            raise ProtocolError(f"input {name}: {array.size} values for shape {shape} ({count} expected)")
    return name, array.reshape(shape)


def _decode(body: bytes, header_length: str | None, key: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(the JSON header, its tensors under ``key`` by name) of a body; ``header_length``: the
    ``Inference-Header-Content-Length`` header (binary extension) or None (all JSON)."""
    what, tensor = ("request", "input") if key == "inputs" else ("response", "output")
    header_bytes, rest = _split_body(body, header_length)
    try:
        header = json.loads(header_bytes)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"the {what} is not JSON: {exc}") from None
    if not isinstance(header, dict) or not isinstance(header.get(key), list) or not header[key]:
        raise ProtocolError(f"the {what} must be an object with a non-empty {key} list")
    return header, _tensors(header[key], rest, tensor)


def _split_body(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    """(JSON header, the binary data after it) of a body: split at ``header_length`` (the binary extension), else
    all JSON."""
    if header_length is None:
        return body, b""
    try:
        split = int(header_length)
    except ValueError:
        raise ProtocolError(f"{HEADER_LENGTH} must be an integer, got {header_length!r}") from None
    if not 0 < split <= len(body):
        raise ProtocolError(f"{HEADER_LENGTH} {split} is outside the body's {len(body)} bytes")
    return body[:split], body[split:]


def _tensors(entries: list[Any], rest: bytes, tensor: str) -> dict[str, np.ndarray]:
    """The header's ``entries`` (``tensor``: input or output) by name, each binary one's bytes taken in order from
    ``rest`` (which they must use up)."""
    offset, tensors = 0, {}
    for entry in entries:
        size = _binary_data_size(entry, tensor)
        binary = None
        if size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0 or offset + size > len(rest):
                raise ProtocolError(f"binary_data_size {size!r} does not fit the {len(rest)} bytes after the header")
            binary, offset = rest[offset : offset + size], offset + size
        name, array = _tensor_from_json(entry, binary)
        if name in tensors:
            raise ProtocolError(f"{tensor} {name} is given twice")
        tensors[name] = array
    if offset != len(rest):
        raise ProtocolError(f"{len(rest) - offset} bytes after the header belong to no {tensor}")
    return tensors


def _binary_data_size(entry: Any, tensor: str) -> Any:
    """An entry's ``parameters.binary_data_size`` as given (None without one: its data is JSON)."""
    parameters = entry.get("parameters") if isinstance(entry, dict) else None
    if parameters is not None and not isinstance(parameters, dict):
        raise ProtocolError(f"an {tensor}'s parameters must be an object, got {parameters!r}")
    return (parameters or {}).get("binary_data_size")


def decode_request(body: bytes, header_length: str | None) -> InferRequest:
    """The request in ``body``; ``header_length``: the ``Inference-Header-Content-Length`` header (binary extension)
    or None (all JSON)."""
    header, inputs = _decode(body, header_length, "inputs")
    parameters = header.get("parameters") or {}
    binary_outputs = bool(parameters.get("binary_data_output", False)) if isinstance(parameters, dict) else False
    request_id = header.get("id")
    return InferRequest(str(request_id) if request_id is not None else None, inputs, binary_outputs)


def _encode(
    tensors: Mapping[str, np.ndarray], key: str, binary: bool, extra: Mapping[str, Any]
) -> tuple[bytes, int | None]:
    """(body, JSON header length or None) of ``tensors`` under ``key`` (inputs or outputs)."""
    entries, blobs = [], []
    for name, array in tensors.items():
        array = np.ascontiguousarray(array)
        entry: dict[str, Any] = {"name": name, "shape": list(array.shape), "datatype": datatype_of(array.dtype)}
        if binary:
            blob = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = array.ravel().tolist()
        entries.append(entry)
    header = json.dumps({**extra, key: entries}, separators=(",", ":")).encode()
    if not binary:
        return header, None
    return header + b"".join(blobs), len(header)


def encode_request(
    inputs: Mapping[str, np.ndarray], binary: bool = True, request_id: str | None = None
) -> tuple[bytes, int | None]:
    """A request body for ``inputs`` and its JSON header's length (binary: pass it as ``Inference-Header-Content-
    Length``; None for an all-JSON body). Binary requests ask for binary outputs too."""
    extra: dict[str, Any] = {} if request_id is None else {"id": request_id}
    if binary:
        extra["parameters"] = {"binary_data_output": True}
    return _encode(inputs, "inputs", binary, extra)


def encode_response(
    model: str, outputs: Mapping[str, np.ndarray], binary: bool, request_id: str | None
) -> tuple[bytes, int | None]:
    """A response body for ``outputs`` of ``model`` and its JSON header's length (None: all JSON)."""
    extra: dict[str, Any] = {"model_name": model}
    if request_id is not None:
        extra["id"] = request_id
    return _encode(outputs, "outputs", binary, extra)


def decode_response(body: bytes, header_length: str | None) -> dict[str, np.ndarray]:
    """The outputs of a response body by name (the client's side of :func:`encode_response`); ProtocolError for a
    malformed one."""
    return _decode(body, header_length, "outputs")[1]
