"""fwbench's precision policy (fwbench.precision) in TensorFlow: the ops the model files call, and what a traced
graph shows.

The policy in force is a context variable the backend sets around the model's call (:func:`scoped`): read on
every eager call and while a tf.function traces, so a traced graph holds the casts of its policy. ``fp32``:
plain float32 ops. ``bf16``: matmul, conv and attention operands cast to tf.bfloat16, softmax, layer norm and
batch-norm statistics in float32, the variables float32 (gradients reach them through the casts). The matmuls'
form depends on the compiler (:func:`scoped`'s ``xla``), the fastest each runs on bf16 units:

- eager and tf.function: TF's bfloat16 MatMul and BatchMatMul (oneDNN kernels accumulating in float32,
  returning bfloat16). TF has no CPU kernel for a bfloat16 product with a float32 result, so the attention
  scores are rounded to bfloat16 before they are upcast for the softmax (torch and JAX keep them float32).
- XLA: a bfloat16 product with a float32 result (``output_type``; XLA's CPU backend runs it on its bf16 kernels,
  and a product with a bfloat16 result as a float32 dot of upcast operands), rounded to bfloat16 — the attention
  scores kept float32 — with a custom gradient of the same form on the bfloat16 cotangent (torch autocast's
  backward: bfloat16 operands, float32 accumulation, bfloat16 gradients).

Each helper runs under a ``tf.name_scope`` of its op class while tracing, which :func:`graph_dtypes` reads back.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any

import tensorflow as tf
from tensorflow.compiler.tf2xla.python import xla as xla_ops

from fwbench import precision as policy

# Whether the model code runs inside an XLA-compiled function (the matmuls' form: the module's docstring).
_XLA: ContextVar[bool] = ContextVar("fwbench_tensorflow_xla", default=False)


def scoped(dtype: str, function: Callable[..., Any], xla: bool = False) -> Callable[..., Any]:
    """``function`` under the policy of ``dtype`` (fwbench.precision.scoped), its matmuls in the form for XLA
    when ``xla`` (it is traced for ``jit_compile=True``)."""
    under_policy = policy.scoped(dtype, function)

    @functools.wraps(function)
    def for_compiler(*args: Any, **kwargs: Any) -> Any:
        token = _XLA.set(xla)
        try:
            return under_policy(*args, **kwargs)
        finally:
            _XLA.reset(token)

    return for_compiler


def _scope(name: str) -> contextlib.AbstractContextManager[Any]:
    """A ``tf.name_scope`` while tracing (what the observation reads back); nothing in eager mode, where ops have
    no names and the scope would only add Python work to every timed eager call."""
    return contextlib.nullcontext() if tf.executing_eagerly() else tf.name_scope(name)


def _low(x: tf.Tensor | tf.Variable) -> tf.Tensor:
    """``x`` in the policy's matmul dtype (bfloat16 under bf16; unchanged under fp32)."""
    return tf.cast(x, tf.bfloat16) if policy.active() == "bf16" else tf.convert_to_tensor(x)


def _accumulated(a: tf.Tensor, b: tf.Tensor, transpose_a: bool = False, transpose_b: bool = False) -> tf.Tensor:
    """``tf.linalg.matmul`` of bfloat16 ``a`` and ``b`` with a float32 result (XLA only: no CPU kernel). A
    transposed ``a`` is materialised first: XLA's CPU backend (TF 2.21) runs a product that reads its left operand
    transposed, or reads a bare transpose behind an optimization barrier, as a float32 product of upcast operands
    (its compiled HLO converts both); a transpose computed by an elementwise op (× 1, exact) behind the barrier
    goes to the bf16 kernel."""
    if transpose_a:
        (a,) = xla_ops.optimization_barrier(tf.linalg.matrix_transpose(a) * tf.constant(1, a.dtype))
    return tf.linalg.matmul(a, b, transpose_b=transpose_b, output_type=tf.float32)


