"""Do the XLA runtimes' bf16 matmuls run on the CPU's bf16 units? fp32 vs bf16 policy, one product at a time.

Times fwbench's own precision helpers (``fwbench.frameworks.{jax,tensorflow}.precision``) at bert-base's
shapes (batch × sequence 8 × 128, hidden 768, 12 heads): the dense layer x (1024, 768) · W (768, 3072) and the
attention of (8, 128, 12, 64) operands, each forward only and forward + backward (the gradients of every
operand against a random cotangent), under the fp32 and the bf16 policy, jitted by ``jax.jit`` and by
``tf.function(jit_compile=True)``. Calls alternate between fp32 and bf16 so that machine drift hits both; the
figure is the ratio of medians, fp32 / bf16 (above 1: bf16 faster). On a CPU without bf16 units expect ≤ 1.

    .venv/bin/python benchmarks/bf16_products.py [--framework jax|tensorflow|both] [--calls 20] [--threads 2]

The thread budget and CPU pinning are fwbench's (one core per thread).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from fwbench.frameworks import create_backend
from fwbench.measure import environment
from fwbench.messages import thread_environment
from fwbench.spec import Settings

TOKENS, HIDDEN, FFN, BATCH, SEQ, HEADS = 1024, 768, 3072, 8, 128, 12


def _jax_call(compiled: Callable[..., Any], operands: tuple[Any, ...]) -> None:
    """One call of a jitted case, waited for."""
    import jax

    jax.block_until_ready(compiled(*operands))


def _tensorflow_call(compiled: Callable[..., Any], operands: tuple[Any, ...]) -> None:
    """One call of a compiled tf.function case, its results copied to the host (what waits for them)."""
    import tensorflow as tf

    tf.nest.map_structure(lambda t: t.numpy(), compiled(*operands))


Calls = dict[str, dict[str, Callable[[], Any]]]  # case name → {policy: one call of the compiled case}


def policy_calls(
    dense: Callable[..., Any],
    attention: Callable[..., Any],
    backward: Callable[[Callable[..., Any]], Callable[..., Any]],
    operands: dict[str, Any],
    compile_under: Callable[[str, Callable[..., Any]], Callable[..., Any]],
    call: Callable[[Callable[..., Any], tuple[Any, ...]], None],
) -> Calls:
    """The four cases of one framework, each compiled under the fp32 and the bf16 policy: ``operands`` x, w, g
    (the dense layer's cotangent), q, k, v, c (attention's); ``compile_under(dtype, function)`` compiles
    ``function`` under a policy, ``call(compiled, operands)`` runs it once and waits."""
    o = operands
    cases: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
        "dense forward": (dense, (o["x"], o["w"])),
        "dense forward+backward": (backward(dense), (o["x"], o["w"], o["g"])),
        "attention forward": (attention, (o["q"], o["k"], o["v"])),
        "attention forward+backward": (backward(attention), (o["q"], o["k"], o["v"], o["c"])),
    }
    return {
        name: {dtype: functools.partial(call, compile_under(dtype, function), args) for dtype in ("fp32", "bf16")}
        for name, (function, args) in cases.items()
    }


def jax_cases() -> Calls:
    """Case name → {policy: a call that runs the jitted case once and waits for it}."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from fwbench.frameworks.jax import precision

    rng = np.random.default_rng(0)

    def array(*shape: int) -> Any:
        return jnp.asarray(rng.standard_normal(shape, dtype=np.float32))

    x, w, g = array(TOKENS, HIDDEN), array(HIDDEN, FFN), array(TOKENS, FFN)
    q, k, v, c = (array(BATCH, SEQ, HEADS, HIDDEN // HEADS) for _ in range(4))
    mask = jnp.ones((BATCH, 1, 1, SEQ), bool)

    def dense(x: Any, w: Any) -> Any:
        return precision.matmul(x, w)

    def attention(q: Any, k: Any, v: Any) -> Any:
        return precision.attention(q, k, v, mask)

    def backward(function: Callable[..., Any]) -> Callable[..., Any]:
        """function's forward and the gradients of its operands for the last argument, the cotangent (an argument,
        not a constant: XLA would fold a constant cotangent's cast into float32)."""

        def forward_backward(*operands: Any) -> Any:
            out, pullback = jax.vjp(function, *operands[:-1])
            return pullback(operands[-1].astype(out.dtype))

        return forward_backward

    operands = {"x": x, "w": w, "g": g, "q": q, "k": k, "v": v, "c": c}

    def compile_under(dtype: str, function: Callable[..., Any]) -> Callable[..., Any]:
        return jax.jit(precision.scoped(dtype, function))

    return policy_calls(dense, attention, backward, operands, compile_under, _jax_call)


def tensorflow_cases() -> Calls:
    """As :func:`jax_cases`, in TensorFlow with XLA (attention operands (8, 12, 128, 64), TF's layout)."""
    import numpy as np
    import tensorflow as tf

    from fwbench.frameworks.tensorflow import precision

    rng = np.random.default_rng(0)

    def tensor(*shape: int) -> Any:
        return tf.constant(rng.standard_normal(shape, dtype=np.float32))

    x, w, g = tensor(TOKENS, HIDDEN), tensor(HIDDEN, FFN), tensor(TOKENS, FFN)
    q, k, v, c = (tensor(BATCH, HEADS, SEQ, HIDDEN // HEADS) for _ in range(4))
    mask = tf.zeros((BATCH, 1, 1, SEQ))
    scale = 1.0 / float(np.sqrt(HIDDEN // HEADS))

    def dense(x: Any, w: Any) -> Any:
        return precision.matmul(x, w)

    def attention(q: Any, k: Any, v: Any) -> Any:
        return precision.attention(q, k, v, mask, scale)

    def backward(function: Callable[..., Any]) -> Callable[..., Any]:
        """As in :func:`jax_cases`: the cotangent is the last argument."""

        def forward_backward(*operands: Any) -> Any:
            inputs = operands[:-1]
            with tf.GradientTape() as tape:
                tape.watch(inputs)
                out = function(*inputs)
            return tape.gradient(out, inputs, output_gradients=tf.cast(operands[-1], out.dtype))

        return forward_backward

    operands = {"x": x, "w": w, "g": g, "q": q, "k": k, "v": v, "c": c}

    def compile_under(dtype: str, function: Callable[..., Any]) -> Callable[..., Any]:
        return tf.function(precision.scoped(dtype, function, xla=True), jit_compile=True)

    return policy_calls(dense, attention, backward, operands, compile_under, _tensorflow_call)


def ratio_of_medians(calls: dict[str, Callable[[], Any]], repeats: int) -> tuple[float, float]:
    """(fp32 median s, bf16 median s), the two calls alternating after one warm-up call each."""
    for call in calls.values():
        call()
    times: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for _ in range(repeats):
        for dtype, call in calls.items():
            start = time.perf_counter()
            call()
            times[dtype].append(time.perf_counter() - start)
    return statistics.median(times["fp32"]), statistics.median(times["bf16"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--framework", choices=("jax", "tensorflow", "both"), default="both")
    parser.add_argument("--calls", type=int, default=20, help="timed calls per policy and case (default 20)")
    parser.add_argument("--threads", type=int, default=2, help="thread budget, as fwbench run --threads")
    args = parser.parse_args()
    os.environ.update(thread_environment(args.threads, 1))
    os.sched_setaffinity(0, environment.cpus_one_per_core()[: args.threads])
    flags = environment.cpu_simd_flags()
    print(f"CPU bf16 units: {', '.join(f for f in ('avx512_bf16', 'amx_bf16') if f in flags) or 'none'}")
    frameworks = ("jax", "tensorflow") if args.framework == "both" else (args.framework,)
    print("| framework | case | fp32 | bf16 | fp32/bf16 |\n|---|---|---|---|---|")
    for framework in frameworks:
        label = "jax:jit" if framework == "jax" else "tensorflow:xla"
        backend = create_backend(label, "cpu", Settings(threads=args.threads))
        backend.configure_threads(args.threads, 1)
        backend.configure_precision()  # fp32's full-precision matmuls; the bf16 policy casts explicitly
        cases = jax_cases() if framework == "jax" else tensorflow_cases()
        for name, calls in cases.items():
            fp32, bf16 = ratio_of_medians(calls, args.calls)
            print(f"| {label} | {name} | {fp32 * 1e3:.2f} ms | {bf16 * 1e3:.2f} ms | {fp32 / bf16:.2f} |")


if __name__ == "__main__":
    main()
