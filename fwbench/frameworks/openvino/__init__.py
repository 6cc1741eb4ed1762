"""OpenVINO: the engine running torch's ONNX export of our models (``openvino:torch``)."""
