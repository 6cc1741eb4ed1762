"""Keras 3 backend. Modes: ``tensorflow``, ``jax``, ``torch``: the Keras backend that runs the one Keras
implementation of each architecture (``fwbench/frameworks/keras/<arch>.py``).

Choosing the Keras backend. Keras reads ``KERAS_BACKEND`` once, when it is first imported, so this
module imports no framework at its top: :class:`KerasBackend` (made by :func:`create_backend`) sets
``KERAS_BACKEND`` from the mode (and ``KERAS_TORCH_DEVICE`` from the device), then imports keras, and
raises if keras was already imported with another backend: one process holds one Keras backend.
Before keras it creates the backend of the same framework's native runtime (the registry's
``native_runtime``: torch:eager, tensorflow:function, jax:jit) and delegates everything that is not Keras to it: the
thread budget, the matmul precision, placing the inputs, device sync, allocator statistics and OOM
detection, so that ``keras:jax`` and ``jax:jit`` (and so on) run under identical settings. For jax
that import also puts the XLA thread flags in place before jax loads. (Keras 3.15 imports jax
whatever its backend when jax is installed, for its orbax checkpoint callback; on the tensorflow and
torch backends it stays unused.)

What is timed: one step of Keras' own predict loop. ``compile`` calls ``model.compile(jit_compile=
"auto")`` and ``model.make_predict_function()``; the timed call is that compiled predict function,
called exactly as ``model.predict`` calls it once per batch, ``x`` being the dict of input tensors:

- keras:tensorflow: ``model.predict_function([(x,)])``: a ``tf.function`` (``reduce_retracing=True``)
  of the predict step; "auto" gives XLA (an inner ``tf.function(jit_compile=True)``) on a GPU and no
  XLA on a machine without one (Keras' rule), so on a CPU it is a plain tf.function graph;
- keras:jax: ``outputs, state = model.predict_function(state, iter([(x,)]))``: ``jax.jit`` of the
  stateless predict step, the variables passed (and donated) as arguments; the returned state is
  passed to the next call, as ``model.predict`` does;
- keras:torch: ``model.predict_function([(x,)])``: the predict step under ``torch.no_grad()``, eager:
  with the torch backend "auto" never selects ``torch.compile``.

Not timed: what ``model.predict_on_batch`` adds around this step (converting the outputs to numpy
and, on jax, writing the state back into the model's variables after every call) and
``model.predict``'s data adapter. ``sync`` blocks as the native backend does: on every output leaf
for jax, a device sync on CUDA; on a CPU, TF and torch kernels have finished when the call returns.

``checkpoints`` (``fwbench diff``): the arch module's ``checkpoint_model`` (the same layers and variables, the
model's outputs plus every named checkpoint, each a layer's output in the functional graph), compiled as the timed
model is and called once through ``predict_on_batch``, so jax and XLA compute the intermediates in one compiled
program; the timed predict function is untouched.

Reported in the dict ``configure_threads`` returns (stored as ``threads_effective``): ``keras_backend`` and
``jit_compile`` (what "auto" resolves to, by Keras' own resolution on a probe model; ``compile``
checks the real model resolves the same, and sets :attr:`KerasBackend.jit_compile`). The image models are
channels_last (their ``LAYOUT``, ``NHWC``, stored as the cell's layout): ``make_inputs`` transposes the
descriptions' NCHW ``pixel_values`` once, outside the timed call.

bf16 (``dtype="bf16"``): fwbench's mixed-precision policy (fwbench.precision) as Keras' ``mixed_bfloat16``
global dtype policy, set before the model is built (and reported as ``keras_dtype_policy``), with the
embeddings, layer norms and residual-stream layers given a float32 policy by the model files
(``fwbench.frameworks.keras.precision``): variables stay float32, Dense and conv layers cast their inputs and
read their variables in bfloat16. The inputs given to the model stay float32 (the first layer casts them); the
native backend is the fp32 one, since Keras, not it, does the casting.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fwbench.frameworks import registry
from fwbench.frameworks.base import Backend, Decoder
from fwbench.frameworks.keras3 import import_keras, refuse_other_backend
from fwbench.frameworks.roles import as_keras_checkpoint_arch, as_keras_training_arch
from fwbench.frameworks.tensorflow.tracing import tracing_counters
from fwbench.models.base import ModelDescription
from fwbench.spec import Settings

DTYPE_POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16"}  # case dtype -> Keras' global dtype policy
# Inputs the descriptions give channels-first (batch, C, H, W): transposed to (batch, H, W, C) in make_inputs.
_CHANNELS_FIRST_INPUTS = frozenset({"pixel_values"})


# A mode that is not a Keras backend's name runs on this Keras backend.
KERAS_BACKEND_OF = {"jax-dataparallel": "jax"}


class KerasBackend(Backend):
    framework = "keras"
    # jax-dataparallel: phase training as one of N processes, keras.distribution.DataParallel on JAX
    modes = ("tensorflow", "jax", "torch", "jax-dataparallel")

    def __init__(
        self, mode: str, device: str, settings: Settings, *, dtype: str = "fp32", phase: str = "inference"
    ) -> None:
        super().__init__(mode, device, settings, dtype=dtype, phase=phase)  # UnsupportedMode before any import
        self.keras_backend = KERAS_BACKEND_OF.get(mode, mode)
        refuse_other_backend(self.keras_backend)  # before importing a framework for nothing
        # The native runtime of the Keras backend's framework (the registry's): threads, precision, inputs, sync,
        # memory. Its fp32 backend: Keras, not it, does the bf16 casting. jax-dataparallel: jax:distributed, which
        # joins the processes before anything starts JAX.
        native = "jax:distributed" if mode == "jax-dataparallel" else registry.native_runtime(mode)
        if native is None:
            raise RuntimeError(f"the runtime registry has no native runtime of {mode} for keras:{mode}")
        self._native: Backend = registry.create_backend(native, device, settings, phase=phase)
        self.keras = import_keras(self.keras_backend, device)
        if mode == "jax-dataparallel":
            from fwbench.frameworks.keras import distributed

            distributed.set_data_parallel(self.keras)
        self.jit_compile: bool | None = None  # model.jit_compile once compiled ("auto", as Keras resolves it)
        self._jit_compile_auto: bool | None = None
        self._compiled: Any = None  # the model compile() prepared _predict for
        self._predict: Any = None
        self._output_names: tuple[str, ...] = ()
        self._state: Any = None  # keras:jax: (trainable, non-trainable) variable values, carried between calls
        self._input_names: tuple[str, ...] = ()
        self._train_model: Any = None  # phase training: the model train_on_batch trains
        self._decoder: Any = None  # phase generate: keras/generate.DecodeProgram

    # -- set-up -------------------------------------------------------------------------------
    def configure_threads(self, intra_op: int, inter_op: int) -> dict[str, Any]:
        report = dict(self._native.configure_threads(intra_op, inter_op))  # before anything starts the runtime
        self._jit_compile_auto = self._resolve_auto_jit_compile()
        report.update(keras_backend=self.keras.backend.backend(), jit_compile=self._jit_compile_auto)
        return report

    def _resolve_auto_jit_compile(self) -> bool:
        """What ``model.compile(jit_compile="auto")`` resolves to on this backend and machine: Keras' own
        resolution, on a probe model whose only layer supports XLA (as every layer used here does)."""
        from fwbench.frameworks.keras.weights import keras_device  # imports keras: only once it is loaded

        keras = self.keras
        with keras.device(keras_device(self.device)):
            x = keras.Input((1,), name="probe_input")
            probe = keras.Model(x, keras.layers.Identity(name="probe")(x), name="jit_compile_probe")
            probe.compile(jit_compile="auto")
        return bool(probe.jit_compile)

    def configure_precision(self) -> dict[str, object]:
        report = dict(self._native.configure_precision())
        self._set_dtype_policy()
        report.update(keras_floatx=self.keras.config.floatx(), keras_dtype_policy=self.keras.config.dtype_policy().name)
        if self.dtype == "bf16":
            report["bf16_mechanism"] = (
                "keras mixed_bfloat16 policy (float32 variables, bfloat16 Dense/conv compute) with float32 "
                "embeddings, layer norms and residual stream (fwbench.frameworks.keras.precision)"
            )
        return report

    def _set_dtype_policy(self) -> None:
        """Keras' global dtype policy for this cell's dtype; layers built afterwards follow it."""
        self.keras.config.set_dtype_policy(DTYPE_POLICIES[self.dtype])

    def build(self, description: ModelDescription, weights: dict[str, np.ndarray]) -> None:
        self._set_dtype_policy()  # again: another backend in this process may have set another policy
        super().build(description, weights)

    def observe_precision(self, inputs: Sequence[Any]) -> dict[str, list[str]] | None:
        """The op classes' operand dtypes in the backend's own graph of the model (keras/precision.py)."""
        from fwbench.frameworks.keras import precision

        return precision.observed_dtypes(self.model, self._input_names, inputs)

    def make_inputs(self, arrays: dict[str, np.ndarray]) -> tuple[Any, ...]:
        self._input_names = tuple(arrays)
        channels_last = {
            name: np.ascontiguousarray(a.transpose(0, 2, 3, 1)) if name in _CHANNELS_FIRST_INPUTS else a
            for name, a in arrays.items()
        }
        if self.mode == "jax-dataparallel":  # this process's rows: train_on_batch makes the global batch of them
            return tuple(channels_last.values())
        return self._native.make_inputs(channels_last)  # framework tensors on the device, as the native runtime's

    def compile(self, inputs: Sequence[Any]) -> None:
        # Once per model: a later call (the parity check, at another shape) reuses the predict function,
        # which traces again for the new shape. Tracing/compilation happens at the first call.
        model = self.model
        if self._compiled is model:
            return
        model.compile(jit_compile="auto")
        self._check_jit_compile(model)
        self.jit_compile = bool(model.jit_compile)
        model.make_predict_function()
        self._predict = model.predict_function
        if self.keras_backend == "jax":
            # The state model.predict passes: the variables' jax arrays. Each call donates it and returns
            # the next one (so, as during model.predict, which writes the state back only at its end, the
            # model's own variables are stale once the first call has run).
            self._state = self._variables_state()
        self._output_names = self.description.output_names if self.description else ()
        self._compiled = model

    def _check_jit_compile(self, model: Any) -> None:
        """RuntimeError unless ``model`` (compiled with jit_compile="auto") resolved as the probe model did."""
        if self._jit_compile_auto is None:  # configure_threads was skipped (in-process use)
            self._jit_compile_auto = self._resolve_auto_jit_compile()
        if bool(model.jit_compile) != self._jit_compile_auto:
            raise RuntimeError(
                f"jit_compile='auto' resolved to {model.jit_compile} for {model.name} but to "
                f"{self._jit_compile_auto} on the probe model reported by configure_threads"
            )

    def _variables_state(self) -> Any:
        """keras:jax: the model's variables' jax arrays as the (trainable, non-trainable) state its predict
        function takes. Committed to the device (no copy: the variables' buffers) as every returned state is: an
        uncommitted first state would make the second call compile the program again."""
        import jax

        from fwbench.frameworks.jax.weights import jax_device

        model = self.model
        return jax.device_put(
            ([v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables]),
            jax_device(self.device),
        )

    # -- the timed call -----------------------------------------------------------------------
    def infer(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
        batch = [(dict(zip(self._input_names, inputs)),)]  # the structure model.predict passes per batch
        if self.keras_backend == "jax":
            outputs, self._state = self._predict(self._state, iter(batch))
        else:
            outputs = self._predict(batch)
        return tuple(outputs[name] for name in self._output_names)

    def sync(self, outputs: Any) -> None:
        self._native.sync(outputs)

    # -- phase generate -----------------------------------------------------------------------
    def make_decoder(self, batch: int, prompt_len: int, new_tokens: int) -> Decoder:
        """The Keras backend's decode program (keras/generate.DecodeProgram): the model's own layers over a
        functional cache, compiled as the backend compiles the predict step (``jit_compile="auto"`` as Keras
        resolves it)."""
        if self.mode == "jax-dataparallel":
            return super().make_decoder(batch, prompt_len, new_tokens)
        from fwbench.frameworks.keras.generate import DecodeProgram
        from fwbench.frameworks.keras.weights import keras_device

        if self._jit_compile_auto is None:  # configure_threads was skipped (in-process use)
            self._jit_compile_auto = self._resolve_auto_jit_compile()
        self.jit_compile = self._jit_compile_auto
        with self.keras.device(keras_device(self.device)):
            self._decoder = DecodeProgram(
                self.arch_module(), self.model, batch, prompt_len + new_tokens, self.keras_backend, self.jit_compile
            )
        return self._decoder

    # -- phase training -----------------------------------------------------------------------
    def make_targets(self, arrays: dict[str, np.ndarray]) -> tuple[Any, ...]:
        if self.mode == "jax-dataparallel":  # this process's rows: train_on_batch makes the global batch of them
            return tuple(arrays.values())
        return self._native.make_inputs(arrays)  # not self.make_inputs: that records the model's input names

    def allreduce_seconds(self, elements: int, repeats: int) -> list[float]:
        return self._native.allreduce_seconds(elements, repeats)

    def barrier(self) -> None:
        self._native.barrier()

    def make_train_step(self, inputs: Sequence[Any], targets: Sequence[Any]) -> Callable[[], object]:
        """``model.train_on_batch(x, labels, sample_weight=label_weights)`` of the arch's training model (the
        same layers and variables, the training logits as its one output) after ``model.compile(optimizer,
        loss, jit_compile="auto")``: Keras' own train step, loss and optimizer, called as a user calls it;
        it returns the loss as a Python float (so it has waited for the step): train_on_batch resets the
        metrics first, so that is this step's loss, computed before its update. bf16: the model was built under
        the ``mixed_bfloat16`` policy with float32 embeddings, layer norms and residual stream (fwbench's policy,
        keras/precision.py): float32 variables and optimizer (the master weights), Dense and conv layers in
        bfloat16, the loss in float32 (a Keras loss computes in floatx)."""
        from fwbench.frameworks.keras3.optimizers import make_optimizer
        from fwbench.models.training import optimizer_spec

        model = self._training_model(make_optimizer(optimizer_spec(self.settings.optimizer)))
        self.jit_compile = bool(model.jit_compile)
        self._train_model = model
        x, (labels, weights) = dict(zip(self._input_names, inputs)), targets
        train_on_batch = model.train_on_batch

        def step() -> float:
            return train_on_batch(x, labels, sample_weight=weights)

        return step

    def _training_model(self, optimizer: Any) -> Any:
        """The arch's training model (the same layers and variables, the training logits its one output), checked
        to train the canonical tensors an optimizer updates, compiled with ``optimizer``, Keras' loss and
        ``jit_compile="auto"``."""
        assert self.description is not None
        from fwbench.frameworks.keras import training

        if self.keras_backend == "torch":
            self._make_variables_leaves()
        model = as_keras_training_arch(self.arch_module()).training_model(self.model, self.description)
        expected = self.description.trained_tensor_count()  # BN moving statistics are non-trainable variables
        if len(model.trainable_variables) != expected:
            raise ValueError(
                f"the training model has {len(model.trainable_variables)} trainable variables, expected {expected}"
            )
        model.compile(optimizer=optimizer, loss=training.loss(), jit_compile="auto")
        if self.mode == "jax":
            training.commit_jax_training_state(model, self.device)
        return model

    def gradient_arrays(self, inputs: Sequence[Any], targets: Sequence[Any]) -> tuple[object, list[np.ndarray]]:
        """Keras keeps a train step's gradients to itself, so they are read off one ``train_on_batch`` step of the
        arch's training model (Keras' own step, loss and compilation, ``jit_compile="auto"``) with plain SGD of
        learning rate 2**20 (no momentum, no decay): each trainable variable's change divided by it is its gradient
        (the power of two scales exactly; the update's float32 rounding is half an ulp of lr·g per element, a relative
        6e-8, once lr·g outweighs the variable). Zeros for the other variables (frozen, or batch norm's moving
        statistics, which the step updates without a gradient)."""
        if self.mode == "jax-dataparallel":
            return super().gradient_arrays(inputs, targets)
        from fwbench.frameworks.keras.weights import floating_variables

        rate = 2.0**20
        model = self._training_model(self.keras.optimizers.SGD(learning_rate=rate))
        variables = floating_variables(self.model)
        before = self.parameter_arrays()
        labels, weights = targets
        loss = model.train_on_batch(dict(zip(self._input_names, inputs)), labels, sample_weight=weights)
        trained = {id(v) for v in model.trainable_variables}
        changes = [
            ((old.astype(np.float64) - new) / rate).astype(np.float32) if id(v) in trained else np.zeros_like(old)
            for v, old, new in zip(variables, before, self.parameter_arrays())
        ]
        return loss, changes

    def _make_variables_leaves(self) -> None:
        """keras:torch: make each variable's torch tensor an autograd leaf again. Keras 3.15 creates a torch
        variable as ``Parameter(value).to(device)``; inside ``keras.device("cpu:0")`` (where the models are
        built) that ``.to`` is a copy, not a no-op, so the variable holds a non-leaf tensor that autograd
        gives no ``.grad`` (train_on_batch then fails with "No gradients provided for any variable"; the
        copy's graph also keeps the original tensor alive). The values are unchanged."""
        import torch

        for variable in self.model.weights:
            if not variable.value.is_leaf:
                variable._value = torch.nn.Parameter(variable.value.detach(), requires_grad=variable.trainable)

    # -- results and diagnostics --------------------------------------------------------------
    def to_numpy(self, outputs: Sequence[Any]) -> dict[str, np.ndarray]:
        assert self.description is not None
        convert = self.keras.ops.convert_to_numpy
        names = self.description.output_names
        return {name: np.asarray(convert(t), dtype=np.float32) for name, t in zip(names, outputs)}

    def checkpoints(self, inputs: Sequence[Any]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The arch's ``checkpoint_model`` (the model's layers and variables, its outputs plus every checkpoint as
        a layer's output), compiled as :meth:`compile` compiles the timed model (``jit_compile="auto"``, the same
        resolution) and called once through Keras' own ``predict_on_batch`` with the dict of inputs the timed call
        gets: on jax one jax.jit program, on tensorflow a tf.function (XLA where "auto" gives it), on torch eager.
        keras:jax first writes the state the timed calls carry back into the variables (their buffers were
        donated), and afterwards takes the state again from the variables that predict_on_batch wrote back."""
        if self.mode == "jax-dataparallel":
            return super().checkpoints(inputs)
        assert self.description is not None
        sub = as_keras_checkpoint_arch(self.arch_module()).checkpoint_model(self.model, self.description)
        sub.compile(jit_compile="auto")
        self._check_jit_compile(sub)
        carried = self.keras_backend == "jax" and self._compiled is self.model and self._state is not None
        if carried:
            trainable, non_trainable = self._state
            for variable, value in zip(self.model.trainable_variables, trainable):
                variable.assign(value)
            for variable, value in zip(self.model.non_trainable_variables, non_trainable):
                variable.assign(value)
        results = sub.predict_on_batch(dict(zip(self._input_names, inputs)))
        if carried:
            self._state = self._variables_state()  # predict_on_batch donated the variables' buffers
        outputs = {name: np.asarray(results[name], dtype=np.float32) for name in self.description.output_names}
        captured = {name: np.asarray(results[name], dtype=np.float32) for name in self.description.checkpoint_names()}
        return outputs, self.canonical_checkpoints(captured)

    def kernel_libraries(self, step: Callable[[], object], inputs: Sequence[Any]) -> list[dict[str, Any]]:
        """By the Keras backend's framework's own probe (keras/kernels.py)."""
        if self.mode == "jax-dataparallel" or self._predict is None:
            return super().kernel_libraries(step, inputs)
        from fwbench.frameworks.keras import kernels

        batch = (dict(zip(self._input_names, inputs)),)  # what infer passes the predict step per batch
        return kernels.kernel_libraries(
            self.keras_backend,
            step,
            inputs,
            self.device,
            jit_compile=self.jit_compile,
            predict=self._predict,
            state=lambda: self._state,
            batch=batch,
        )

    def compile_counters(self) -> dict[str, int]:
        if self._decoder is not None and self.keras_backend == "tensorflow":  # phase generate: its step's traces
            return self._decoder.compile_counters()
        if self.keras_backend == "tensorflow":  # model.predict_function is a tf.function (reduce_retracing=True)
            # Phase training: Keras keeps the train step's tf.function inside its train_function, out of reach.
            return tracing_counters(self._predict) if self._predict is not None else {}
        if self.keras_backend == "jax":  # every trace and XLA compilation of the process, as for jax:jit
            return self._native.compile_counters()
        return {}  # torch: the predict step runs eagerly ("auto" never picks torch.compile)

    def reset_peak_memory(self) -> None:
        self._native.reset_peak_memory()

    def memory_stats(self) -> dict[str, int | None]:
        return self._native.memory_stats()

    def versions(self) -> dict[str, str]:
        return {"keras": self.keras.__version__, **self._native.versions()}

    def is_oom(self, exc: BaseException) -> bool:
        return self._native.is_oom(exc)


def create_backend(
    mode: str, device: str, settings: Settings, *, dtype: str = "fp32", phase: str = "inference"
) -> KerasBackend:
    return KerasBackend(mode, device, settings, dtype=dtype, phase=phase)
