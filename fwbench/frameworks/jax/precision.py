"""fwbench's precision policy (fwbench.precision) in JAX: the ops the model files call, and what a jaxpr shows.

The policy in force is a context variable the backend sets around the model's function (:func:`scoped`); it is
read while JAX traces, so a jitted program holds the casts of the policy it was traced under. ``fp32``: plain
float32 ops. ``bf16``: matmul, conv and attention operands cast to bfloat16. A matmul is a bfloat16 dot with a
float32 result (``preferred_element_type``) rounded to bfloat16, and its gradients the same kind of dot of the
bfloat16 cotangent (a custom VJP): the form XLA's CPU backend runs on bf16 units, where a dot with a bfloat16
result is run as a float32 dot of upcast operands (docs/precision.md). The attention scores stay float32 for
the softmax, the probabilities bfloat16 for P·V (``jax.nn.dot_product_attention``'s numerics). A convolution is
a bfloat16 convolution with a bfloat16 result (XLA's CPU convolution is no faster with a float32 result). Layer
norm and batch-norm statistics in float32; the parameters stay float32 and gradients flow back through the
casts in float32. Each helper runs under a ``jax.named_scope`` of its op class, which :func:`observed_dtypes`
reads back from the jaxpr.
"""

from __future__ import annotations

import contextlib
import functools
import math
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


def _arranged(x: jax.Array, spec: str, order: list[str]) -> jax.Array:
    """``x`` (indices ``spec``) with its axes in ``order``, written out row-major, or ``x`` itself when already so.
    An optimization barrier keeps XLA from folding the transpose into the dot that reads it; a unit axis added
    before the barrier and dropped after it keeps XLA from making the transpose a column-major layout of ``x``
    instead (a bare transpose behind the barrier became one, and its bf16 dot was upcast to float32: 4x slower)."""
    permutation = [spec.index(index) for index in order]
    if permutation == sorted(permutation):
        return x
    return lax.optimization_barrier(jnp.transpose(x, permutation)[None])[0]


def _contract_bf16(spec: str, a: jax.Array, b: jax.Array, result_dtype: Any) -> jax.Array:
    """``jnp.einsum(spec, a, b)`` of bfloat16 operands accumulated in float32, in ``result_dtype``.

    Written as the one form XLA's CPU backend (jax 0.10.2) runs on its bf16 kernels (YNNPACK): a (batched) matrix
    product whose left operand is row-major (batch, m, k), the right one (batch, k, n) or (batch, n, k), float32
    result. XLA has no other kernel for a bfloat16 × bfloat16 → float32 dot ("Unsupported element type for
    DotThunk::Execute: BF16 x BF16 = F32" when a transposed left operand reaches it). So the left operand and the
    result are transposed explicitly where needed, behind optimization barriers that keep XLA from folding the
    transposes back into the dot. The right operand is read as it lies when it is (batch, k, n) or (batch, n, k):
    XLA lays it out for the kernel itself, while a right operand transposed behind a barrier was upcast to a
    float32 dot (4x slower, bert-base's dense gradient); any other order is transposed like the left operand.
    """
    inputs, result = spec.split("->")
    a_spec, b_spec = inputs.split(",")
    lone = [i for i in a_spec + b_spec if (i in a_spec) + (i in b_spec) + (i in result) < 2]
    if "." in spec or lone or set(result) - set(a_spec + b_spec):
        raise ValueError(f"{spec!r}: every index of a contraction must be in two or three of its terms, no ellipsis")
    free = [index for index in result if not (index in a_spec and index in b_spec)]
    if free and free[0] in b_spec:  # the result's leading free index is b's: b is the product's left operand
        (a_spec, a), (b_spec, b) = (b_spec, b), (a_spec, a)
    sizes = {**dict(zip(a_spec, a.shape)), **dict(zip(b_spec, b.shape))}
    batch = [i for i in result if i in a_spec and i in b_spec]
    rows = [i for i in result if i in a_spec and i not in b_spec]
    columns = [i for i in result if i in b_spec and i not in a_spec]
    summed = [i for i in b_spec if i in a_spec and i not in result]

    def size(indices: list[str]) -> int:
        return math.prod(sizes[i] for i in indices)

    leading = [size(batch)] if batch else []  # a (batch, m, k) · (batch, k, n) product, or an (m, k) · (k, n) one
    left = _arranged(a, a_spec, batch + rows + summed).reshape(*leading, size(rows), size(summed))
    if list(b_spec) == batch + columns + summed:  # (batch, n, k) as it lies
        right, right_summed = b.reshape(*leading, size(columns), size(summed)), len(leading) + 1
    else:
        right = _arranged(b, b_spec, batch + summed + columns).reshape(*leading, size(summed), size(columns))
        right_summed = len(leading)
    batch_axes = (0,) if batch else ()
    dimensions = (((left.ndim - 1,), (right_summed,)), (batch_axes, batch_axes))
    product = lax.dot_general(left, right, dimensions, preferred_element_type=jnp.float32)
    order = batch + rows + columns
    product = product.astype(result_dtype).reshape([sizes[i] for i in order])
    permutation = [order.index(i) for i in result]
    if permutation == sorted(permutation):
        return product
    return jnp.transpose(lax.optimization_barrier(product), permutation)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 3))
