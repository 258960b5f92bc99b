"""Deployment: backends (PyTorch eager / compiled / ONNX Runtime), ONNX export and int8
quantisation, GPU and fp8 fast paths, and the HTTP server. Decoding lives in :mod:`ctxkit.decoding`."""
