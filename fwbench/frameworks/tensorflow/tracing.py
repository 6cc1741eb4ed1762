"""How often a tf.function traced: the compile-health counter of TensorFlow's graph modes and of Keras' tensorflow
backend. Importing this module imports no framework (it only calls the function's own method)."""

from __future__ import annotations

from typing import Any


def tracing_counters(function: Any) -> dict[str, int]:
    """``traces``: how many times the tf.function ``function`` has traced (0 before its first call)."""
    return {"traces": int(function.experimental_get_tracing_count())}
