"""Pick the runtime behind a loaded task model: PyTorch, ONNX Runtime, compiled PyTorch
(CPU) or the GPU encoder (bf16, CUDA graphs, packed batches).

All three keep the task models' interface (``model(input_ids=...)["logits"]``), so
``predict`` and ``evaluate`` run unchanged; ``benchmarks/inference_cpu.py`` measures which
is fastest per precision on a machine (docs/performance.md).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Optional, Tuple

from torch import nn

__all__ = ["BACKENDS", "with_backend"]

BACKENDS = ("pytorch", "onnxruntime", "compiled", "gpu")


def with_backend(model: nn.Module, backend: str = "pytorch", precision: Optional[str] = None) -> Tuple[nn.Module, str]:
    """``(model, description)`` for ``backend``.

    Args:
        model: from :func:`ctxkit.tasks.load_run` (PyTorch, or ONNX Runtime for an int8 run).
        backend: "pytorch" (as loaded), "onnxruntime" (exported now, checked against
            PyTorch within 1e-4), "compiled" (:class:`~ctxkit.inference.cpu_compile.CompiledCPUModel`)
            or "gpu" (:class:`~ctxkit.inference.gpu.GPUTaskModel`, on the current CUDA device).
        precision: "fp32" or "bf16" for the compiled (default fp32) and gpu (default bf16) backends.

    Raises:
        ValueError: an unknown backend, or one that cannot run this model.
    """
    from .export import OrtTaskModel, export_onnx, verify_onnx

    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if isinstance(model, OrtTaskModel):
        if backend == "compiled":
            raise ValueError("this run is an exported ONNX model (ctxkit quantize): it runs on ONNX Runtime only")
        return model, f"ONNX Runtime ({model.path.name})"
    if precision not in (None, "fp32", "bf16"):
        raise ValueError(f"precision must be fp32 or bf16, got {precision!r}")
    device = next(model.parameters()).device
    if backend == "gpu":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("the gpu backend needs a CUDA device; on CPU use pytorch, onnxruntime or compiled")
        from .gpu import GPUTaskModel

        precision = precision or "bf16"
        gpu = GPUTaskModel(model, dtype=torch.bfloat16 if precision == "bf16" else torch.float32)
        return gpu, f"GPU encoder ({precision} weights, CUDA graphs for full batches, packed flash-attention batches otherwise)"
    precision = precision or "fp32"
    if backend == "pytorch":
        return model, f"PyTorch ({device})"
    if device.type != "cpu":
        raise ValueError(f"the {backend} backend is for CPU inference; this model is on {device} (use --device cpu)")
    if backend == "onnxruntime":
        path = Path(tempfile.mkdtemp(prefix="ctxkit-onnx-")) / "model.onnx"
        export_onnx(model, path)
        diff = verify_onnx(model, path)
        return OrtTaskModel(path), f"ONNX Runtime (fp32 export, max |ORT - PyTorch| {diff:.1e})"
    from .cpu_compile import CompiledCPUModel

    return CompiledCPUModel(model, precision), f"compiled PyTorch ({precision}, frozen weights, Inductor C++ GEMMs)"
