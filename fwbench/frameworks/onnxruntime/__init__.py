"""ONNX Runtime: the engine running another framework's ONNX export of our models (``onnxruntime:torch``,
``onnxruntime:tensorflow``)."""
