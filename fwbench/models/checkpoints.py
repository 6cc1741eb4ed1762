"""Named checkpoints: the intermediate outputs every framework's implementation of a model exposes under one
shared list of names (``ModelDescription.checkpoint_names``), for ``fwbench diff`` and for naming the first
diverging layer of a parity mismatch.

A model file's forward takes ``taps`` (a dict, or None) and calls :func:`tap` at each checkpoint: with None (every
timed call) nothing is recorded and the function is the one benchmarked; with a dict, the value is stored under its
name, so a compiled program traced with a dict returns its intermediates as extra outputs. No framework is imported
here.
"""

from __future__ import annotations

from typing import Any, TypeVar

Taps = dict[str, Any] | None  # a forward's checkpoint collector: None (not capturing) or name -> tensor
T = TypeVar("T")


def tap(taps: Taps, name: str, value: T) -> T:
    """``value``, recorded as checkpoint ``name`` in ``taps`` when capturing (``taps`` is a dict)."""
    if taps is not None:
        taps[name] = value
    return value


def missing_checkpoints(expected: tuple[str, ...], captured: dict[str, Any]) -> str | None:
    """Why ``captured`` (a framework's checkpoints) is not the model's shared list ``expected`` (None when it is)."""
    missing = [name for name in expected if name not in captured]
    extra = [name for name in captured if name not in expected]
    if not missing and not extra:
        return None
    parts = ([f"missing {', '.join(missing[:3])}{' …' if len(missing) > 3 else ''}"] if missing else []) + (
        [f"unexpected {', '.join(extra[:3])}{' …' if len(extra) > 3 else ''}"] if extra else []
    )
    return "checkpoints differ from the model's list: " + "; ".join(parts)
