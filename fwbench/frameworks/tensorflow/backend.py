"""TensorFlow backend. Modes: ``eager`` (tf ops called eagerly), ``function`` (tf.function with a
fixed input signature, so the timed loop never retraces), ``xla`` (the same with
``jit_compile=True``: the whole function compiled by XLA), ``savedmodel`` (deployment: the model saved with
``tf.saved_model.save`` and a serving signature whose every input axis is free, as TF Serving models are
exported, then reloaded with ``tf.saved_model.load``; the reloaded ``serving_default`` signature is what is
timed, and the built model is dropped so that only the reloaded one is in memory; fp32 only).

bf16 (``dtype="bf16"``): the model is built in float32 as for fp32, then every variable is replaced by
a tf.bfloat16 copy, and float inputs are cast to tf.bfloat16 when made (integer token ids stay int32);
every op then computes in bfloat16, softmax and layer norm included (TF's bfloat16 reductions
accumulate in float32), and the outputs are bfloat16 until ``to_numpy``.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from fwbench.frameworks import get_runtime
from fwbench.frameworks.base import Backend, as_arch, as_training_arch
from fwbench.frameworks.tensorflow.weights import cast_variables
from fwbench.models.base import ModelDescription
from fwbench.spec import Settings


def tracing_counters(function: Any) -> dict[str, int]:
    """``traces``: how many times the tf.function ``function`` has traced (0 before its first call)."""
    return {"traces": int(function.experimental_get_tracing_count())}


class TensorFlowBackend(Backend):
    framework = "tensorflow"
    modes = ("eager", "function", "xla", "savedmodel")
    dtypes = ("fp32", "bf16")
    _working: tf.Module | None = None  # bf16 training: the bfloat16 copy the step computes with (build)
    mode_dtypes = {"savedmodel": ("fp32",)}
    _saved: dict[str, Any] | None = None  # savedmodel: what the export and reload cost (compile_report)

    @property
    def _float_dtype(self) -> tf.DType:
        """The dtype of the variables and float inputs."""
        return tf.bfloat16 if self.dtype == "bf16" else tf.float32

    @property
    def _tf_device(self) -> str:
        return "/GPU:0" if self.device == "cuda" else "/CPU:0"

    def configure_threads(self, intra_op: int, inter_op: int) -> dict[str, int]:
        tf.config.threading.set_intra_op_parallelism_threads(intra_op)
        tf.config.threading.set_inter_op_parallelism_threads(inter_op)
        if self.device == "cuda":
            for gpu in tf.config.list_physical_devices("GPU"):
                tf.config.experimental.set_memory_growth(gpu, True)
        return {
            "intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
            "inter_op": tf.config.threading.get_inter_op_parallelism_threads(),
        }

    def configure_precision(self) -> dict[str, object]:
        tf.config.experimental.enable_tensor_float_32_execution(False)
        report: dict[str, object] = {
            "tensor_float_32_execution": tf.config.experimental.tensor_float_32_execution_enabled()
        }
        if self.dtype == "bf16" and self.phase == "training":
            report["bf16_mechanism"] = (
                "mixed precision: float32 master variables and optimizer; the step computes "
                "with a tf.bfloat16 copy of them, refreshed after every update"
            )
        elif self.dtype == "bf16":
            report["bf16_mechanism"] = "variables and float inputs cast to tf.bfloat16 (built in float32, cast once)"
        return report

    def build(self, description: ModelDescription, weights: dict[str, np.ndarray]) -> None:
        """bf16 inference: the model's variables cast to bfloat16. bf16 training: the model stays float32 (the
        master weights) and a second, bfloat16 copy built from the same weights is what the step computes with."""
        super().build(description, weights)
        self._working = None
        if self.dtype == "bf16":
            with tf.device(self._tf_device):
                if self.phase == "training":
                    arch = as_arch(self.arch_module(description))
                    self._working = arch.build_model(description, weights, self.device)
                    cast_variables(self._working, tf.bfloat16)
                    self._share_running_statistics(description)
                else:
                    cast_variables(self.model, tf.bfloat16)

    def make_inputs(self, arrays: dict[str, np.ndarray]) -> tuple[tf.Tensor, ...]:
        """Device tensors; float arrays in the variables' dtype, integer ones (token ids) unchanged."""
        with tf.device(self._tf_device):
            tensors = (tf.constant(a) for a in arrays.values())
            return tuple(tf.identity(tf.cast(t, self._float_dtype) if t.dtype.is_floating else t) for t in tensors)

    def compile(self, inputs: Sequence[Any]) -> None:
        if self.mode == "eager":
            self._forward = self.model
            return
        if self.mode == "savedmodel":
            if self._saved is None:  # one export serves every shape: its signature leaves each axis free
                with tempfile.TemporaryDirectory(prefix="fwbench-savedmodel-") as folder:
                    self._forward = self._save_and_load(inputs, folder)  # the variables are in memory once loaded
            return
        signature = [tf.TensorSpec(t.shape, t.dtype) for t in inputs]
        self._forward = tf.function(self.model.__call__, input_signature=signature, jit_compile=self.mode == "xla")

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
        serve = tf.function(self.model.__call__, input_signature=signature)
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
        slot variables are built eagerly first, so the traced step creates no variables. bf16 (mixed precision
        with float32 master weights): the forward and backward run on the bfloat16 working copy (``build``),
        the loss is taken of float32 logits, the gradients are cast to float32 and applied to the float32
        variables, and inside the same step the working copy is refreshed from them (ResNet's running
        statistics are the float32 model's own variables, shared with the working copy)."""
        assert self.description is not None
        if self.dtype == "bf16" and self._working is None:
            raise RuntimeError("bf16 training needs a backend created with phase='training' (float32 master weights)")
        from fwbench.frameworks.keras.backend import import_keras

        import_keras("tensorflow", self.device)  # Keras 3's optimizers, on its tensorflow backend
        from fwbench.frameworks.keras.training import make_optimizer
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
        logits_of, loss_of, n_inputs = arch.training_logits, training.weighted_cross_entropy, len(inputs)
        working, working_variables, refreshed, copied_back = self._working_copy(variables, running)

        def train_step(*tensors: tf.Tensor) -> tf.Tensor:
            batch, (labels, weights) = tensors[:n_inputs], tensors[n_inputs:]
            with tf.GradientTape() as tape:
                loss = loss_of(tf.cast(logits_of(working, *batch), tf.float32), labels, weights)
            gradients = [tf.cast(tf.convert_to_tensor(g), tf.float32) for g in tape.gradient(loss, working_variables)]
            optimizer.apply_gradients(zip(gradients, variables))
            for copy, master in refreshed:  # bf16: the working copy from the updated master weights
                copy.assign(tf.cast(master, copy.dtype))
            for master, copy in copied_back:  # bf16: the running statistics the forward updated
                master.assign(tf.cast(copy, master.dtype))
            return loss

        tensors = (*inputs, *targets)
        if self.mode != "eager":
            signature = [tf.TensorSpec(t.shape, t.dtype) for t in tensors]
            train_step = tf.function(train_step, input_signature=signature, jit_compile=self.mode == "xla")
            self._forward = train_step  # what compile_counters counts the traces of
        sync = self.sync

        def step() -> tf.Tensor:
            loss = train_step(*tensors)
            sync(loss)
            return loss

        return step

    def _share_running_statistics(self, description: ModelDescription) -> None:
        """bf16 training: the working copy uses the float32 model's own running-statistics variables (ResNet's
        batch norm), so the step updates them in float32, as torch and JAX keep them."""
        from fwbench.frameworks.tensorflow.training import variable_name

        assert self._working is not None
        running = {variable_name(name) for name in description.running_statistics()}
        shared = 0
        for master, copy in zip(
            (self.model, *self.model.submodules), (self._working, *self._working.submodules), strict=True
        ):
            for attribute, value in vars(master).items():
                if isinstance(value, tf.Variable) and value.name.split(":")[0] in running:
                    setattr(copy, attribute, value)
                    shared += 1
        if shared != len(running):
            raise ValueError(f"{shared} running statistics shared with the bf16 working copy, expected {len(running)}")

    def _working_copy(
        self, variables: list[tf.Variable], running: set[str]
    ) -> tuple[
        tf.Module, list[tf.Variable], list[tuple[tf.Variable, tf.Variable]], list[tuple[tf.Variable, tf.Variable]]
    ]:
        """(the module the step computes with, its variables the gradients are taken of, (copy, master) pairs
        refreshed after the update, (master, copy) running statistics copied back). fp32: the model itself,
        ``variables``, nothing to copy. bf16: the working copy's variables matched to the master's by position (the
        running statistics are shared, ``_share_running_statistics``: nothing to copy back)."""
        if self._working is None:
            return self.model, variables, [], []
        # Both modules are built by the same code from the same weights: tf.Module lists their variables in the
        # same order (names can repeat, e.g. BERT's, so they are matched by position, names and shapes checked).
        masters, copies = self.model.variables, self._working.variables
        if [(v.name, v.shape) for v in masters] != [(v.name, v.shape) for v in copies]:
            raise ValueError("the bf16 working copy's variables are not the model's (names or shapes differ)")
        copy_of = {id(master): copy for master, copy in zip(masters, copies)}
        working_variables = [copy_of[id(v)] for v in variables]
        stats = [(v, copy_of[id(v)]) for v in masters if v.name.split(":")[0] in running and copy_of[id(v)] is not v]
        return self._working, working_variables, list(zip(working_variables, variables)), stats

    def compile_counters(self) -> dict[str, int]:
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
