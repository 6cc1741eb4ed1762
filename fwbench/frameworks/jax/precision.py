"""fwbench's precision policy (fwbench.precision) in JAX: the ops the model files call, and what a jaxpr shows.

The policy in force is a context variable the backend sets around the model's function (:func:`scoped`); it is
read while JAX traces, so a jitted program holds the casts of the policy it was traced under. ``fp32``: plain
float32 ops. ``bf16``: matmul, conv and attention operands cast to bfloat16, with a bfloat16 result (a bfloat16
dot without ``preferred_element_type``, so the backward's dots are bfloat16 too; XLA accumulates bfloat16 dots
in float32 — on a CPU it rounds the operands to bfloat16 and back and runs a float32 dot, as its HLO shows, so
this form leaves a CPU's bf16 units unused: docs/precision.md); layer norm and batch-norm
statistics in float32 (``jax.nn.dot_product_attention`` computes its softmax in float32 itself); the
parameters stay float32 and gradients flow back through the casts in float32. Each helper runs under a
``jax.named_scope`` of its op class, which :func:`observed_dtypes` reads back from the jaxpr.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend import core as jax_core

from fwbench import precision as policy

scoped = policy.scoped  # the backend wraps the model's function with it


def _low() -> Any:
    """bfloat16 under the bf16 policy, else None (float32 ops)."""
    return jnp.bfloat16 if policy.active() == "bf16" else None


def matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """x (..., k) @ w (k, n) → (..., n); bf16: bfloat16 operands and result."""
    with jax.named_scope("matmul"):
        low = _low()
        return x @ w if low is None else x.astype(low) @ w.astype(low)


def dense(x: jax.Array, kernel: jax.Array, bias: jax.Array) -> jax.Array:
    """x (..., in) @ kernel (in, out) + bias (out,) → (..., out); bf16: bfloat16 operands, bias and result."""
    with jax.named_scope("matmul"):
        low = _low()
        if low is None:
            return x @ kernel + bias
        return x.astype(low) @ kernel.astype(low) + bias.astype(low)


def conv(x: jax.Array, kernel: jax.Array, **conv_arguments: Any) -> jax.Array:
    """``lax.conv_general_dilated(x, kernel, **conv_arguments)``; bf16: bfloat16 operands and result."""
    with jax.named_scope("conv"):
        low = _low()
        if low is None:
            return lax.conv_general_dilated(x, kernel, **conv_arguments)
        return lax.conv_general_dilated(x.astype(low), kernel.astype(low), **conv_arguments)


def attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """``jax.nn.dot_product_attention`` of (B, S, heads, d) operands; bf16: operands in bfloat16 (its scores
    and softmax are float32, its probabilities bfloat16 for P·V: JAX's own implementation)."""
    with jax.named_scope("attention"):
        low = _low()
        if low is not None:
            q, k, v = q.astype(low), k.astype(low), v.astype(low)
        return jax.nn.dot_product_attention(q, k, v, mask=mask)


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, eps: float) -> jax.Array:
    """LayerNorm over the last axis (two-pass biased variance), always computed in float32 → float32."""
    with jax.named_scope("layer_norm"):
        x = x.astype(jnp.float32)
        # algorithm: keyword-only in jax 0.10, missing from the signature its type information gives
        normalized = jax.nn.standardize(x, axis=-1, epsilon=eps, algorithm="stable")  # type: ignore[call-arg]
        return normalized * scale + bias


@contextlib.contextmanager
def batch_norm_scope() -> Iterator[None]:
    """The named scope batch-norm code runs in (its statistics are then observed as batch_norm)."""
    with jax.named_scope("batch_norm"):
        yield


def in_float32(x: jax.Array) -> jax.Array:
    """``x`` as float32 (batch norm's input, for its statistics)."""
    return x.astype(jnp.float32)


def like(value: jax.Array, reference: jax.Array) -> jax.Array:
    """``value`` cast to ``reference``'s dtype (batch norm's float32 result back to its input's dtype)."""
    return value.astype(reference.dtype)


# -- what a jaxpr shows -----------------------------------------------------------------------------
_CONTRACTIONS = {"dot_general": "matmul", "conv_general_dilated": "conv"}
_CAST = "convert_element_type"


def _op_class(scope: str, equation: Any, scopes: dict[str, str]) -> str | None:
    """The op class an equation stands for: contractions by primitive (a dot with batch dimensions is attention's
    Q·Kᵀ or P·V: the zoo's dense layers have none), softmax by its ``exp`` (the only exp of the zoo's forwards),
    layer norm and batch norm by their scopes (a batch norm's cast of its input excluded: fwbench.precision
    OBSERVED_OPS). ``scopes``: more scope names → op class (a Keras model's layer names, possibly suffixed ``_<n>``)."""
    primitive = equation.primitive.name
    if primitive == "dot_general":
        (_, _), (lhs_batch, _) = equation.params["dimension_numbers"]
        return "attention" if lhs_batch else "matmul"
    if primitive in _CONTRACTIONS:
        return _CONTRACTIONS[primitive]
    if primitive == "exp":
        return "softmax"
    return policy.scope_class(scope.split("/"), scopes, primitive == _CAST)


def _walk(jaxpr: Any, scope: str, seen: dict[str, set[str]], scopes: dict[str, str]) -> None:
    for equation in jaxpr.eqns:
        here = f"{scope}/{equation.source_info.name_stack}"
        op_class = _op_class(here, equation, scopes)
        if op_class is not None:  # its floating operands (softmax: exp's input)
            dtypes = {str(v.aval.dtype) for v in equation.invars if hasattr(v, "aval")}
            seen.setdefault(op_class, set()).update(dtypes & policy.FLOATING)
        for value in equation.params.values():
            for sub in value if isinstance(value, list | tuple) else (value,):
                if isinstance(sub, jax_core.ClosedJaxpr):
                    _walk(sub.jaxpr, here, seen, scopes)
                elif isinstance(sub, jax_core.Jaxpr):
                    _walk(sub, here, seen, scopes)


def observed_dtypes(
    function: Callable[..., Any], *args: Any, scopes: dict[str, str] | None = None
) -> dict[str, list[str]]:
    """Op class → the dtypes it reads (fwbench.precision OBSERVED_OPS) in the jaxpr of the forward ``function``
    traced at ``args`` (a jitted function: the program it compiles), read from the program itself. ``scopes``: scope names (one part of a name
    stack) whose arithmetic is that op class, beyond ``layer_norm`` and ``batch_norm``."""
    seen: dict[str, set[str]] = {}
    _walk(jax.make_jaxpr(function)(*args).jaxpr, "", seen, scopes or {})
    return {op_class: sorted(dtypes) for op_class, dtypes in seen.items()}
