"""The bf16 policy's products in the XLA runtimes: bfloat16 operands with a float32 result, forward and backward.

XLA's CPU backend runs a bfloat16 × bfloat16 → float32 dot on its bf16 kernels and only in one layout, and fails
at run time on another ("Unsupported element type for DotThunk::Execute: BF16 x BF16 = F32"), so every product
the zoo's models make is run here, jitted, forward and gradients, at batch 1 and 2 and sequence 1 and 16 (widths
≥ 8, so that XLA sends them to that kernel), against the fp32 policy: ``make test`` at (batch, sequence) (1, 1) in
JAX and at (1, 1) and (2, 16) in TensorFlow, ``make test-matrix`` at every shape in both. Whether they are faster is a
benchmark (benchmarks/bf16_products.py), not a test.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from conftest import import_jax_backend

HIDDEN, HEADS, VOCAB = 32, 2, 48
SHAPES = [(1, 1), pytest.param(1, 16, marks=pytest.mark.matrix), (2, 16)]  # (batch, sequence)
JAX_SHAPES = [(1, 1), *(pytest.param(*shape, marks=pytest.mark.matrix) for shape in ((1, 16), (2, 16)))]
# bfloat16 keeps 8 bits of mantissa: a product's relative L2 error is ~3e-3 on random data; 3e-2 leaves 10x margin
TOLERANCE = 3e-2


def _rel_l2(got: Any, expected: Any) -> float:
    """Relative L2 error; the absolute one where ``expected`` is exactly 0 (at sequence length 1 the softmax is
    1 whatever the scores: the query's and key's gradients vanish in every precision)."""
    got, expected = np.asarray(got, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    scale = np.linalg.norm(expected)
    return float(np.linalg.norm(got - expected) / (scale if scale > 0 else 1.0))


def _dtype(value: Any) -> str:
    """The dtype name of a numpy / JAX array or a TF tensor."""
    return str(getattr(value.dtype, "name", value.dtype))


def _operands(batch: int, seq: int) -> dict[str, np.ndarray]:
    """Seeded float32 operands of the zoo's products at (batch, seq): activations, weights, attention inputs."""
    rng = np.random.default_rng(batch * 100 + seq)
    d = HIDDEN // HEADS
    return {
        "x": rng.standard_normal((batch, seq, HIDDEN), dtype=np.float32),
        "kernel": rng.standard_normal((HIDDEN, 4 * HIDDEN), dtype=np.float32) / np.float32(np.sqrt(HIDDEN)),
        "bias": rng.standard_normal(4 * HIDDEN, dtype=np.float32),
        "embeddings": rng.standard_normal((VOCAB, HIDDEN), dtype=np.float32) / np.float32(np.sqrt(HIDDEN)),
        "q": rng.standard_normal((batch, seq, HEADS, d), dtype=np.float32),
        "k": rng.standard_normal((batch, seq, HEADS, d), dtype=np.float32),
        "v": rng.standard_normal((batch, seq, HEADS, d), dtype=np.float32),
    }


def _check(products: dict[str, Callable[[str], tuple[Any, Any]]]) -> None:
    """Each product under the bf16 policy against the fp32 policy: its output bfloat16, its output and the
    gradients of every operand within TOLERANCE, the gradients float32 (the operands' dtype)."""
    for name, run in products.items():
        (out32, grads32), (out16, grads16) = run("fp32"), run("bf16")
        assert _dtype(out16) == "bfloat16", (name, _dtype(out16))
        assert _rel_l2(out16, out32) < TOLERANCE, (name, _rel_l2(out16, out32))
        for index, (g16, g32) in enumerate(zip(grads16, grads32)):
            assert _dtype(g16) == "float32", (name, index, _dtype(g16))
            assert _rel_l2(g16, g32) < TOLERANCE, (name, index, _rel_l2(g16, g32))


