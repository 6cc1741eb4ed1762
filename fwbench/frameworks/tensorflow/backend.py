"""TensorFlow backend. Modes: ``eager`` (tf ops called eagerly), ``function`` (tf.function with a
fixed input signature, so the timed loop never retraces), ``xla`` (the same with
``jit_compile=True``: the whole function compiled by XLA)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from fwbench.frameworks.base import Backend
from fwbench.spec import Settings


class TensorFlowBackend(Backend):
    framework = "tensorflow"
    modes = ("eager", "function", "xla")

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
        return {"tensor_float_32_execution": tf.config.experimental.tensor_float_32_execution_enabled()}

    def make_inputs(self, arrays: dict[str, np.ndarray]) -> tuple[tf.Tensor, ...]:
        with tf.device(self._tf_device):
            return tuple(tf.identity(tf.constant(a)) for a in arrays.values())

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


def create_backend(mode: str, device: str, settings: Settings) -> TensorFlowBackend:
    return TensorFlowBackend(mode, device, settings)
