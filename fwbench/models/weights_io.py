"""Canonical weights on disk: safetensors only (never pickle), checked against the model's schema."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from fwbench.models.base import ModelDescription
from fwbench.models.checkpoint import is_checkpoint_dir, load_checkpoint_weights


def save_weights(description: ModelDescription, weights: dict[str, np.ndarray], path: Path, seed: int) -> None:
    """Write ``weights`` to ``path`` with the model name and seed in the file's metadata."""
    description.check_weights(weights)
    save_file(
        {k: np.ascontiguousarray(v) for k, v in weights.items()},
        str(path),
        metadata={"fwbench_model": description.name, "seed": str(seed)},
    )


def load_weights(description: ModelDescription, path: Path) -> dict[str, np.ndarray]:
    """Float32 weights from a safetensors file or a Hugging Face checkpoint directory
    (fwbench.models.checkpoint); ValueError naming the file on any mismatch with the schema."""
    if is_checkpoint_dir(path):
        return load_checkpoint_weights(description, path)
    try:
        weights = load_file(str(path))
    except (OSError, SafetensorError) as exc:
        raise ValueError(f"cannot read weights {path}: {exc}") from None
    try:
        description.check_weights(weights)
    except ValueError as exc:
        raise ValueError(f"weights {path} do not fit {description.name}: {exc}") from None
    return {name: value.astype(np.float32, copy=False) for name, value in weights.items()}
