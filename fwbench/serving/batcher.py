"""Dynamic batching in front of a :class:`~fwbench.serving.model.ServedModel`, the same for every runtime.

Requests wait in one queue; a batch closes when it holds ``max_batch`` rows or when its oldest request has waited
``max_delay_s``, and runs on the model's one thread while the event loop keeps accepting. A request that would take
the queue past ``max_queue_rows`` is refused at once (:class:`Overloaded`, answered 503: a dropped request), and one
that waited in the queue longer than ``max_wait_s`` is refused when its turn comes (its client has given up: the
model does not compute answers nobody waits for), so an overloaded server sheds load instead of queueing without
bound. ``max_batch`` 1 and delay 0 is the direct path: each request runs alone.
"""

from __future__ import annotations

import asyncio
import queue
import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fwbench.serving.model import ServedModel


class CallerThreadExecutor(Executor):
    """Runs what is submitted on the thread that calls :meth:`serve_until` (the worker's main thread, where the
    backend was built and compiled: frameworks keep thread-local state, such as torch's inference mode)."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._calls.put((lambda: fn(*args, **kwargs), future))
        return future

    def cancel_pending(self) -> None:
        """Fail what was submitted and not run (after :meth:`serve_until`): nothing waits for a call never made."""
        while True:
            try:
                _, future = self._calls.get_nowait()
            except queue.Empty:
                return
            if future.set_running_or_notify_cancel():
                future.set_exception(RuntimeError("the server stopped before this batch ran"))

    def serve_until(self, done: Callable[[], bool], poll_s: float = 0.05) -> None:
        """Run the submitted calls, in order, until ``done()`` holds (checked at least every ``poll_s``)."""
        while not done():
            try:
                call, future = self._calls.get(timeout=poll_s)
            except queue.Empty:
                continue
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(call())
            except Exception as exc:  # the batch's requests fail (500); the server goes on
                future.set_exception(exc)
            except BaseException as exc:  # Ctrl-C, exit: the batch fails and so does the worker
                future.set_exception(exc)
                raise


class Overloaded(RuntimeError):
    """The queue is full: the request is dropped (HTTP 503)."""


@dataclass
class BatchStats:
    """What the batcher did since start: batches by row count, rows, padding, the model's seconds."""

    batch_rows: Counter[int] = field(default_factory=Counter)
    requests: int = 0
    dropped: int = 0
    failed: int = 0
    model_s: float = 0.0

    def to_dict(self) -> dict[str, object]:
        return {
            "batch_rows": {str(rows): count for rows, count in sorted(self.batch_rows.items())},
            "requests": self.requests,
            "dropped": self.dropped,
            "failed": self.failed,
            "model_s": self.model_s,
        }


@dataclass
class _Pending:
    inputs: Mapping[str, np.ndarray]
    rows: int
    arrived: float
    future: asyncio.Future[dict[str, np.ndarray]]


