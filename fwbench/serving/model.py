"""A runtime's model behind one call on numpy arrays (:class:`ServedModel`), as the server runs it.

Every served batch goes through the backend's own ``make_inputs → infer → to_numpy``: the code a benchmark cell
times, plus the conversions a server cannot skip. A runtime compiled for fixed shapes gets one backend per
*bucket* (the batch sizes it was compiled and warmed up for before any request); a batch of ``n`` rows runs in
the smallest bucket of at least ``n`` rows, padded with copies of its last row, and only its ``n`` rows are
answered. Every runtime pads the same way, eager ones included, so the rows each computes are the same.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from fwbench.models.base import ModelDescription
from fwbench.serving.protocol import ProtocolError, datatype_of


class BatchRunner(Protocol):
    """What a bucket runs: the backend's call on numpy arrays (fwbench.frameworks.base.Backend provides it)."""

    def make_inputs(self, arrays: dict[str, np.ndarray]) -> tuple[Any, ...]: ...

    def infer(self, inputs: Sequence[Any]) -> tuple[Any, ...]: ...

    def to_numpy(self, outputs: Sequence[Any]) -> dict[str, np.ndarray]: ...


class CompilingRunner(BatchRunner, Protocol):
    """A runner prepared for one shape before it is served (:func:`warmed_model`)."""

    def compile(self, inputs: Sequence[Any]) -> None: ...


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of the served model: per-row shape (without the batch axis) and numpy dtype."""

    name: str
    row_shape: tuple[int, ...]
    dtype: str

    def metadata(self) -> dict[str, Any]:
        """The v2 model-metadata entry (batch axis -1)."""
        return {"name": self.name, "datatype": datatype_of(np.dtype(self.dtype)), "shape": [-1, *self.row_shape]}


def specs_of(arrays: Mapping[str, np.ndarray]) -> tuple[TensorSpec, ...]:
    """The specs of batched arrays (axis 0 is the batch), in their order."""
    return tuple(TensorSpec(name, tuple(a.shape[1:]), str(a.dtype)) for name, a in arrays.items())


def buckets_for(max_batch: int) -> tuple[int, ...]:
    """The batch sizes a served runtime is compiled for: 1 and ``max_batch`` (a lone request is not padded to the
    max; anything larger than one row is)."""
    return tuple(sorted({1, max_batch}))


def pad_rows(arrays: Mapping[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
    """``arrays`` grown along axis 0 to ``rows`` rows with copies of their last row."""
    padded = {}
    for name, array in arrays.items():
        missing = rows - array.shape[0]
        padded[name] = array if missing <= 0 else np.concatenate([array, np.repeat(array[-1:], missing, axis=0)])
    return padded


class ServedModel:
    """One runtime's model by bucket: ``run`` takes a batch of rows (every input's axis 0) and returns the outputs
    of those rows; ``check`` refuses a request's inputs the model cannot take (:class:`ProtocolError`, 400)."""

    def __init__(
        self,
        name: str,
        runners: Mapping[int, BatchRunner],
        inputs: Sequence[TensorSpec],
        outputs: Sequence[TensorSpec],
        platform: str,
    ) -> None:
        """``runners``: bucket rows → its backend, each compiled and warmed up for that many rows."""
        if not runners:
            raise ValueError("a served model needs at least one bucket")
        self.name = name
        self.runners = dict(sorted(runners.items()))
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.platform = platform
        self.max_batch = max(self.runners)
        self.padded_rows = 0  # rows computed only to fill a bucket, since start

    def check(self, arrays: Mapping[str, np.ndarray]) -> int:
        """The request's row count when its inputs are exactly the model's (names, dtypes, row shapes, 1 to
        ``max_batch`` rows, the same in every input); ProtocolError (400) saying what differs otherwise."""
        expected = {spec.name: spec for spec in self.inputs}
        if set(arrays) != set(expected):
            raise ProtocolError(
                f"model {self.name} takes inputs {', '.join(expected)}; the request has {', '.join(arrays) or 'none'}"
            )
        rows: set[int] = set()
        for name, array in arrays.items():
            spec = expected[name]
            if str(array.dtype) != spec.dtype:
                raise ProtocolError(
                    f"input {name} must be {datatype_of(np.dtype(spec.dtype))}, got {datatype_of(array.dtype)}"
                )
            if array.ndim != 1 + len(spec.row_shape) or tuple(array.shape[1:]) != spec.row_shape:
                raise ProtocolError(
                    f"input {name} must have shape [rows, {', '.join(map(str, spec.row_shape))}] (the shape the "
                    f"runtime was compiled for), got {list(array.shape)}"
                )
            rows.add(array.shape[0])
        if len(rows) != 1:
            raise ProtocolError(f"the inputs have different row counts: {sorted(rows)}")
        (count,) = rows
        if not 1 <= count <= self.max_batch:
            raise ProtocolError(f"a request carries 1 to {self.max_batch} rows, got {count}")
        return count

    def bucket_for(self, rows: int) -> int:
        """The smallest bucket holding ``rows`` rows; ValueError past the largest."""
        for bucket in self.runners:
            if bucket >= rows:
                return bucket
        raise ValueError(f"{rows} rows exceed the largest compiled batch size {self.max_batch}")

    def run(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The outputs of ``arrays``' rows (at most ``max_batch``), computed in their bucket (padded)."""
        rows = next(iter(arrays.values())).shape[0]
        bucket = self.bucket_for(rows)
        self.padded_rows += bucket - rows
        runner = self.runners[bucket]
        names = [spec.name for spec in self.inputs]
        outputs = runner.to_numpy(runner.infer(runner.make_inputs(pad_rows({n: arrays[n] for n in names}, bucket))))
        return {name: np.ascontiguousarray(array[:rows]) for name, array in outputs.items()}


def warmed_model(
    name: str, platform: str, description: ModelDescription, buckets: Sequence[int], seq_len: int | None, seed: int,
    warmup_calls: int, new_runner: Callable[[], CompilingRunner],
) -> ServedModel:  # fmt: skip
    """``description`` served from one runner per bucket (``new_runner()`` each, built), each compiled for its rows
    and called ``1 + warmup_calls`` times on seeded inputs before any request: fwbench's server and its TorchServe
    handler prepare the same way."""
    runners: dict[int, BatchRunner] = {}
    outputs: dict[str, np.ndarray] = {}
    for bucket in buckets:
        runner = new_runner()
        inputs = runner.make_inputs(description.make_inputs(bucket, seq_len, seed))
        runner.compile(inputs)
        for _ in range(1 + warmup_calls):
            outputs = runner.to_numpy(runner.infer(inputs))
        runners[bucket] = runner
    row = description.make_inputs(1, seq_len, seed)
    return ServedModel(name, runners, specs_of(row), specs_of(outputs), platform)
