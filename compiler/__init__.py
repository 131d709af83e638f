"""ONNX -> fused, quantized graph -> register-command tasks -> model file."""