def _xla_product(a: tf.Tensor, b: tf.Tensor, transpose_b: bool, result_dtype: tf.DType) -> tf.Tensor:
    """a·b (or a·bᵀ) of bfloat16 operands with equal batch dimensions (no broadcasting), accumulated in float32
    and returned in ``result_dtype``; its gradients the same kind of products of the bfloat16-rounded upstream
    gradient, returned in bfloat16."""
    if a.shape.rank != b.shape.rank or a.shape[:-2] != b.shape[:-2]:
        raise ValueError(
            f"operands of shapes {a.shape} and {b.shape}: the product's gradient needs equal batch dimensions"
        )

    @tf.custom_gradient
    def product(a: tf.Tensor, b: tf.Tensor) -> Any:
        def gradient(upstream: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            g = tf.cast(upstream, tf.bfloat16)
            if transpose_b:  # r = a·bᵀ: da = g·b, db = gᵀ·a
                da, db = _accumulated(g, b), _accumulated(g, a, transpose_a=True)
            else:  # r = a·b: da = g·bᵀ, db = aᵀ·g
                da, db = _accumulated(g, b, transpose_b=True), _accumulated(a, g, transpose_a=True)
            return tf.cast(da, tf.bfloat16), tf.cast(db, tf.bfloat16)

        return tf.cast(_accumulated(a, b, transpose_b=transpose_b), result_dtype), gradient

    return product(a, b)


def _product(a: tf.Tensor, b: tf.Tensor | tf.Variable, transpose_b: bool = False) -> tf.Tensor:
    """a·b (or a·bᵀ) under the policy: float32, or bfloat16 operands and result in the compiler's form."""
    if policy.active() != "bf16":
        return tf.matmul(a, b, transpose_b=transpose_b)
    if _XLA.get():
        return _xla_product(_low(a), _low(b), transpose_b, tf.bfloat16)
    return tf.matmul(_low(a), _low(b), transpose_b=transpose_b)


def matmul(a: tf.Tensor, b: tf.Tensor | tf.Variable, transpose_b: bool = False) -> tf.Tensor:
    """``tf.matmul(a, b)``; bf16: bfloat16 operands and result (float32 accumulation)."""
    with _scope("matmul"):
        return _product(a, b, transpose_b)


def dense(x: tf.Tensor, kernel: tf.Variable, bias: tf.Variable) -> tf.Tensor:
    """(N, in) @ (in, out) + bias; bf16: bfloat16 operands, bias and result."""
    with _scope("matmul"):
        return tf.nn.bias_add(_product(x, kernel), _low(bias))


def conv2d(x: tf.Tensor, kernel: tf.Variable, stride: int, padding: str | list[list[int]]) -> tf.Tensor:
    """``tf.nn.conv2d`` (NHWC, HWIO); bf16: bfloat16 operands and result."""
    with _scope("conv"):
        return tf.nn.conv2d(_low(x), _low(kernel), stride, padding)


def attention(q: tf.Tensor, k: tf.Tensor, v: tf.Tensor, mask: tf.Tensor, scale: float) -> tf.Tensor:
    """softmax(q·kᵀ·scale + mask)·v over (B, heads, S, d) operands, ``mask`` additive (B, 1, 1 or S, S) float32.
    fp32: q scaled before Q·Kᵀ (the smaller tensor). bf16: the scores float32 (XLA; eager and tf.function: rounded
    to bfloat16 and upcast), then scaled and masked, the softmax float32, the probabilities cast back for P·V."""
    with _scope("attention"):
        if policy.active() != "bf16":
            scores = tf.matmul(q * scale, k, transpose_b=True) + mask
            return tf.matmul(tf.nn.softmax(scores, axis=-1), v)
        if _XLA.get():
            scores = _xla_product(_low(q), _low(k), True, tf.float32)
        else:
            scores = tf.cast(tf.matmul(_low(q), _low(k), transpose_b=True), tf.float32)
        probabilities = tf.nn.softmax(scores * scale + mask, axis=-1)
        return _product(probabilities, v)


def add(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
    """x + y in the wider of their dtypes: a float32 residual stream plus a bfloat16 matmul result stays float32
    (torch and JAX promote so; TF's AddV2 wants equal dtypes)."""
    if x.dtype != y.dtype:
        x, y = tf.cast(x, tf.float32), tf.cast(y, tf.float32)
    return x + y


def layer_norm(x: tf.Tensor, gamma: tf.Variable, beta: tf.Variable, eps: float) -> tf.Tensor:
    """LayerNorm over the last axis: two-pass biased variance, like torch and the float64 reference (fewer eager
    ops than tf.nn.moments + tf.nn.batch_normalization, and as fast in a graph), in float32 under every policy."""
    with _scope("layer_norm"):
        x = tf.cast(x, tf.float32)
        centred = x - tf.reduce_mean(x, axis=-1, keepdims=True)
        variance = tf.reduce_mean(tf.square(centred), axis=-1, keepdims=True)
        return centred * tf.math.rsqrt(variance + eps) * gamma + beta


def rms_norm(x: tf.Tensor, scale: tf.Variable, eps: float) -> tf.Tensor:
    """RMSNorm over the last axis, x / √(mean(x²) + eps) · scale, in float32 under every policy."""
    with _scope("layer_norm"):
        x = tf.cast(x, tf.float32)
        return x * tf.math.rsqrt(tf.reduce_mean(tf.square(x), axis=-1, keepdims=True) + eps) * scale


@contextlib.contextmanager
def batch_norm_scope() -> Iterator[None]:
    """The name scope batch-norm code runs in (its statistics are then observed as batch_norm)."""
    with _scope("batch_norm"):
        yield


# -- what a traced graph shows ------------------------------------------------------------------------
_CAST = "Cast"
# A batched matmul or an einsum is attention's Q·Kᵀ or P·V (the zoo's dense layers are plain MatMuls; Keras'
# dot_product_attention on TensorFlow is einsums).
_CONTRACTIONS = {
    "MatMul": "matmul",
    "BatchMatMulV2": "attention",
    "BatchMatMulV3": "attention",
    "Einsum": "attention",
    "Conv2D": "conv",
}


def _op_class(op: tf.Operation, scopes: dict[str, str]) -> str | None:
    """The op class of a graph op: contractions by type (a batched product of matrices, as
    ``tf.linalg.matmul(..., output_type=)`` writes a plain one, is a matmul), Softmax, and every op inside a
    layer-norm or batch-norm scope (a batch norm's cast of its input excluded: fwbench.precision OBSERVED_OPS).
    ``scopes``: more scope names → op class (a Keras model's layer names, which Keras may suffix with ``_<n>``)."""
    if op.type.startswith("BatchMatMul") and op.inputs[0].shape.rank == 2:
        return "matmul"
    if op.type in _CONTRACTIONS:
        return _CONTRACTIONS[op.type]
    if op.type == "Softmax":
        return "softmax"
    return policy.scope_class(op.name.split("/")[:-1], scopes, op.type == _CAST)


def graph_dtypes(graph: tf.Graph, scopes: dict[str, str] | None = None) -> dict[str, list[str]]:
    """Op class → the floating dtypes it reads (fwbench.precision OBSERVED_OPS) among ``graph``'s ops.
    ``scopes``: name scopes whose ops are that op class, beyond ``layer_norm`` and ``batch_norm``."""
    seen: dict[str, set[str]] = {}
    for op in graph.get_operations():
        op_class = _op_class(op, scopes or {})
        if op_class is not None:
            seen.setdefault(op_class, set()).update({t.dtype.name for t in op.inputs} & policy.FLOATING)
    return {op_class: sorted(dtypes) for op_class, dtypes in seen.items()}


def observed_dtypes(
    function: Callable[..., Any], inputs: Sequence[tf.Tensor], scopes: dict[str, str] | None = None
) -> dict[str, list[str]]:
    """:func:`graph_dtypes` of the graph tf.function traces of ``function`` at ``inputs`` (what eager mode runs
    op by op)."""
    signature = [tf.TensorSpec(t.shape, t.dtype) for t in inputs]
    return graph_dtypes(tf.function(function, input_signature=signature).get_concrete_function().graph, scopes)