@pytest.mark.parametrize(("batch", "seq"), JAX_SHAPES)
def test_jax_products_run_and_match_fp32(batch: int, seq: int) -> None:
    import_jax_backend()
    import jax
    import jax.numpy as jnp

    from fwbench.frameworks.jax import precision

    o = {name: jnp.asarray(array) for name, array in _operands(batch, seq).items()}
    causal = jnp.tril(jnp.ones((seq, seq), bool))[None, None]  # GPT-2's mask (B, 1, S, S)
    padding = jnp.ones((batch, 1, 1, seq), bool).at[:, :, :, seq // 2 + 1 :].set(False)  # BERT's (B, 1, 1, S)
    functions: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
        "dense": (precision.dense, (o["x"], o["kernel"], o["bias"])),
        "tied LM head": (lambda x, e: precision.matmul(x, e.T), (o["x"], o["embeddings"])),
        "2-D matmul": (lambda x, w: precision.matmul(x.reshape(-1, HIDDEN), w), (o["x"], o["kernel"])),
        "causal attention": (lambda q, k, v: precision.attention(q, k, v, causal), (o["q"], o["k"], o["v"])),
        "padded attention": (lambda q, k, v: precision.attention(q, k, v, padding), (o["q"], o["k"], o["v"])),
    }

    def product(function: Callable[..., Any], operands: tuple[Any, ...]) -> Callable[[str], tuple[Any, Any]]:
        def run(dtype: str) -> tuple[Any, Any]:
            under_policy = precision.scoped(dtype, function)
            cotangent = jax.random.normal(jax.random.PRNGKey(0), jax.eval_shape(under_policy, *operands).shape)

            def loss(*args: Any) -> Any:
                return jnp.sum(under_policy(*args).astype(jnp.float32) * cotangent)

            grads = jax.jit(jax.grad(loss, argnums=tuple(range(len(operands)))))(*operands)
            return jax.jit(under_policy)(*operands), grads

        return run

    _check({name: product(function, operands) for name, (function, operands) in functions.items()})


def _equations(jaxpr: Any) -> list[Any]:
    """Every equation of ``jaxpr``, those of the jaxprs inside its equations included."""
    from jax.extend import core as jax_core

    found = []
    for equation in jaxpr.eqns:
        found.append(equation)
        for value in equation.params.values():
            for sub in value if isinstance(value, list | tuple) else (value,):
                if isinstance(sub, jax_core.ClosedJaxpr):
                    found += _equations(sub.jaxpr)
                elif isinstance(sub, jax_core.Jaxpr):
                    found += _equations(sub)
    return found


def test_jax_bf16_products_are_bfloat16_dots_with_float32_results() -> None:
    """In the jaxpr of a bf16 dense layer's and attention's gradient, every dot reads bfloat16 and returns float32:
    the form XLA runs on bf16 units (a bfloat16 result would be a float32 dot of upcast operands)."""
    import_jax_backend()
    import jax
    import jax.numpy as jnp

    from fwbench.frameworks.jax import precision

    o = {name: jnp.asarray(array) for name, array in _operands(2, 16).items()}
    mask = jnp.ones((2, 1, 1, 16), bool)

    def loss(x: Any, kernel: Any, bias: Any, q: Any, k: Any, v: Any) -> Any:
        hidden = precision.dense(x, kernel, bias).astype(jnp.float32)
        return jnp.sum(hidden) + jnp.sum(precision.attention(q, k, v, mask).astype(jnp.float32))

    operands = (o["x"], o["kernel"], o["bias"], o["q"], o["k"], o["v"])
    jaxpr = jax.make_jaxpr(jax.grad(precision.scoped("bf16", loss), argnums=(1, 3, 4, 5)))(*operands)
    dots = [e for e in _equations(jaxpr.jaxpr) if e.primitive.name == "dot_general"]
    assert len(dots) == 9, len(dots)  # dense: 1 forward + 2 gradient; attention: 2 forward + 4 gradient
    for dot in dots:
        assert [str(v.aval.dtype) for v in dot.invars] == ["bfloat16", "bfloat16"], dot
        assert str(dot.params["preferred_element_type"]) == "float32", dot