def _contract(spec: str, a: jax.Array, b: jax.Array, result_dtype: Any) -> jax.Array:
    """The policy's contraction of bfloat16 ``a`` and ``b`` (``spec``: a two-operand einsum without ellipsis whose
    indices each appear in two or three of its terms: summed, free or batch): float32 accumulation (XLA's CPU backend runs a bfloat16 dot
    with a float32 result on its bf16 kernels, one with a bfloat16 result as a float32 dot of upcast operands), the
    result rounded to ``result_dtype``. Its gradients are the same kind of contraction of the bfloat16-rounded cotangent,
    as torch autocast's backward: bfloat16 operands, float32 accumulation, bfloat16 gradients."""
    return _contract_bf16(spec, a, b, result_dtype)


def _contract_forward(spec: str, a: jax.Array, b: jax.Array, result_dtype: Any) -> tuple[jax.Array, Any]:
    return _contract_bf16(spec, a, b, result_dtype), (a, b)


def _contract_backward(spec: str, result_dtype: Any, operands: Any, cotangent: jax.Array) -> tuple[jax.Array, ...]:
    a, b = operands
    inputs, result = spec.split("->")
    a_spec, b_spec = inputs.split(",")
    g = cotangent.astype(jnp.bfloat16)
    return (
        _contract_bf16(f"{result},{b_spec}->{a_spec}", g, b, a.dtype),
        _contract_bf16(f"{result},{a_spec}->{b_spec}", g, a, b.dtype),
    )


_contract.defvjp(_contract_forward, _contract_backward)


def _matmul_spec(rank: int) -> str:
    """The einsum of x (..., k) @ w (k, n) for an ``x`` of ``rank`` axes, e.g. "abk,kn->abn" for rank 3."""
    leading = "abcdefgh"[: rank - 1]
    return f"{leading}k,kn->{leading}n"


def matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """x (..., k) @ w (k, n) → (..., n); bf16: bfloat16 operands and result, float32 accumulation."""
    with jax.named_scope("matmul"):
        low = _low()
        return x @ w if low is None else _contract(_matmul_spec(x.ndim), x.astype(low), w.astype(low), low)


def dense(x: jax.Array, kernel: jax.Array, bias: jax.Array) -> jax.Array:
    """x (..., in) @ kernel (in, out) + bias (out,) → (..., out); bf16: bfloat16 operands, bias and result."""
    with jax.named_scope("matmul"):
        low = _low()
        if low is None:
            return x @ kernel + bias
        return _contract(_matmul_spec(x.ndim), x.astype(low), kernel.astype(low), low) + bias.astype(low)


def conv(x: jax.Array, kernel: jax.Array, **conv_arguments: Any) -> jax.Array:
    """``lax.conv_general_dilated(x, kernel, **conv_arguments)``; bf16: bfloat16 operands and result."""
    with jax.named_scope("conv"):
        low = _low()
        if low is None:
            return lax.conv_general_dilated(x, kernel, **conv_arguments)
        return lax.conv_general_dilated(x.astype(low), kernel.astype(low), **conv_arguments)


def attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array | None) -> jax.Array:
    """softmax(q·kᵀ/√d where ``mask``)·v of (B, S, heads, d) operands, ``mask`` (B, 1, 1 or S, S) bool (True:
    attend). fp32: ``jax.nn.dot_product_attention``. bf16: its numerics (bfloat16 operands, float32 scores and
    softmax, bfloat16 probabilities for P·V) with both products in the policy's contraction form."""
    with jax.named_scope("attention"):
        low = _low()
        if low is None:
            return jax.nn.dot_product_attention(q, k, v, mask=mask)
        scores = _contract("btnh,bsnh->bnts", q.astype(low), k.astype(low), jnp.float32)
        scores = scores * jnp.float32(1.0 / math.sqrt(q.shape[-1]))
        if mask is not None:  # as JAX masks
            scores = jnp.where(mask, scores, jnp.float32(-0.7 * float(jnp.finfo(jnp.float32).max)))
        probabilities = jax.nn.softmax(scores, axis=-1).astype(low)
        return _contract("bnts,bsnh->btnh", probabilities, v.astype(low), low)


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, eps: float) -> jax.Array:
    """LayerNorm over the last axis (two-pass biased variance), always computed in float32 → float32."""
    with jax.named_scope("layer_norm"):
        x = x.astype(jnp.float32)
        # algorithm: keyword-only in jax 0.10, missing from the signature its type information gives
        normalized = jax.nn.standardize(x, axis=-1, epsilon=eps, algorithm="stable")  # type: ignore[call-arg]
        return normalized * scale + bias


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """RMSNorm over the last axis, x / √(mean(x²) + eps) · scale, always computed in float32 → float32."""
    with jax.named_scope("layer_norm"):
        x = x.astype(jnp.float32)
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * scale


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
