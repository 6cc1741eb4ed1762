"""TensorFlow backend. Modes: ``eager`` (tf ops called eagerly), ``function`` (tf.function with a
fixed input signature, so the timed loop never retraces), ``xla`` (the same with
``jit_compile=True``: the whole function compiled by XLA), ``savedmodel`` (deployment: the model saved with
``tf.saved_model.save`` and a serving signature whose every input axis is free, as TF Serving models are
exported, then reloaded with ``tf.saved_model.load``; the reloaded ``serving_default`` signature is what is
timed, and the built model is dropped so that only the reloaded one is in memory; fp32 only).

bf16 (``dtype="bf16"``): fwbench's mixed-precision policy (fwbench.precision), applied by the model code
through ``fwbench.frameworks.tensorflow.precision`` on every eager call and while tf.function traces: the
variables and float inputs stay float32, matmul / conv / attention operands are cast to tf.bfloat16, softmax,
layer norms and batch-norm statistics compute in float32. Training takes the gradients of the float32
variables through the casts (no bfloat16 copy of the weights).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
import tensorflow as tf
from tensorflow.python.util import _pywrap_util_port  # IsMklEnabled: whether TF runs its oneDNN kernels

from fwbench.frameworks.base import Backend, Decoder
from fwbench.frameworks.keras3 import import_keras
from fwbench.frameworks.registry import get_runtime
from fwbench.frameworks.roles import as_training_arch
from fwbench.frameworks.tensorflow import precision
from fwbench.frameworks.tensorflow.tracing import tracing_counters
from fwbench.spec import Settings


class TensorFlowBackend(Backend):
    framework = "tensorflow"
    # multiworker: phase training as one of N workers (distributed.py)
    modes: ClassVar[tuple[str, ...]] = ("eager", "function", "xla", "savedmodel", "multiworker")
    _strategy: Any = None  # multiworker: the MultiWorkerMirroredStrategy, created with the thread settings
    _saved: dict[str, Any] | None = None  # savedmodel: what the export and reload cost (compile_report)

    @property
    def _tf_device(self) -> str:
        return "/GPU:0" if self.device == "cuda" else "/CPU:0"

    def configure_threads(self, intra_op: int, inter_op: int) -> dict[str, int]:
        tf.config.threading.set_intra_op_parallelism_threads(intra_op)
        tf.config.threading.set_inter_op_parallelism_threads(inter_op)
        if self.device == "cuda":
            for gpu in tf.config.list_physical_devices("GPU"):
                tf.config.experimental.set_memory_growth(gpu, True)
        if self.mode == "multiworker":  # before any other TensorFlow op
            from fwbench.frameworks.tensorflow import distributed

            self._strategy = distributed.create_strategy()
        return {
            "intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
            "inter_op": tf.config.threading.get_inter_op_parallelism_threads(),
        }

    def configure_precision(self) -> dict[str, object]:
        tf.config.experimental.enable_tensor_float_32_execution(False)
        report: dict[str, object] = {
            "tensor_float_32_execution": tf.config.experimental.tensor_float_32_execution_enabled(),
            # TensorFlow's own (non-XLA) kernels: oneDNN's where on (by default only on CPUs with VNNI, AVX512_BF16
            # or AMX; TF_ENABLE_ONEDNN_OPTS overrides), else Eigen's. bf16 speed differs greatly between the two.
            "onednn_ops": bool(_pywrap_util_port.IsMklEnabled()),
        }
        if self.dtype == "bf16":
            report["bf16_mechanism"] = (
                "fwbench mixed precision: float32 variables and inputs; matmul/conv/attention operands cast to "
                "tf.bfloat16 in the model code (fwbench.frameworks.tensorflow.precision), softmax, layer norm and "
                "batch-norm statistics in float32"
            )
        return report

    @property
    def _call(self) -> Callable[..., Any]:
        """The model's forward under this cell's precision policy."""
        return precision.scoped(self.dtype, self.model.__call__, xla=self.mode == "xla")

    def make_inputs(self, arrays: dict[str, np.ndarray]) -> tuple[tf.Tensor, ...]:
        """Device tensors, as they are (float32 in every dtype: the model code casts what the policy casts)."""
        with tf.device(self._tf_device):
            return tuple(tf.identity(tf.constant(a)) for a in arrays.values())

    def observe_precision(self, inputs: Sequence[Any]) -> dict[str, list[str]] | None:
        """The op classes' dtypes in the graph that was timed (function, xla: the compiled forward's concrete
        function at ``inputs``), else in the graph tf.function traces of the forward under the policy (eager: the
        ops it runs one by one; training: the step's forward). None for savedmodel (a reloaded signature)."""
        if self.model is None:
            return None
        compiled: Any = getattr(self, "_forward", None)  # the tf.function compile() made, once compiled
        if self.phase == "inference" and self.mode in ("function", "xla") and compiled is not None:
            return precision.graph_dtypes(compiled.get_concrete_function(*inputs).graph)
        return precision.observed_dtypes(self._call, inputs)

    def compile(self, inputs: Sequence[Any]) -> None:
        if self.mode == "eager":
            self._forward = self._call
            return
        if self.mode == "savedmodel":
            if self._saved is None:  # one export serves every shape: its signature leaves each axis free
                with tempfile.TemporaryDirectory(prefix="fwbench-savedmodel-") as folder:
                    self._forward = self._save_and_load(inputs, folder)  # the variables are in memory once loaded
            return
        self._forward = self._as_program(self._call, inputs)

    def save_artefact(self, inputs: Sequence[Any], path: str) -> dict[str, Any]:
        """savedmodel: the SavedModel folder written to ``path`` and reloaded from there."""
        if self.mode != "savedmodel":
            return super().save_artefact(inputs, path)
        self._forward = self._save_and_load(inputs, path)
        return self.compile_report()

    def _save_and_load(self, inputs: Sequence[tf.Tensor], folder: str) -> Callable[..., tuple[tf.Tensor, ...]]:
        """Save the model to ``folder`` with a ``serving_default`` signature (inputs ``input_0``.. of the inputs'
        dtypes and ranks, every axis None), reload it, and return a call of the reloaded signature giving the
        outputs in order."""
        signature = [tf.TensorSpec([None] * t.shape.rank, t.dtype, name=f"input_{i}") for i, t in enumerate(inputs)]
        serve = tf.function(self._call, input_signature=signature)
        started = time.perf_counter()
        tf.saved_model.save(self.model, folder, signatures={"serving_default": serve.get_concrete_function()})
        saved_at = time.perf_counter()
        size = sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(folder) for f in files)
        with tf.device(self._tf_device):  # the restored variables on the cell's device, as the built ones were
            loaded = tf.saved_model.load(folder)
        serving = loaded.signatures["serving_default"]
        self._saved = {
            "export_s": saved_at - started,
            "load_s": time.perf_counter() - saved_at,
            "artefact_bytes": size,
            "artefact": get_runtime("tensorflow:savedmodel").artefact,
            "signature": "serving_default: "
            + ", ".join(f"{s.name} {s.dtype.name}[rank {s.shape.rank}]" for s in signature),
        }
        self._loaded = loaded  # the signature's functions hold the restored variables; keep them alive
        self.model = None  # only the reloaded model stays in memory, as in a serving process
        outputs = sorted(serving.structured_outputs, key=lambda name: int(name.rsplit("_", 1)[1]))
        names = [spec.name for spec in signature]

        def call(*tensors: tf.Tensor) -> tuple[tf.Tensor, ...]:
            result = serving(**dict(zip(names, tensors)))
            return tuple(result[name] for name in outputs)

        return call

    def infer(self, inputs: Sequence[Any]) -> tuple[tf.Tensor, ...]:
        return self._forward(*inputs)

    def checkpoints(self, inputs: Sequence[Any]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The model called with a checkpoint collector under the cell's precision policy: eagerly (eager), or as
        a tf.function of the cell's input signature (function; ``jit_compile=True`` for xla) returning the
        checkpoints as extra outputs of the compiled program; one call. savedmodel and multiworker: the base
        class's NotImplementedError."""
        if self.mode not in ("eager", "function", "xla"):
            return super().checkpoints(inputs)
        model = self.model

        def tapped(*tensors: tf.Tensor) -> tuple[Any, dict[str, tf.Tensor]]:
            taps: dict[str, tf.Tensor] = {}
            return model(*tensors, taps=taps), taps

        outputs, taps = self._as_program(precision.scoped(self.dtype, tapped, xla=self.mode == "xla"), inputs)(*inputs)
        captured = {name: tf.cast(t, tf.float32).numpy() for name, t in taps.items()}
        return self.to_numpy(outputs), self.canonical_checkpoints(captured)

    def sync(self, outputs: Any) -> None:
        if self.device == "cuda":
            tf.test.experimental.sync_devices()

    def to_numpy(self, outputs: Sequence[tf.Tensor]) -> dict[str, np.ndarray]:
        assert self.description is not None
        return {name: np.asarray(t, dtype=np.float32) for name, t in zip(self.description.output_names, outputs)}

    def make_targets(self, arrays: dict[str, np.ndarray]) -> tuple[tf.Tensor, ...]:
        """(labels int32, label_weights float32) on the device: the loss is float32 in every dtype."""
        with tf.device(self._tf_device):
            return tuple(tf.identity(tf.constant(a)) for a in arrays.values())

    def make_train_step(self, inputs: Sequence[Any], targets: Sequence[Any]) -> Callable[[], object]:
        """The step: forward + loss under ``tf.GradientTape``, gradients of the trained variables (made
        dense: the embedding gather's IndexedSlices become a full gradient, as in torch and JAX), then a
        Keras 3 optimizer's ``apply_gradients``. eager: called eagerly; function: one tf.function with the
        cell's input signature; xla: the same with ``jit_compile=True`` (one XLA program). The optimizer's
        slot variables are built eagerly first, so the traced step creates no variables. bf16: the forward runs
        under the mixed-precision policy on the float32 variables (the master weights, cast at each matmul /
        conv), the loss is taken of float32 logits, and the gradients, float32 through the casts, are applied to
        the float32 variables."""
        assert self.description is not None
        import_keras("tensorflow", self.device)  # Keras 3's optimizers, on its tensorflow backend
        from fwbench.frameworks.keras3.optimizers import make_optimizer
        from fwbench.frameworks.tensorflow import training
        from fwbench.models.training import optimizer_spec

        arch = as_training_arch(self.arch_module())
        model = self.model
        frozen = {training.variable_name(name) for name in self.description.frozen_in_training()}
        variables = [v for v in model.trainable_variables if v.name.split(":")[0] not in frozen]
        if len(model.trainable_variables) - len(variables) != len(frozen):
            raise ValueError(f"frozen variables {sorted(frozen)} not all found among the model's variables")
        running = {training.variable_name(name) for name in self.description.running_statistics()}
        if trained_running := sorted(v.name for v in variables if v.name.split(":")[0] in running):
            raise ValueError(f"running statistics among the trainable variables: {trained_running}")
        with tf.device(self._tf_device):
            optimizer = make_optimizer(optimizer_spec(self.settings.optimizer))
            optimizer.build(variables)
        logits_of = precision.scoped(self.dtype, arch.training_logits, xla=self.mode == "xla")
        if self.mode == "multiworker":
            from fwbench.frameworks.tensorflow import distributed

            worker_step = distributed.make_train_step(
                self._strategy, logits_of, model, variables, optimizer, inputs, targets
            )
            self._forward = worker_step.traced  # type: ignore[attr-defined]
            return worker_step
        loss_of, n_inputs = training.weighted_cross_entropy, len(inputs)

        def loss_and_gradients(*tensors: tf.Tensor) -> tuple[tf.Tensor, list[tf.Tensor]]:
            batch, (labels, weights) = tensors[:n_inputs], tensors[n_inputs:]
            with tf.GradientTape() as tape:
                loss = loss_of(tf.cast(logits_of(model, *batch), tf.float32), labels, weights)
            return loss, [tf.convert_to_tensor(g) for g in tape.gradient(loss, variables)]

        def train_step(*tensors: tf.Tensor) -> tf.Tensor:
            loss, gradients = loss_and_gradients(*tensors)
            optimizer.apply_gradients(zip(gradients, variables))
            return loss

        tensors = (*inputs, *targets)
        self._gradients_of = (self._as_program(loss_and_gradients, tensors), variables, tensors)
        train_step = self._as_program(train_step, tensors)
        if self.mode != "eager":
            self._forward = train_step  # what compile_counters counts the traces of
        sync = self.sync

        def step() -> tf.Tensor:
            loss = train_step(*tensors)
            sync(loss)
            return loss

        return step

    def _as_program(self, function: Callable[..., Any], tensors: Sequence[tf.Tensor]) -> Callable[..., Any]:
        """``function`` as the mode runs it: itself (eager), or a tf.function of ``tensors``' signature (function;
        ``jit_compile=True`` for xla)."""
        if self.mode == "eager":
            return function
        signature = [tf.TensorSpec(t.shape, t.dtype) for t in tensors]
        return tf.function(function, input_signature=signature, jit_compile=self.mode == "xla")

    def gradient_arrays(self, inputs: Sequence[Any], targets: Sequence[Any]) -> tuple[object, list[np.ndarray]]:
        """eager, function, xla: the step's forward, loss and gradients (what :meth:`make_train_step` applies),
        compiled as the step is, without the update."""
        if self.mode not in ("eager", "function", "xla"):
            return super().gradient_arrays(inputs, targets)
        from fwbench.frameworks.tensorflow.weights import gradient_arrays

        self.make_train_step(inputs, targets)
        program, variables, tensors = self._gradients_of
        loss, gradients = program(*tensors)
        return loss, gradient_arrays(self.model, variables, gradients)

    def allreduce_seconds(self, elements: int, repeats: int) -> list[float]:
        if self.mode != "multiworker":
            return super().allreduce_seconds(elements, repeats)
        from fwbench.frameworks.tensorflow import distributed

        return distributed.allreduce_seconds(self._strategy, elements, repeats)

    def barrier(self) -> None:
        if self.mode != "multiworker":
            super().barrier()
        from fwbench.frameworks.tensorflow import distributed

        distributed.barrier(self._strategy)

    def make_decoder(self, batch: int, prompt_len: int, new_tokens: int) -> Decoder:
        """eager, function or xla (generate.DecodeProgram)."""
        if self.mode not in ("eager", "function", "xla"):
            return super().make_decoder(batch, prompt_len, new_tokens)
        from fwbench.frameworks.tensorflow.generate import DecodeProgram

        max_len = prompt_len + new_tokens
        self._decoder = DecodeProgram(self.arch_module(), self.model, batch, prompt_len, max_len, self.mode, self.dtype)
        return self._decoder

    def kernel_libraries(self, step: Callable[[], object], inputs: Sequence[Any]) -> list[dict[str, Any]]:
        """xla: the compiled HLO; else TensorFlow's oneDNN switch and oneDNN's verbose lines (tensorflow/kernels.py)."""
        if self.device != "cpu" or self.mode not in ("eager", "function", "xla", "savedmodel"):
            return super().kernel_libraries(step, inputs)
        from fwbench.frameworks.tensorflow import kernels

        return kernels.kernel_libraries(step, getattr(self, "_forward", None), inputs, self.mode)

    def compile_counters(self) -> dict[str, int]:
        decoder = getattr(self, "_decoder", None)
        if decoder is not None:  # phase generate: its two programs
            return dict(decoder.compile_counters())
        if self.mode in ("eager", "savedmodel"):  # the reloaded signature is a concrete function: it cannot trace
            return {}
        return tracing_counters(self._forward)

    def compile_report(self) -> dict[str, Any]:
        """savedmodel: seconds to save and to reload, the folder's size, the serving signature."""
        return dict(self._saved) if self._saved is not None else {}

    def reset_peak_memory(self) -> None:
        if self.device == "cuda":
            tf.config.experimental.reset_memory_stats("GPU:0")

    def memory_stats(self) -> dict[str, int | None]:
        if self.device == "cuda":
            return {"allocator_peak_bytes": int(tf.config.experimental.get_memory_info("GPU:0")["peak"])}
        return {"allocator_peak_bytes": None}

    def versions(self) -> dict[str, str]:
        return {"tensorflow": tf.__version__}

    def is_oom(self, exc: BaseException) -> bool:
        return super().is_oom(exc) or isinstance(exc, tf.errors.ResourceExhaustedError)


def create_backend(
    mode: str, device: str, settings: Settings, *, dtype: str = "fp32", phase: str = "inference"
) -> TensorFlowBackend:
    return TensorFlowBackend(mode, device, settings, dtype=dtype, phase=phase)
