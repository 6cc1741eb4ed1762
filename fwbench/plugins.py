"""Third-party runtimes and models: plugin modules named by the ``fwbench.plugins`` entry-point group or by
``$FWBENCH_PLUGINS`` (comma-separated module names), imported once per process. A plugin module registers what it
brings when imported (``fwbench.frameworks.register_runtime``, ``fwbench.models.register_model``); the runtime and
model registries each call :func:`load_plugins` before they answer, so neither needs the other."""

from __future__ import annotations

import importlib
import os
from importlib import metadata

from fwbench.spec import SpecError

PLUGINS_ENV = "FWBENCH_PLUGINS"
PLUGIN_GROUP = "fwbench.plugins"
_loaded = False


def load_plugins() -> None:
    """Import the plugin modules named by entry points and by $FWBENCH_PLUGINS (once per process; SpecError for a
    module that cannot be imported)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for entry_point in metadata.entry_points(group=PLUGIN_GROUP):
        entry_point.load()
    for name in filter(None, (n.strip() for n in os.environ.get(PLUGINS_ENV, "").split(","))):
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise SpecError(f"cannot import plugin module {name!r} named in ${PLUGINS_ENV}: {exc}") from None
