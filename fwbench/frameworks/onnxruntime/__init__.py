"""ONNX Runtime: engines running another framework's ONNX export of our models (``onnxruntime:torch``)."""
