"""Profiles side by side (``fwbench profile``), the framework-free half: what a worker's profiler trace says.

A worker records a few calls under its framework's own profiler (``fwbench/frameworks/<framework>/profile.py``)
and writes the trace it produced (torch.profiler's and jax.profiler's Chrome trace; TensorFlow's XPlane,
converted to the same Chrome-trace events inside the worker). This package reads those events without
importing a framework: :mod:`.trace` picks the op events out of a trace, :mod:`.categories` maps each op to a
common category (one table per framework, as data), :mod:`.summary` reduces them to self time per op and per
category, the union of the op intervals (ops overlapping in time counted once) and the framework overhead
(wall time per call minus that union). Times are seconds.
"""
