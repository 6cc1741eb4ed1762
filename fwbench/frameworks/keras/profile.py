"""``fwbench profile`` in Keras 3: the profiler of the backend Keras runs on (torch.profiler, TensorFlow's
profiler, jax.profiler), through that framework's own ``profile.py``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import keras

from fwbench.frameworks.roles import builtin_package, import_profiler


def record(step: Callable[[], object], calls: int, directory: Path, device: str) -> dict[str, Any]:
    """As the framework Keras runs on records it (Keras is imported by then: the backend built the model)."""
    backend = keras.backend.backend()
    report = import_profiler(builtin_package(backend)).record(step, calls, directory, device)
    report["profiler"] = f"{report['profiler']} (keras on {backend})"
    return report