@pytest.mark.parametrize(("batch", "seq"), SHAPES)
def test_tensorflow_xla_products_run_and_match_fp32(batch: int, seq: int) -> None:
    import tensorflow as tf

    from fwbench.frameworks.tensorflow import precision

    o = {name: tf.constant(array) for name, array in _operands(batch, seq).items()}
    x2 = tf.reshape(o["x"], (-1, HIDDEN))  # the TF models' dense layers take (N, in)

    def heads(t: Any) -> Any:  # (B, S, heads, d) -> (B, heads, S, d), the TF models' attention layout
        return tf.transpose(t, (0, 2, 1, 3))

    causal = (1.0 - tf.linalg.band_part(tf.ones((seq, seq)), -1, 0))[None, None] * -1e9  # additive (1, 1, S, S)
    functions: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
        "dense": (precision.dense, (x2, o["kernel"], o["bias"])),
        "tied LM head": (lambda x, e: precision.matmul(x, e, transpose_b=True), (x2, o["embeddings"])),
        "causal attention": (
            lambda q, k, v: precision.attention(q, k, v, causal, 0.25),
            (heads(o["q"]), heads(o["k"]), heads(o["v"])),
        ),
    }

    def product(function: Callable[..., Any], operands: tuple[Any, ...]) -> Callable[[str], tuple[Any, Any]]:
        def run(dtype: str) -> tuple[Any, Any]:
            under_policy = precision.scoped(dtype, function, xla=True)

            def forward_and_gradients(*args: Any) -> tuple[Any, Any]:
                with tf.GradientTape() as tape:
                    tape.watch(args)
                    out = under_policy(*args)
                    loss = tf.reduce_sum(tf.cast(out, tf.float32) * tf.sin(tf.cast(out, tf.float32)))
                return out, tape.gradient(loss, args)

            out, grads = tf.function(forward_and_gradients, jit_compile=True)(*operands)
            return out, grads

        return run

    _check({name: product(function, operands) for name, (function, operands) in functions.items()})


def test_tensorflow_xla_bf16_products_are_bfloat16_products_with_float32_results() -> None:
    """In the graph XLA compiles for a bf16 dense layer's and attention's gradients, every product reads bfloat16
    and returns float32 (``BatchMatMulV3`` with ``Tout`` float32): the XLA form, not TF's bfloat16 MatMul."""
    import tensorflow as tf

    from fwbench.frameworks.tensorflow import precision

    o = {name: tf.constant(array) for name, array in _operands(2, 16).items()}
    x2 = tf.reshape(o["x"], (-1, HIDDEN))
    q, k, v = (tf.transpose(o[name], (0, 2, 1, 3)) for name in ("q", "k", "v"))
    mask = tf.zeros((2, 1, 1, 16))

    def gradients(x: Any, kernel: Any, bias: Any, q: Any, k: Any, v: Any) -> Any:
        with tf.GradientTape() as tape:
            tape.watch((kernel, q, k, v))
            hidden = tf.cast(precision.dense(x, kernel, bias), tf.float32)
            context = tf.cast(precision.attention(q, k, v, mask, 0.25), tf.float32)
            loss = tf.reduce_sum(hidden * tf.sin(hidden)) + tf.reduce_sum(context * tf.sin(context))
        return tape.gradient(loss, (kernel, q, k, v))

    step = tf.function(precision.scoped("bf16", gradients, xla=True), jit_compile=True)
    graph = step.get_concrete_function(x2, o["kernel"], o["bias"], q, k, v).graph
    products = [op for op in graph.get_operations() if op.type in ("MatMul", "BatchMatMulV2", "BatchMatMulV3")]
    assert len(products) == 9, [op.type for op in products]  # dense: 1 + 2 gradient; attention: 2 + 4 gradient
    for op in products:
        assert op.type == "BatchMatMulV3" and op.get_attr("Tout") == tf.float32, op
        assert [t.dtype for t in op.inputs] == [tf.bfloat16, tf.bfloat16], op
