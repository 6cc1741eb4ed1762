"""JAX backend. Modes: ``jit`` (``jax.jit`` of the model's pure ``apply(params, *inputs)``).

XLA reads its flags once, when jax initialises its first backend, so this module sets them before
it imports jax (the worker imports it only after the manager has put the thread budget in
``OMP_NUM_THREADS`` and pinned the process to that many CPUs). XLA:CPU ignores OMP/MKL variables:
its intra-op thread pool is sized by the CPUs the process may run on, so the CPU pinning is what
bounds it; with a budget of one thread ``--xla_cpu_multi_thread_eigen=false`` also keeps Eigen's
kernels single-threaded. (The folklore token ``intra_op_parallelism_threads=N`` is not an XLA flag:
XLA ignores it after a ``--`` flag and dies taking it for a flags file when it comes first.)
JAX dispatch is asynchronous: ``sync`` blocks on every output leaf.

bf16 (``dtype="bf16"``): fwbench's mixed-precision policy (fwbench.precision), applied by the model code
through ``fwbench.frameworks.jax.precision`` while jit traces it: the parameters and float inputs stay float32,
matmul / conv / attention operands are cast to bfloat16, layer norms and batch-norm statistics compute in
float32. Inference and training trace the same casts; gradients reach the float32 parameters through them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

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
import jax.numpy as jnp  # noqa: E402
import jaxlib  # noqa: E402
import numpy as np  # noqa: E402

from fwbench.frameworks.base import Backend, Decoder  # noqa: E402
from fwbench.frameworks.jax import precision  # noqa: E402
from fwbench.frameworks.jax.weights import jax_device  # noqa: E402
from fwbench.spec import Settings  # noqa: E402

# Compile health: JAX reports every trace and every XLA compilation of the process as a monitoring event.
_TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_EVENT_COUNTS = {_TRACE_EVENT: 0, _COMPILE_EVENT: 0}


def _count_event(event: str, duration_secs: float, **kwargs: str | int) -> None:
    if event in _EVENT_COUNTS:
        _EVENT_COUNTS[event] += 1


jax.monitoring.register_event_duration_secs_listener(_count_event)


def compile_counters() -> dict[str, int]:
    """Process-wide counts since import: ``traces`` (jaxprs traced, i.e. jit cache misses) and
    ``compiles`` (XLA programs compiled)."""
    return {"traces": _EVENT_COUNTS[_TRACE_EVENT], "compiles": _EVENT_COUNTS[_COMPILE_EVENT]}


class JaxBackend(Backend):
    framework = "jax"
    # distributed: phase training as one of N processes (distributed.py)
    modes: ClassVar[tuple[str, ...]] = ("jit", "distributed")

    def __init__(
        self, mode: str, device: str, settings: Settings, *, dtype: str = "fp32", phase: str = "inference"
    ) -> None:
        super().__init__(mode, device, settings, dtype=dtype, phase=phase)
        if mode == "distributed":  # before anything starts a JAX backend
            from fwbench.frameworks.jax import distributed

            distributed.initialize()

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
        report: dict[str, object] = {"jax_default_matmul_precision": jax.config.jax_default_matmul_precision}  # type: ignore[attr-defined]
        if self.dtype == "bf16":
            report["bf16_mechanism"] = (
                "fwbench mixed precision: float32 parameters and inputs; matmul/conv/attention operands cast to "
                "jnp.bfloat16 in the model code (fwbench.frameworks.jax.precision), layer norm and batch-norm "
                "statistics in float32"
            )
        return report

    def make_inputs(self, arrays: dict[str, np.ndarray]) -> tuple[jax.Array, ...]:
        """Device arrays, as they are (float32 in every dtype: the model code casts what the policy casts);
        distributed: ``arrays`` are this process's rows of global arrays sharded over the processes."""
        if self.mode == "distributed":
            from fwbench.frameworks.jax import distributed

            return tuple(jax.block_until_ready(distributed.global_batch(a)) for a in arrays.values())
        device = self._device
        return tuple(jax.block_until_ready(jax.device_put(a, device)) for a in arrays.values())

    def compile(self, inputs: Sequence[Any]) -> None:
        # Parameters are an argument, not closed over: the compiled program takes them as inputs
        # (as every other framework's weights are) instead of folding them in as constants.
        # Tracing and XLA compilation happen at the first call.
        self._params = self.model.params
        self._forward = jax.jit(precision.scoped(self.dtype, self.model.apply))

    def observe_precision(self, inputs: Sequence[Any]) -> dict[str, list[str]] | None:
        """The op classes' dtypes in the jaxpr of the jitted forward that was timed (inference, once compiled),
        else of the model's forward traced under this cell's policy (training: the step's forward)."""
        if self.phase == "inference" and getattr(self, "_forward", None) is not None:
            return precision.observed_dtypes(self._forward, self._params, *inputs)
        return precision.observed_dtypes(precision.scoped(self.dtype, self.model.apply), self.model.params, *inputs)

    def infer(self, inputs: Sequence[Any]) -> tuple[jax.Array, ...]:
        return self._forward(self._params, *inputs)

    def checkpoints(self, inputs: Sequence[Any]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """jit: ``jax.jit`` of the model's forward called with a checkpoint collector under the cell's precision
        policy, the checkpoints extra outputs of the compiled program, called once with the compiled parameters.
        distributed: the base class's NotImplementedError."""
        if self.mode != "jit":
            return super().checkpoints(inputs)
        apply = self.model.apply
        order: list[str] = []  # the names in forward order (a returned dict comes back with its keys sorted)

        def tapped(params: Any, *x: jax.Array) -> tuple[Any, dict[str, jax.Array]]:
            taps: dict[str, jax.Array] = {}
            outputs = apply(params, *x, taps=taps)
            order[:] = taps
            return outputs, taps

        outputs, taps = jax.jit(precision.scoped(self.dtype, tapped))(self._params, *inputs)
        captured = {name: np.asarray(taps[name], dtype=np.float32) for name in order}
        return self.to_numpy(outputs), self.canonical_checkpoints(captured)

    def make_decoder(self, batch: int, prompt_len: int, new_tokens: int) -> Decoder:
        """jit (generate.DecodeProgram)."""
        if self.mode != "jit":
            return super().make_decoder(batch, prompt_len, new_tokens)
        max_len = prompt_len + new_tokens
        from fwbench.frameworks.jax.generate import DecodeProgram

        return DecodeProgram(self.arch_module(), self.model, batch, max_len, self.dtype, self._device)

    def sync(self, outputs: Any) -> None:
        jax.block_until_ready(outputs)  # every leaf: a jitted call returns before it finishes

    def to_numpy(self, outputs: Sequence[jax.Array]) -> dict[str, np.ndarray]:
        assert self.description is not None
        return {name: np.asarray(t, dtype=np.float32) for name, t in zip(self.description.output_names, outputs)}

    def make_targets(self, arrays: dict[str, np.ndarray]) -> tuple[jax.Array, ...]:
        """(labels int32, label_weights float32) on the device: the loss is float32 in every dtype."""
        if self.mode == "distributed":
            return self.make_inputs(arrays)
        return tuple(jax.block_until_ready(jax.device_put(a, self._device)) for a in arrays.values())

    def make_train_step(self, inputs: Sequence[Any], targets: Sequence[Any]) -> Callable[[], object]:
        """One ``jax.jit`` of the whole step: ``jax.value_and_grad`` of the loss, the optax update and
        ``optax.apply_updates``; parameters, optimizer state and the model's non-trained state (ResNet's
        batch-norm running statistics, which the forward returns updated; empty for the other models) are
        donated (updated in place) and carried to the next call. The call blocks on every leaf of the new
        parameters and states and on the loss. bf16: the forward is traced under the mixed-precision policy
        (float32 parameters, the master weights, cast to bfloat16 at each matmul / conv), so the gradients,
        optimizer state and update are float32; the loss is taken of float32 logits; ResNet's running statistics
        stay float32."""
        assert self.description is not None
        import optax

        from fwbench.frameworks.jax import training
        from fwbench.models.training import optimizer_spec

        arch = self.arch_module()
        model = self.model
        params, stats = training.training_trees(arch, model)
        if len(jax.tree_util.tree_leaves(stats)) != len(self.description.running_statistics()):
            raise ValueError(
                f"{len(jax.tree_util.tree_leaves(stats))} running statistics in the training state, "
                f"expected {len(self.description.running_statistics())}"
            )
        optimizer = training.with_frozen(
            training.make_optimizer(optimizer_spec(self.settings.optimizer)),
            params,
            self.description.frozen_in_training(),
        )
        place = self._placement()
        if self.mode == "distributed":  # after with_frozen: it finds frozen leaves by identity, which placing changes
            params, stats = place(params), place(stats)  # jit: the model's own arrays, donated as they are
        loss_of = training.weighted_cross_entropy
        # (params, stats, *batch) -> (logits, updated stats), traced under the cell's precision policy
        forward = precision.scoped(self.dtype, training.training_forward(arch, model))

        def loss_fn(
            params: Any, stats: Any, batch: tuple[jax.Array, ...], labels: jax.Array, weights: jax.Array
        ) -> tuple[jax.Array, Any]:
            logits, stats = forward(params, stats, *batch)
            return loss_of(logits.astype(jnp.float32), labels, weights), stats

        def train_step(
            params: Any, state: Any, stats: Any, batch: tuple[jax.Array, ...], labels: jax.Array, weights: jax.Array
        ) -> tuple[Any, Any, Any, jax.Array]:
            (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, stats, batch, labels, weights)
            updates, state = optimizer.update(grads, state, params)
            return optax.apply_updates(params, updates), state, stats, loss

        jitted = jax.jit(train_step, donate_argnums=(0, 1, 2))
        # gradient_arrays: the step's loss and gradients, without the update (not donating: a one-off)
        self._gradients_of = (jax.jit(jax.value_and_grad(loss_fn, has_aux=True)), params, stats)
        # The state committed to the device as every returned state is (optax makes some leaves, such as
        # Adam's step count, uncommitted): otherwise the second call would compile the program again.
        carried = [params, jax.block_until_ready(place(optimizer.init(params))), stats]
        batch, (labels, weights) = tuple(inputs), targets

        def step() -> jax.Array:
            carried[0], carried[1], carried[2], loss = jitted(*carried, batch, labels, weights)
            jax.block_until_ready((carried, loss))
            return loss

        self._train_state = carried  # the current parameters, optimizer state and model state (tests read them)
        return step

    def gradient_arrays(self, inputs: Sequence[Any], targets: Sequence[Any]) -> tuple[object, list[np.ndarray]]:
        """jit: ``jax.jit(jax.value_and_grad(loss))`` of the step's loss, before the step's first update; the
        gradient leaves in :meth:`parameter_arrays` order (zeros for the model state, which has none)."""
        if self.mode != "jit":
            return super().gradient_arrays(inputs, targets)
        from fwbench.frameworks.jax.weights import parameter_arrays

        self.make_train_step(inputs, targets)
        program, params, stats = self._gradients_of
        labels, weights = targets
        (loss, _), gradients = program(params, stats, tuple(inputs), labels, weights)
        return loss, parameter_arrays((gradients, jax.tree_util.tree_map(jnp.zeros_like, stats)))

    def _placement(self) -> Callable[[Any], Any]:
        """Where the training state lives: this process's device (jit), or every process whole (distributed)."""
        if self.mode == "distributed":
            from fwbench.frameworks.jax import distributed

            return distributed.replicate
        device = self._device
        return lambda tree: jax.device_put(tree, device)

    def loss_value(self, loss: object) -> float:
        if self.mode == "distributed":  # replicated over the processes: read this process's copy
            return float(loss.addressable_data(0))  # type: ignore[attr-defined]
        return super().loss_value(loss)

    def allreduce_seconds(self, elements: int, repeats: int) -> list[float]:
        if self.mode != "distributed":
            return super().allreduce_seconds(elements, repeats)
        from fwbench.frameworks.jax import distributed

        return distributed.allreduce_seconds(elements, repeats)

    def barrier(self) -> None:
        if self.mode != "distributed":
            super().barrier()
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("fwbench-block")

    def model_arrays(self, model: Any) -> list[np.ndarray]:
        """The floating arrays of a built model, in the order :meth:`parameter_arrays` gives a trained one's:
        the training parameters, then the training state."""
        from fwbench.frameworks.jax.training import training_trees
        from fwbench.frameworks.jax.weights import parameter_arrays

        return parameter_arrays(training_trees(self.arch_module(), model))

    def parameter_arrays(self) -> list[np.ndarray]:
        """The current parameters and model state: the training state's once a train step was made, else
        the model's."""
        from fwbench.frameworks.jax.weights import parameter_arrays

        trained = getattr(self, "_train_state", None)
        if trained is None:
            return self.model_arrays(self.model)
        if self.mode == "distributed":
            from fwbench.frameworks.jax.distributed import local_copy

            return parameter_arrays(local_copy((trained[0], trained[2])))
        return parameter_arrays((trained[0], trained[2]))

    def kernel_libraries(self, step: Callable[[], object], inputs: Sequence[Any]) -> list[dict[str, Any]]:
        """jit: the compiled HLO of the timed forward (jax/kernels.py); distributed: the base class's."""
        forward = getattr(self, "_forward", None)
        if self.mode != "jit" or forward is None:
            return super().kernel_libraries(step, inputs)
        from fwbench.frameworks.jax import kernels

        return kernels.kernel_libraries(forward, (self._params, *inputs), step)

    def compile_counters(self) -> dict[str, int]:
        return compile_counters()

    def memory_stats(self) -> dict[str, int | None]:
        stats = self._device.memory_stats() if self.device == "cuda" else None
        if stats and "peak_bytes_in_use" in stats:  # process-wide peak: JAX has no way to reset it
            return {"allocator_peak_bytes": int(stats["peak_bytes_in_use"])}
        return {"allocator_peak_bytes": None}

    def versions(self) -> dict[str, str]:
        return {"jax": jax.__version__, "jaxlib": jaxlib.__version__}

    def is_oom(self, exc: BaseException) -> bool:
        return super().is_oom(exc) or (isinstance(exc, jax.errors.JaxRuntimeError) and "RESOURCE_EXHAUSTED" in str(exc))


def create_backend(
    mode: str, device: str, settings: Settings, *, dtype: str = "fp32", phase: str = "inference"
) -> JaxBackend:
    return JaxBackend(mode, device, settings, dtype=dtype, phase=phase)
