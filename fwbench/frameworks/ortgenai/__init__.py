"""ONNX Runtime GenAI: ONNX Runtime's own generation loop over our exported decoder (phase generate)."""
