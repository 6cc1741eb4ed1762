"""Open a local HTML file in headless Chromium and report what a reader's browser saw.

Talks the Chrome DevTools protocol over ``--remote-debugging-pipe`` (file descriptors 3 and 4,
NUL-separated JSON), so it needs nothing but the standard library and Debian's ``chromium``. It
records every uncaught exception, ``console.error``/``console.assert`` call and browser log entry of
level error (failed loads, Content-Security-Policy violations) from the moment the page starts
loading, waits for every image to decode, reads each image's natural and rendered size, and saves
PNG screenshots.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--remote-debugging-pipe",
)
VIEWPORT = (1280, 900)

# Runs in the page after load: waits for every <img> to decode, then describes them.
IMAGES_JS = """
(async () => {
  const images = [...document.images];
  const decoded = await Promise.all(images.map(i => i.decode().then(() => null, e => String(e))));
  return JSON.stringify(images.map((img, k) => {
    const box = img.getBoundingClientRect();
    return {alt: img.alt, complete: img.complete, naturalWidth: img.naturalWidth,
            naturalHeight: img.naturalHeight, width: box.width, height: box.height,
            visible: getComputedStyle(img).visibility !== 'hidden' && getComputedStyle(img).display !== 'none',
            decodeError: decoded[k], scheme: img.currentSrc.split(':')[0]};
  }));
})()
"""


def chromium_path() -> str | None:
    """The ``chromium`` executable on PATH (Debian's package), or None."""
    return shutil.which("chromium")


@dataclass
class PageReport:
    """What the browser saw: errors (text of each), images (dicts from IMAGES_JS), title, body text."""

    errors: list[str] = field(default_factory=list)
    images: list[dict[str, Any]] = field(default_factory=list)
    title: str = ""
    body_text: str = ""


class Browser:
    """One headless Chromium with a DevTools pipe; use as a context manager."""

    def __init__(self, executable: str, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="fwbench-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def _wire_pipes() -> None:  # in the child, before exec: the pipe ends become fds 3 and 4
            a, b = os.dup(to_child_r), os.dup(from_child_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        env = {**os.environ, "HOME": self.profile, "XDG_CONFIG_HOME": self.profile, "XDG_CACHE_HOME": self.profile}
        self.process = subprocess.Popen(
            [executable, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            preexec_fn=_wire_pipes,
            close_fds=False,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env=env,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Ask the browser to quit; kill its process group (ours alone) if it does not."""
        try:
            self._write({"id": -1, "method": "Browser.close"})
            self.process.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)

    def _write(self, message: dict[str, Any]) -> None:
        os.write(self._to_child, json.dumps(message).encode() + b"\0")

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self._from_child], [], [], remaining)[0]:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self._from_child, 1 << 20)
            if not chunk:
                stderr = self.process.stderr.read().decode(errors="replace") if self.process.stderr else ""
                raise RuntimeError(f"chromium closed the DevTools pipe: {stderr[-2000:]}")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        """Send one command and return its result; events that arrive meanwhile go to ``events``."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        self._write(message)
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def wait_event(self, method: str, session: str) -> dict[str, Any]:
        """The first event ``method`` of ``session`` (already received or still to come)."""
        deadline = time.monotonic() + self.timeout
        seen = 0
        while True:
            for event in self.events[seen:]:
                if event.get("method") == method and event.get("sessionId") == session:
                    return event
            seen = len(self.events)
            reply = self._read(deadline)
            if "method" in reply:
                self.events.append(reply)


def _error_text(event: dict[str, Any]) -> str | None:
    """The text of an event that is a page error, or None."""
    method, params = event.get("method"), event.get("params", {})
    if method == "Runtime.exceptionThrown":
        details = params.get("exceptionDetails", {})
        return "exception: " + str(details.get("exception", {}).get("description") or details.get("text"))
    if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
        return "console.error: " + " ".join(
            str(a.get("value", a.get("description", ""))) for a in params.get("args", [])
        )
    if method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
        entry = params["entry"]
        return f"log ({entry.get('source')}): {entry.get('text')} {entry.get('url', '')}".strip()
    return None


def inspect_page(path: Path, screenshot: Path, executable: str, timeout: float = 60.0) -> PageReport:
    """Load ``path`` (a local file) in headless Chromium at a 1280×900 viewport, wait for load and for
    every image to decode, save the first screen as ``screenshot`` (and the first image's screen as
    ``<stem>-first-plot.png`` when there is one), and return what the page did."""
    with Browser(executable, timeout) as browser:
        target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            browser.call(f"{domain}.enable", session=session)
        width, height = VIEWPORT
        browser.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            session=session,
        )
        browser.call("Page.navigate", {"url": path.resolve().as_uri()}, session=session)
        browser.wait_event("Page.loadEventFired", session)
        value = browser.call(
            "Runtime.evaluate", {"expression": IMAGES_JS, "awaitPromise": True, "returnByValue": True}, session=session
        )
        if "exceptionDetails" in value:
            raise RuntimeError(f"image probe failed: {value['exceptionDetails']}")
        images = json.loads(value["result"]["value"])
        info = browser.call(
            "Runtime.evaluate",
            {
                "expression": "JSON.stringify([document.title, document.body ? document.body.innerText : ''])",
                "returnByValue": True,
            },
            session=session,
        )
        title, body_text = json.loads(info["result"]["value"])
        shot = browser.call("Page.captureScreenshot", {"format": "png"}, session=session)
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        if images:
            browser.call(
                "Runtime.evaluate",
                {"expression": "document.images[0].scrollIntoView({block: 'start'})"},
                session=session,
            )
            shot = browser.call("Page.captureScreenshot", {"format": "png"}, session=session)
            screenshot.with_name(f"{screenshot.stem}-first-plot.png").write_bytes(base64.b64decode(shot["data"]))
        browser.call("Runtime.evaluate", {"expression": "0"}, session=session)  # flush pending events
        errors = [
            text
            for event in browser.events
            if event.get("sessionId") == session
            if (text := _error_text(event)) is not None
        ]
    return PageReport(errors=errors, images=images, title=title, body_text=body_text)
