"""JAX backend. Modes: ``jit`` (``jax.jit`` of the model's pure ``apply(params, *inputs)``).

XLA reads its flags once, when jax initialises its first backend, so this module sets them before
it imports jax (the worker imports it only after the manager has put the thread budget in
``OMP_NUM_THREADS`` and pinned the process to that many CPUs). XLA:CPU ignores OMP/MKL variables:
its intra-op thread pool is sized by the CPUs the process may run on, so the CPU pinning is what
bounds it; with a budget of one thread ``--xla_cpu_multi_thread_eigen=false`` also keeps Eigen's
kernels single-threaded. (The folklore token ``intra_op_parallelism_threads=N`` is not an XLA flag:
XLA ignores it after a ``--`` flag and dies taking it for a flags file when it comes first.)
JAX dispatch is asynchronous: ``sync`` blocks on every output leaf.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

MULTI_THREAD_EIGEN_FLAG = "--xla_cpu_multi_thread_eigen"


def _xla_flags(existing: str, threads: int | None) -> str:
    """``existing`` XLA_FLAGS plus the single-thread flag when the budget is one thread (a flag the
    user already set wins)."""
    flags = existing.split()
    if threads == 1 and not any(f.startswith(MULTI_THREAD_EIGEN_FLAG) for f in flags):
        flags.append(f"{MULTI_THREAD_EIGEN_FLAG}=false")
    return " ".join(flags)


def _budget_from_environment() -> int | None:
    try:
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    except (KeyError, ValueError):
        return None


_THREADS_AT_IMPORT = _budget_from_environment()
os.environ["XLA_FLAGS"] = _xla_flags(os.environ.get("XLA_FLAGS", ""), _THREADS_AT_IMPORT)
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # GPU: allocate as needed, like TF's memory growth

import jax  # noqa: E402  (after the XLA environment above)
import jaxlib  # noqa: E402
import numpy as np  # noqa: E402

from fwbench.frameworks.base import Backend  # noqa: E402
from fwbench.frameworks.jax.weights import jax_device  # noqa: E402
from fwbench.spec import Settings  # noqa: E402


class JaxBackend(Backend):
    framework = "jax"
    modes = ("jit",)

    @property
    def _device(self) -> jax.Device:
        return jax_device(self.device)

    def configure_threads(self, intra_op: int, inter_op: int) -> dict[str, Any]:
        # Nothing can be changed once jax is imported: report what is in force. Initialising the
        # backend here sizes XLA:CPU's intra-op pool by the CPUs this process may use now (its pinning).
        platform = self._device.platform
        return {
            "intra_op": len(os.sched_getaffinity(0)),
            "inter_op": 1,  # XLA:CPU has no separately sized inter-op pool
            "budget_at_import": _THREADS_AT_IMPORT or 0,  # OMP_NUM_THREADS when this module was imported
            "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "platform": platform,
        }

    def configure_precision(self) -> dict[str, object]:
        jax.config.update("jax_default_matmul_precision", "highest")
        return {"jax_default_matmul_precision": jax.config.jax_default_matmul_precision}

    def make_inputs(self, arrays: dict[str, np.ndarray]) -> tuple[jax.Array, ...]:
        device = self._device
        return tuple(jax.block_until_ready(jax.device_put(a, device)) for a in arrays.values())

    def compile(self, inputs: Sequence[Any]) -> None:
        # Parameters are an argument, not closed over: the compiled program takes them as inputs
        # (as every other framework's weights are) instead of folding them in as constants.
        # Tracing and XLA compilation happen at the first call.
        self._params = self.model.params
        self._forward = jax.jit(self.model.apply)

    def infer(self, inputs: Sequence[Any]) -> tuple[jax.Array, ...]:
        return self._forward(self._params, *inputs)

    def sync(self, outputs: Any) -> None:
        jax.block_until_ready(outputs)  # every leaf: a jitted call returns before it finishes

    def to_numpy(self, outputs: Sequence[jax.Array]) -> dict[str, np.ndarray]:
        assert self.description is not None
        return {name: np.asarray(t, dtype=np.float32) for name, t in zip(self.description.output_names, outputs)}

    def memory_stats(self) -> dict[str, int | None]:
        stats = self._device.memory_stats() if self.device == "cuda" else None
        if stats and "peak_bytes_in_use" in stats:  # process-wide peak: JAX has no way to reset it
            return {"allocator_peak_bytes": int(stats["peak_bytes_in_use"])}
        return {"allocator_peak_bytes": None}

    def versions(self) -> dict[str, str]:
        return {"jax": jax.__version__, "jaxlib": jaxlib.__version__}

    def is_oom(self, exc: BaseException) -> bool:
        return super().is_oom(exc) or (
            isinstance(exc, jax.errors.JaxRuntimeError) and "RESOURCE_EXHAUSTED" in str(exc)
        )


def create_backend(mode: str, device: str, settings: Settings) -> JaxBackend:
    return JaxBackend(mode, device, settings)
