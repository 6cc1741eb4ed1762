"""TensorFlow backend. Modes: ``eager`` (tf ops called eagerly), ``function`` (tf.function with a
fixed input signature, so the timed loop never retraces), ``xla`` (the same with
``jit_compile=True``: the whole function compiled by XLA).

bf16 (``dtype="bf16"``): the model is built in float32 as for fp32, then every variable is replaced by
a tf.bfloat16 copy, and float inputs are cast to tf.bfloat16 when made (integer token ids stay int32);
every op then computes in bfloat16, softmax and layer norm included (TF's bfloat16 reductions
accumulate in float32), and the outputs are bfloat16 until ``to_numpy``.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from fwbench.frameworks.base import Backend
from fwbench.frameworks.tensorflow.weights import cast_variables
from fwbench.models.base import ModelDescription
from fwbench.spec import Settings


def tracing_counters(function: Any) -> dict[str, int]:
    """``traces``: how many times the tf.function ``function`` has traced (0 before its first call)."""
    return {"traces": int(function.experimental_get_tracing_count())}


class TensorFlowBackend(Backend):
    framework = "tensorflow"
    modes = ("eager", "function", "xla")
    dtypes = ("fp32", "bf16")

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
            "tensor_float_32_execution": tf.config.experimental.tensor_float_32_execution_enabled()}
        if self.dtype == "bf16":
            report["bf16_mechanism"] = "variables and float inputs cast to tf.bfloat16 (built in float32, cast once)"
        return report

    def build(self, description: ModelDescription, weights: dict[str, np.ndarray]) -> None:
        super().build(description, weights)
        if self.dtype == "bf16":
            with tf.device(self._tf_device):
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
        signature = [tf.TensorSpec(t.shape, t.dtype) for t in inputs]
        self._forward = tf.function(self.model.__call__, input_signature=signature, jit_compile=self.mode == "xla")

    def infer(self, inputs: Sequence[Any]) -> tuple[tf.Tensor, ...]:
        return self._forward(*inputs)

    def sync(self, outputs: Any) -> None:
        if self.device == "cuda":
            tf.test.experimental.sync_devices()

    def to_numpy(self, outputs: Sequence[tf.Tensor]) -> dict[str, np.ndarray]:
        assert self.description is not None
        return {name: np.asarray(t, dtype=np.float32) for name, t in zip(self.description.output_names, outputs)}

    def compile_counters(self) -> dict[str, int]:
        if self.mode == "eager":
            return {}
        return tracing_counters(self._forward)

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


def create_backend(mode: str, device: str, settings: Settings, *, dtype: str = "fp32") -> TensorFlowBackend:
    return TensorFlowBackend(mode, device, settings, dtype=dtype)
