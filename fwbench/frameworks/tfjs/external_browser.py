"""The Python side of ``tfjs:wasm-browser``: TF.js's WebAssembly backend in a cross-origin-isolated page of headless
Chromium, driven by the same JavaScript worker as the Node.js runtimes (``worker.mjs``; ``browser/browser.mjs``
starts the page's server and Chromium, ``browser/page.mjs`` runs in the page). It prepares the cell exactly as
:mod:`.external` does (the same model files, weights, inputs and float64 reference) and needs Chromium besides.
"""

from __future__ import annotations

import os
import shutil

from fwbench.frameworks.tfjs.external import missing as missing_node
from fwbench.frameworks.tfjs.external import missing_model, prepare

__all__ = ["CHROMIUM_ENV", "CHROMIUM_NAMES", "chromium_executable", "missing", "missing_model", "prepare"]

CHROMIUM_ENV = "FWBENCH_CHROMIUM"  # the Chromium executable to run (default: the first of CHROMIUM_NAMES on PATH)
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


def chromium_executable() -> str | None:
    """``$FWBENCH_CHROMIUM``, else the first of :data:`CHROMIUM_NAMES` on PATH (browser.mjs looks the same way);
    None when there is none."""
    override = os.environ.get(CHROMIUM_ENV)
    if override:
        return shutil.which(override)
    return next((found for name in CHROMIUM_NAMES if (found := shutil.which(name))), None)


def missing() -> str | None:
    """None when tfjs:wasm-browser can run here, else why not (what the Node.js runtimes miss, or Chromium)."""
    unavailable = missing_node()
    if unavailable:
        return unavailable
    if chromium_executable() is None:
        where = (
            f"${CHROMIUM_ENV}={os.environ[CHROMIUM_ENV]} is not an executable"
            if os.environ.get(CHROMIUM_ENV)
            else f"none of {', '.join(CHROMIUM_NAMES)} on PATH"
        )
        return f"no Chromium found ({where}): install Debian's chromium (scripts/ensure-chromium)"
    return None
