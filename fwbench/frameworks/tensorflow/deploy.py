"""TensorFlow's side of the deployment runtimes (:class:`fwbench.frameworks.roles.OnnxExporter` and
:class:`fwbench.frameworks.roles.TfliteExporter`): our ``tf.Module`` with the canonical weights, traced as a
``tf.function`` with the cell's input signature (every shape fixed) and converted to ONNX by tf2onnx
(``onnxruntime:tensorflow``) or to a TFLite flatbuffer (``litert:tensorflow``)."""

from __future__ import annotations

from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import numpy as np
import tensorflow as tf

ONNX_OPSET = 18  # the newest opset tf2onnx 1.17 writes


def configure(threads: int) -> None:
    """The exporter traces with the cell's thread budget (TF has no reduced-precision float32 mode on the CPU)."""
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.experimental.enable_tensor_float_32_execution(False)


def _serving_function(model: Any, inputs: Sequence[np.ndarray]) -> tuple[Any, list[tf.TensorSpec]]:
    """``model.__call__`` as a tf.function of inputs ``input_0``.. with the shapes and dtypes of ``inputs``."""
    signature = [tf.TensorSpec(a.shape, tf.as_dtype(a.dtype), name=f"input_{i}") for i, a in enumerate(inputs)]
    return tf.function(model.__call__, input_signature=signature), signature


def to_onnx(model: Any, inputs: Sequence[np.ndarray], path: str) -> dict[str, Any]:
    """tf2onnx's ``convert.from_function`` of the serving function at opset :data:`ONNX_OPSET`."""
    import tf2onnx

    function, signature = _serving_function(model, inputs)
    proto, _ = tf2onnx.convert.from_function(function, input_signature=signature, opset=ONNX_OPSET)
    unconverted = unknown_onnx_ops(proto)
    if unconverted:  # tf2onnx logs these and writes the graph anyway; no engine could load it
        raise ValueError(f"tf2onnx {tf2onnx.__version__}: Tensorflow op(s) not supported: {', '.join(unconverted)}")
    with open(path, "wb") as file:
        file.write(proto.SerializeToString())
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    return {"exporter": "tf2onnx.convert.from_function", "opset": opset}


def unknown_onnx_ops(proto: Any) -> list[str]:
    """The op types of an ONNX model's default-domain nodes that ONNX does not define (sorted, once each): the
    TensorFlow ops tf2onnx left unconverted."""
    import onnx

    default = ("", "ai.onnx")
    return sorted({n.op_type for n in proto.graph.node if n.domain in default and not onnx.defs.has(n.op_type)})


def to_tflite(model: Any, inputs: Sequence[np.ndarray], path: str, quantize: bool = False) -> dict[str, Any]:
    """``tf.lite.TFLiteConverter.from_concrete_functions`` of the serving function, written to ``path``: float32 (no
    optimisation flags), or with ``quantize`` dynamic-range quantisation (``optimizations = [Optimize.DEFAULT]``
    without a representative dataset: weights stored as int8, activations quantised per call where a kernel
    takes int8, float32 elsewhere). Its signature ``serving_default`` takes ``input_0``.. and gives ``output_0``..
    in the model's output order."""
    function, _ = _serving_function(model, inputs)
    converter = tf.lite.TFLiteConverter.from_concrete_functions([function.get_concrete_function()], model)
    if quantize:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    flatbuffer = converter.convert()
    with open(path, "wb") as file:
        file.write(flatbuffer)
    how = {"exporter": "tf.lite.TFLiteConverter.from_concrete_functions"}
    if quantize:
        how["quantization"] = "dynamic range (Optimize.DEFAULT, no representative dataset): int8 weights"
    return how


def versions() -> dict[str, str]:
    """TensorFlow's, and tf2onnx's where installed (read from its metadata: nothing imported)."""
    try:
        return {"tensorflow": tf.__version__, "tf2onnx": version("tf2onnx")}
    except PackageNotFoundError:  # litert:tensorflow needs no tf2onnx
        return {"tensorflow": tf.__version__}
