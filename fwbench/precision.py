"""The one precision policy each ``--dtype`` names, the same in every framework (framework-free).

``bf16`` is mixed precision, with torch's CPU autocast as the reference: the weights stay float32 (the
master copy the optimizer updates), and each op class computes as :data:`BF16_RULES` says — matmuls,
convolutions and attention take bfloat16 operands and accumulate in float32, softmax, layer norm, batch-norm
statistics and the loss compute in float32, elementwise ops follow their inputs (so a residual stream that
starts float32, the embeddings' sum, stays float32). Each framework applies it its own way (torch:
``torch.autocast``; TensorFlow and JAX: explicit casts in the model code, ``fwbench/frameworks/<fw>/
precision.py``; Keras: its ``mixed_bfloat16`` policy with float32 layer norms and embeddings), and each
worker stores what the framework's own graph shows (:data:`OBSERVED_OPS`), so a runtime that computes
something else is seen, not assumed. docs/precision.md has the table for readers.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

# The policy the model code in force reads (TensorFlow's and JAX's precision.py), set around a model's call.
_ACTIVE: ContextVar[str] = ContextVar("fwbench_precision_policy", default="fp32")


def active() -> str:
    """The dtype whose policy is in force ("fp32" outside any :func:`computing`)."""
    return _ACTIVE.get()


@contextlib.contextmanager
def computing(dtype: str) -> Iterator[None]:
    """The policy of ``dtype`` ("fp32" or "bf16") for the model code run or traced inside."""
    token = _ACTIVE.set(dtype)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def scoped(dtype: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` whose body (run eagerly, or traced by jit / tf.function) runs under the policy of ``dtype``."""

    @functools.wraps(function)
    def under_policy(*args: Any, **kwargs: Any) -> Any:
        with computing(dtype):
            return function(*args, **kwargs)

    return under_policy


@dataclass(frozen=True)
class OpRule:
    """How one class of ops computes under ``--dtype bf16``."""

    op_class: str  # as observed and stored: matmul, conv, attention, softmax, layer_norm, batch_norm, ...
    ops: str  # which ops of the zoo's models fall in it
    operands: str  # the dtype the op reads
    computes: str  # where it accumulates / computes
    output: str  # the dtype it hands on
    torch_autocast: str  # where torch.autocast(cpu, bfloat16) puts it: the reference
    observed: str | None = None  # the one dtype an observation of the class must show (None: not observed)


BF16_RULES: tuple[OpRule, ...] = (
    OpRule(
        "matmul",
        "linear / dense layers, the tied LM head, the gemm model",
        "bfloat16 (float32 weights and activations cast)",
        "float32 accumulation",
        "bfloat16",
        "lower-precision list (linear, matmul, addmm)",
        "bfloat16",
    ),
    OpRule(
        "conv",
        "ResNet's convolutions",
        "bfloat16",
        "float32 accumulation",
        "bfloat16",
        "lower-precision list (conv2d)",
        "bfloat16",
    ),
    OpRule(
        "attention",
        "Q·Kᵀ and P·V of scaled-dot-product attention",
        "bfloat16",
        "float32 accumulation (scores float32 where the framework's matmul can return float32)",
        "bfloat16",
        "lower-precision list (scaled_dot_product_attention, bmm)",
        "bfloat16",
    ),
    OpRule(
        "softmax",
        "attention probabilities",
        "float32 (scores upcast)",
        "float32",
        "bfloat16 (the probabilities P·V reads)",
        "inside the fused attention kernel, float32 (its accumulation type)",
        "float32",
    ),
    OpRule(
        "layer_norm",
        "BERT's and GPT-2's layer norms",
        "float32 (the residual stream is float32)",
        "float32 statistics and normalisation",
        "float32",
        "not cast: runs in its input's dtype, float32 here",
        "float32",
    ),
    OpRule(
        "batch_norm",
        "ResNet's batch norms",
        "bfloat16 (a convolution's output)",
        "float32 statistics (batch and running), float32 normalisation",
        "bfloat16",
        "not cast: mixed-dtype kernel, float32 statistics",
        "float32",
    ),
    OpRule(
        "elementwise",
        "GELU, ReLU, tanh, pooling, residual adds",
        "their inputs' (bfloat16 after a matmul; float32 + bfloat16 promotes to float32)",
        "as the operands",
        "as the operands",
        "not cast (type promotion)",
    ),
    OpRule("embedding", "token, position and type embeddings", "float32 table", "float32", "float32", "not cast"),
    OpRule(
        "loss",
        "cross-entropy of the logits (phase training)",
        "float32 (logits upcast)",
        "float32",
        "float32",
        "lower-precision output cast to float32 before the loss",
    ),
    OpRule(
        "update",
        "optimizer step, gradients of the weights",
        "float32",
        "float32",
        "float32 master weights",
        "the optimizer sees float32 parameters and gradients",
    ),
)

# The op classes a worker observes in its framework's graph (traced graph, jaxpr or the ops dispatched under
# autocast) and what is read for each: a contraction's (matmul, conv, attention) operands; softmax's input;
# every floating tensor a layer norm reads and computes with, its input (the residual stream) included; a batch
# norm's parameters, statistics and arithmetic, but not its input (a convolution's bfloat16 output by policy).
# The dtype each must show under each policy; a class the model does not have (or the framework hides inside a
# fused kernel) is simply absent.
OBSERVED_OPS = tuple(rule.op_class for rule in BF16_RULES if rule.observed is not None)
EXPECTED_DTYPES: dict[str, dict[str, str]] = {
    "fp32": dict.fromkeys(OBSERVED_OPS, "float32"),
    "bf16": {rule.op_class: rule.observed for rule in BF16_RULES if rule.observed is not None},
}
FLOATING = frozenset({"float16", "bfloat16", "float32", "float64"})  # the dtype names an observation keeps


def scope_class(scope_parts: Iterable[str], scopes: Mapping[str, str], is_cast: bool) -> str | None:
    """The normalisation op class (layer_norm, batch_norm, or ``scopes``' name → class, e.g. a Keras model's layer
    names) of an op whose name scope is ``scope_parts``, a part matching a name exactly or with the ``_<n>`` suffix
    frameworks add; None outside those scopes and for a batch norm's cast of its input (OBSERVED_OPS)."""
    parts = list(scope_parts)
    for name, op_class in {"layer_norm": "layer_norm", "batch_norm": "batch_norm", **scopes}.items():
        if any(re.fullmatch(rf"{re.escape(name)}(_\d+)?", part) for part in parts):
            return None if op_class == "batch_norm" and is_cast else op_class
    return None


def policy_mismatches(dtype: str, observed: dict[str, list[str]]) -> list[str]:
    """The op classes of ``observed`` (op class → the dtypes seen) that do not compute in the dtype
    ``dtype``'s policy says, as ``"layer_norm: bfloat16 (policy: float32)"``; empty when all do."""
    expected = EXPECTED_DTYPES.get(dtype, {})
    return [
        f"{op}: {', '.join(seen)} (policy: {expected[op]})"
        for op, seen in observed.items()
        if op in expected and seen and set(seen) != {expected[op]}
    ]
