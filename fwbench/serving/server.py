"""The HTTP server: uvicorn (uvloop, httptools) on 127.0.0.1 in a thread of the serving worker, so the model it
serves is the worker's own backend. :class:`PortInUse` when the port is taken; :meth:`HttpServer.stop` ends it."""

from __future__ import annotations

import errno
import socket
import threading
import time

import uvicorn
from starlette.applications import Starlette

HOST = "127.0.0.1"  # servers fwbench starts listen on the loopback address only
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 5  # open requests get this long to finish when the server stops


class PortInUse(OSError):
    """The port asked for is in use on 127.0.0.1."""


def bind(port: int) -> socket.socket:
    """A listening TCP socket on 127.0.0.1:``port`` (0: a free port); PortInUse naming the port when it is taken."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port a killed server left in TIME_WAIT is free
    try:
        sock.bind((HOST, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUse(
                f"port {port} on {HOST} is in use (choose another with --port, or 0 for any free one)"
            ) from None
        raise
    sock.listen(1024)
    return sock


class HttpServer:
    """``app`` served by uvicorn on a thread; a context manager (stopped on exit). ``url``: its base address."""

    def __init__(self, app: Starlette, port: int = 0) -> None:
        self._socket = bind(port)
        self.port = int(self._socket.getsockname()[1])
        self.url = f"http://{HOST}:{self.port}"
        config = uvicorn.Config(
            app, loop="uvloop", http="httptools", lifespan="on", log_level="warning", access_log=False,
            timeout_keep_alive=30, timeout_graceful_shutdown=STOP_TIMEOUT_S,
        )  # fmt: skip
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name="fwbench-http", daemon=True
        )

    def __enter__(self) -> HttpServer:
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                late = self._thread.is_alive()
                self.stop()
                if late:
                    raise TimeoutError(f"the HTTP server on {self.url} did not start in {START_TIMEOUT_S:g} s")
                raise RuntimeError(f"the HTTP server on {self.url} ended while starting")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Stop accepting, finish the open requests, end the thread (the batcher closes in the app's lifespan)."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=STOP_TIMEOUT_S + 5)
        self._socket.close()

    def __exit__(self, *exc: object) -> None:
        self.stop()
