"""fwbench's precision policy (fwbench.precision) in TensorFlow: the ops the model files call, and what a traced
graph shows.

The policy in force is a context variable the backend sets around the model's call (:func:`scoped`): read on
every eager call and while a tf.function traces, so a traced graph holds the casts of its policy. ``fp32``:
plain float32 ops. ``bf16``: matmul, conv and attention operands cast to tf.bfloat16 (TF's bfloat16 MatMul,
BatchMatMul and Conv2D accumulate in float32 and return bfloat16; the attention scores are therefore rounded to
bfloat16 before they are upcast, where torch's fused kernel and JAX keep them float32), softmax, layer norm and
batch-norm statistics in float32, the variables float32 (gradients reach them through the casts). Each helper
runs under a ``tf.name_scope`` of its op class while tracing, which :func:`graph_dtypes` reads back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import tensorflow as tf

from fwbench import precision as policy

scoped = policy.scoped  # the backend wraps the model's function with it


def _scope(name: str) -> contextlib.AbstractContextManager[Any]:
    """A ``tf.name_scope`` while tracing (what the observation reads back); nothing in eager mode, where ops have
    no names and the scope would only add Python work to every timed eager call."""
    return contextlib.nullcontext() if tf.executing_eagerly() else tf.name_scope(name)


def _low(x: tf.Tensor | tf.Variable) -> tf.Tensor:
    """``x`` in the policy's matmul dtype (bfloat16 under bf16; unchanged under fp32)."""
    return tf.cast(x, tf.bfloat16) if policy.active() == "bf16" else tf.convert_to_tensor(x)


def matmul(a: tf.Tensor, b: tf.Tensor | tf.Variable, transpose_b: bool = False) -> tf.Tensor:
    """``tf.matmul(a, b)``; bf16: bfloat16 operands and result (float32 accumulation)."""
    with _scope("matmul"):
        return tf.matmul(_low(a), _low(b), transpose_b=transpose_b)


def dense(x: tf.Tensor, kernel: tf.Variable, bias: tf.Variable) -> tf.Tensor:
    """(N, in) @ (in, out) + bias; bf16: bfloat16 operands, bias and result."""
    with _scope("matmul"):
        return tf.nn.bias_add(tf.matmul(_low(x), _low(kernel)), _low(bias))


def conv2d(x: tf.Tensor, kernel: tf.Variable, stride: int, padding: str | list[list[int]]) -> tf.Tensor:
    """``tf.nn.conv2d`` (NHWC, HWIO); bf16: bfloat16 operands and result."""
    with _scope("conv"):
        return tf.nn.conv2d(_low(x), _low(kernel), stride, padding)


def attention(q: tf.Tensor, k: tf.Tensor, v: tf.Tensor, mask: tf.Tensor, scale: float) -> tf.Tensor:
    """softmax(q·kᵀ·scale + mask)·v over (B, heads, S, d) operands, ``mask`` additive (B, 1, 1 or S, S) float32.
    fp32: q scaled before Q·Kᵀ (the smaller tensor). bf16: the scores upcast to float32, then scaled and masked
    (one rounding, as the other frameworks), the softmax float32, the probabilities cast back for P·V."""
    with _scope("attention"):
        if policy.active() != "bf16":
            scores = tf.matmul(q * scale, k, transpose_b=True) + mask
            return tf.matmul(tf.nn.softmax(scores, axis=-1), v)
        scores = tf.cast(tf.matmul(_low(q), _low(k), transpose_b=True), tf.float32)
        probabilities = tf.nn.softmax(scores * scale + mask, axis=-1)
        return tf.matmul(_low(probabilities), _low(v))


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
    """The op class of a graph op: contractions by type, Softmax, and every op inside a layer-norm or batch-norm
    scope (a batch norm's cast of its input excluded: fwbench.precision OBSERVED_OPS). ``scopes``: more scope
    names → op class (a Keras model's layer names, which Keras may suffix with ``_<n>`` in the graph)."""
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
