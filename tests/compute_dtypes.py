"""Which dtype a runtime's matrix multiplications and convolutions really computed in (test-only).

A loss that differs from the float32 one by more than some threshold is no proof of bfloat16: how much
bfloat16 moves a loss depends on the CPU (native AVX512_BF16 units round differently from AVX2 emulation)
and on cancellations. This module watches the computation itself, inside each framework, while a training
step is traced or run, and records the dtype of every matmul-like and convolution operation it sees:

- eager PyTorch (``torch:eager``, ``keras:torch``): a ``TorchDispatchMode`` sees every aten op that runs,
  forward and backward; the output dtype of ``mm``/``addmm``/``bmm``/``baddbmm``/``convolution``... is kept
  (not of ops on meta tensors: Keras infers shapes that way, computing nothing);
- ``torch:compile``: an inductor post-grad pass reads the dtype of the same ops in the graph inductor
  compiles (the dispatch mode would stop Dynamo from compiling at all);
- JAX (``jax:jit``, ``keras:jax``): the ``dot_general`` and ``conv_general_dilated`` primitives' ``bind``,
  called while ``jax.jit`` traces the step (forward and the transposed backward), records its operands' dtypes
  (a bfloat16 step may hold mixed ones: ``jax.nn.dot_product_attention`` takes its softmax in float32, so the
  backward of the probabilities × values product multiplies a float32 cotangent with bfloat16 values);
- TensorFlow (``tensorflow:*``, ``keras:tensorflow``): the generated op wrappers (``MatMul``,
  ``BatchMatMulV2/V3``, ``Conv2D`` and their backprops, ``Einsum``) that eager execution and ``tf.function``
  tracing both call record their floating operands' dtypes, as for JAX (under XLA the policy's products take
  bfloat16 operands and return float32: their output dtype would not show it).

Only the process this runs in is patched (the tests' per-runtime subprocess).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

TORCH_OPS = (
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "convolution",
    "convolution_backward",
    "_convolution",
    "matmul",
    "linear",
    "mkldnn_convolution",
)
TF_OPS = {
    "gen_math_ops": ("mat_mul", "batch_mat_mul", "batch_mat_mul_v2", "batch_mat_mul_v3"),
    "gen_nn_ops": ("conv2d", "conv2d_backprop_input", "conv2d_backprop_filter"),
    "gen_linalg_ops": ("einsum",),
}


def _dtype_name(value: Any) -> str:
    dtype = getattr(value, "dtype", None)
    return str(getattr(dtype, "name", dtype)).replace("torch.", "")


def _first_tensor(out: Any) -> Any:
    """An op's output, or the first non-None one of several (``convolution_backward`` gives None for the
    gradient of an input that needs none)."""
    if isinstance(out, (tuple, list)):
        return next((item for item in out if item is not None), None)
    return out


@contextlib.contextmanager
def _torch_eager(seen: list[tuple[str, str]]) -> Iterator[None]:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            name, first = func.overloadpacket.__name__, _first_tensor(out)
            # Keras' torch backend infers output shapes by calling layers on meta tensors (no data, no autocast).
            if name in TORCH_OPS and getattr(getattr(first, "device", None), "type", None) != "meta":
                seen.append((name, _dtype_name(first)))
            return out

    with Recorder():
        yield


@contextlib.contextmanager
def _torch_compile(seen: list[tuple[str, str]]) -> Iterator[None]:
    import torch._inductor.config as inductor_config

    def record(graph: Any) -> None:
        for node in graph.nodes:
            if node.op == "call_function" and getattr(node.target, "__name__", "").split(".")[0] in TORCH_OPS:
                seen.append((node.target.__name__, _dtype_name(_first_tensor(node.meta.get("val")))))

    saved = inductor_config.post_grad_custom_post_pass
    inductor_config.post_grad_custom_post_pass = record  # uncacheable: inductor compiles (and calls it) anew
    try:
        yield
    finally:
        inductor_config.post_grad_custom_post_pass = saved


@contextlib.contextmanager
def _jax(seen: list[tuple[str, str]]) -> Iterator[None]:
    from jax._src.lax import convolution, lax

    primitives = (lax.dot_general_p, convolution.conv_general_dilated_p)
    saved = [primitive.bind for primitive in primitives]

    def recording(primitive: Any, bind: Callable[..., Any]) -> Callable[..., Any]:
        def bind_recorded(*args: Any, **params: Any) -> Any:
            seen.append((primitive.name, ",".join(_dtype_name(a) for a in args)))
            return bind(*args, **params)

        return bind_recorded

    for primitive, bind in zip(primitives, saved):
        primitive.bind = recording(primitive, bind)
    try:
        yield
    finally:
        for primitive, bind in zip(primitives, saved):
            primitive.bind = bind


@contextlib.contextmanager
def _tensorflow(seen: list[tuple[str, str]]) -> Iterator[None]:
    import importlib

    patched: list[tuple[Any, str, Any]] = []

    def recording(name: str, op: Callable[..., Any]) -> Callable[..., Any]:
        def op_recorded(*args: Any, **kwargs: Any) -> Any:
            values = (*args, *kwargs.values())
            flat = [
                v for value in values for v in (value if isinstance(value, list | tuple) else (value,))
            ]  # Einsum: a list
            operands = [v for v in flat if getattr(getattr(v, "dtype", None), "is_floating", False)]
            seen.append((name, ",".join(_dtype_name(a) for a in operands)))
            return op(*args, **kwargs)

        return op_recorded

    for module_name, names in TF_OPS.items():
        module = importlib.import_module(f"tensorflow.python.ops.{module_name}")
        for name in names:
            if hasattr(module, name):
                patched.append((module, name, getattr(module, name)))
                setattr(module, name, recording(name, getattr(module, name)))
    try:
        yield
    finally:
        for module, name, op in patched:
            setattr(module, name, op)


def engine(runtime: str) -> str:
    """Which framework executes ``runtime``'s operations: keras:X runs on X."""
    framework, mode = runtime.split(":", 1)
    executing = mode if framework == "keras" else framework
    return "torch:compile" if runtime == "torch:compile" else executing


RECORDERS = {"torch": _torch_eager, "torch:compile": _torch_compile, "jax": _jax, "tensorflow": _tensorflow}


@contextlib.contextmanager
def recorded_compute_dtypes(runtime: str) -> Iterator[list[tuple[str, str]]]:
    """Within the block, every matmul/convolution that ``runtime`` runs or traces appends
    ``(op name, dtype)`` to the yielded list (for JAX, the operands' dtypes joined by commas)."""
    seen: list[tuple[str, str]] = []
    with RECORDERS[engine(runtime)](seen):
        yield seen
