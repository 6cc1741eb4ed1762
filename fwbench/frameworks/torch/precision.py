"""fwbench's precision policy (fwbench.precision) in PyTorch, and what an op trace shows.

torch is the reference: ``--dtype bf16`` is ``torch.autocast(device, torch.bfloat16)`` around the forward (the
backend's ``Autocast``), whose CPU op lists define the policy — linear, matmul, convolution and
scaled-dot-product attention in bfloat16, everything else in its inputs' dtype (so layer norm on the float32
residual stream stays float32, and batch norm takes a bfloat16 input with float32 statistics). The model code
needs no casts of its own. :func:`observed_dtypes` records the operand dtypes of each op class as the ops are
dispatched (a ``TorchDispatchMode``, below autocast, so it sees what autocast made of each call).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fwbench.precision import FLOATING

# aten op (overload packet name) -> op class, and which of its arguments are read (fwbench.precision OBSERVED_OPS:
# a layer norm's input, weight and bias; a batch norm's weight, bias and running statistics, not its input)
_OP_CLASSES: dict[str, tuple[str, slice]] = {
    "linear": ("matmul", slice(None)),
    "addmm": ("matmul", slice(None)),
    "mm": ("matmul", slice(None)),
    "matmul": ("matmul", slice(None)),
    "bmm": ("attention", slice(None)),
    "baddbmm": ("attention", slice(None)),
    "scaled_dot_product_attention": ("attention", slice(0, 3)),
    "_scaled_dot_product_flash_attention_for_cpu": ("attention", slice(0, 3)),
    "_scaled_dot_product_attention_math": ("attention", slice(0, 3)),
    "conv2d": ("conv", slice(0, 2)),
    "convolution": ("conv", slice(0, 2)),
    "_softmax": ("softmax", slice(0, 1)),
    "softmax": ("softmax", slice(0, 1)),
    "layer_norm": ("layer_norm", slice(None)),
    "native_layer_norm": ("layer_norm", slice(None)),
    "rms_norm": ("layer_norm", slice(None)),  # nn.RMSNorm under inference mode (with autograd: its decomposition)
    "_fused_rms_norm": ("layer_norm", slice(None)),
    "batch_norm": ("batch_norm", slice(1, 5)),
    "native_batch_norm": ("batch_norm", slice(1, 5)),
    "_native_batch_norm_legit_no_training": ("batch_norm", slice(1, 5)),
    "_native_batch_norm_legit": ("batch_norm", slice(1, 5)),
}


class _OperandDtypes(TorchDispatchMode):
    """Records, per op class, the dtypes of the tensor arguments of each dispatched op of that class."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, set[str]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        known = _OP_CLASSES.get(func.overloadpacket.__name__)
        if known is not None:
            op_class, which = known
            dtypes = {str(a.dtype).removeprefix("torch.") for a in args[which] if isinstance(a, torch.Tensor)}
            self.seen.setdefault(op_class, set()).update(dtypes & FLOATING)
        return func(*args, **(kwargs or {}))


def observed_dtypes(forward: Callable[..., Any], inputs: Sequence[Any]) -> dict[str, list[str]]:
    """Op class → the floating dtypes it reads as dispatched during one call ``forward(*inputs)`` (run without
    autograd; a training-mode batch norm would update its running statistics, so callers pass an eval forward)."""
    recorder = _OperandDtypes()
    with torch.no_grad(), recorder:
        forward(*inputs)
    return {op_class: sorted(dtypes) for op_class, dtypes in recorder.seen.items()}
