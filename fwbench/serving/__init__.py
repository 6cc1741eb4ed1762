"""Serving under load (phase ``serving``): one fwbench-owned HTTP server for every runtime, driven by MLPerf
LoadGen from its own process.

- :mod:`.protocol`: the Open Inference Protocol (KServe v2) requests and responses, JSON and the binary tensor
  extension, on numpy arrays.
- :mod:`.model`: :class:`~.model.ServedModel`, a runtime's backends (one per compiled batch size) behind one call
  on numpy arrays, padding a batch to the next compiled size.
- :mod:`.batcher`: dynamic batching (max batch size, max queue delay, bounded queue) in front of the model.
- :mod:`.app` and :mod:`.server`: the ASGI application (starlette) and the uvicorn server on 127.0.0.1.
- :mod:`.loadgen`: the load generator process (LoadGen scenarios through an asynchronous HTTP client); what a load
  point measured is :class:`fwbench.details.LoadPoint`.
- :mod:`.floor`: runtime ``floor:identity``, the harness alone.

Nothing here imports a framework: the served backend comes from :mod:`fwbench.frameworks` in the worker.
"""