class DynamicBatcher:
    """Batches requests for ``model``; :meth:`submit` from the server's event loop, :meth:`close` at shutdown."""

    def __init__(
        self,
        model: ServedModel,
        max_batch: int,
        max_delay_s: float,
        max_queue_rows: int,
        executor: Executor,
        max_wait_s: float = 2.0,
    ) -> None:
        """``executor``: where the model runs, one batch at a time (a :class:`CallerThreadExecutor` served by the
        thread that built the backends: a framework's thread-local state, such as torch's inference mode, is
        there)."""
        if not 1 <= max_batch <= model.max_batch:
            raise ValueError(f"max batch {max_batch} must be from 1 to the model's largest bucket {model.max_batch}")
        self.model = model
        self.max_batch = max_batch
        self.max_delay_s = max_delay_s
        self.max_queue_rows = max_queue_rows
        self.max_wait_s = max_wait_s
        self.stats = BatchStats()
        self._queue: list[_Pending] = []
        self._queued_rows = 0
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        # One batch at a time: the runtime's own intra-op threads do the parallel work, as in the benchmark cells.
        self._executor = executor

    async def submit(self, inputs: Mapping[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
        """The outputs of one request's ``rows`` rows (checked by ServedModel.check); Overloaded when the queue is
        full; the model's exception when its batch failed."""
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._serve())
        self.stats.requests += 1
        if self._queued_rows + rows > self.max_queue_rows:
            self.stats.dropped += 1
            raise Overloaded(f"the queue holds {self._queued_rows} rows, at most {self.max_queue_rows}")
        future: asyncio.Future[dict[str, np.ndarray]] = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(inputs, rows, time.perf_counter(), future))
        self._queued_rows += rows
        assert self._wake is not None
        self._wake.set()
        return await future

    @property
    def queued_rows(self) -> int:
        """Rows waiting in the queue now."""
        return self._queued_rows

    def _expire(self) -> None:
        """Refuse the queued requests that waited longer than ``max_wait_s`` (dropped, 503)."""
        now = time.perf_counter()
        while self._queue and now - self._queue[0].arrived > self.max_wait_s:
            pending = self._queue.pop(0)
            self._queued_rows -= pending.rows
            self.stats.dropped += 1
            if not pending.future.done():
                pending.future.set_exception(Overloaded(f"waited in the queue past {self.max_wait_s:g} s"))

    def _take_batch(self) -> list[_Pending]:
        """The oldest requests that fit ``max_batch`` rows together (at least one)."""
        batch: list[_Pending] = []
        rows = 0
        while self._queue and (not batch or rows + self._queue[0].rows <= self.max_batch):
            pending = self._queue.pop(0)
            batch.append(pending)
            rows += pending.rows
        self._queued_rows -= rows
        return batch

    async def _serve(self) -> None:
        """Forever: refuse the requests that waited too long, wait for a request, fill a batch, run it."""
        assert self._wake is not None
        while True:
            self._expire()
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            await self._fill_batch()
            await self._run_batch(self._take_batch())

    async def _fill_batch(self) -> None:
        """Wait until the queue holds ``max_batch`` rows or its oldest request has waited ``max_delay_s``."""
        assert self._wake is not None
        deadline = self._queue[0].arrived + self.max_delay_s
        while self._queued_rows < self.max_batch and (wait := deadline - time.perf_counter()) > 0:
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), wait)
            except TimeoutError:
                return

    async def _run_batch(self, batch: list[_Pending]) -> None:
        """Run ``batch`` on the model and answer each request with its rows; whatever fails here fails this
        batch's requests (500), never the batcher. The batch counts in the stats either way."""
        rows = sum(p.rows for p in batch)
        started = time.perf_counter()
        try:
            answers = await self._compute(batch)
        except Exception as exc:
            self.stats.failed += len(batch)
            for pending in batch:
                if not pending.future.done():
                    pending.future.set_exception(exc)
            return
        finally:
            self.stats.model_s += time.perf_counter() - started
            self.stats.batch_rows[rows] += 1
        for pending, answer in zip(batch, answers):
            if not pending.future.done():
                pending.future.set_result(answer)

    async def _compute(self, batch: list[_Pending]) -> list[dict[str, np.ndarray]]:
        """The model's outputs for ``batch``'s requests joined into one input, split back into each request's rows
        (on the executor: the model's one thread)."""
        joined = {name: np.concatenate([p.inputs[name] for p in batch]) for name in batch[0].inputs}
        outputs = await asyncio.get_running_loop().run_in_executor(self._executor, self.model.run, joined)
        answers = []
        offset = 0
        for pending in batch:
            answers.append({k: v[offset : offset + pending.rows] for k, v in outputs.items()})
            offset += pending.rows
        return answers

    async def close(self) -> None:
        """Stop batching; requests still queued fail (the executor is its owner's to shut down)."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        for pending in self._queue:
            if not pending.future.done():
                pending.future.set_exception(Overloaded("the server is shutting down"))
