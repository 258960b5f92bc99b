"""Pick the runtime behind a loaded task model: PyTorch, ONNX Runtime or compiled PyTorch.

All three keep the task models' interface (``model(input_ids=...)["logits"]``), so
``predict`` and ``evaluate`` run unchanged; ``benchmarks/inference_cpu.py`` measures which
is fastest per precision on a machine (docs/performance.md).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Tuple

from torch import nn

__all__ = ["BACKENDS", "with_backend"]

BACKENDS = ("pytorch", "onnxruntime", "compiled")


def with_backend(model: nn.Module, backend: str = "pytorch", precision: str = "fp32") -> Tuple[nn.Module, str]:
    """``(model, description)`` for ``backend``.

    Args:
        model: from :func:`ctxkit.tasks.load_run` (PyTorch, or ONNX Runtime for an int8 run).
        backend: "pytorch" (as loaded), "onnxruntime" (exported now, checked against
            PyTorch within 1e-4) or "compiled" (:class:`~ctxkit.inference.cpu_compile.CompiledCPUModel`).
        precision: "fp32" or "bf16" for the compiled backend.

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
    device = next(model.parameters()).device
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
