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

__all__ = ["BACKENDS", "with_backend", "choose_backend", "median_ms"]

BACKENDS = ("auto", "pytorch", "onnxruntime", "compiled", "gpu")


# Precisions of the gpu backend beyond fp32/bf16: declared approximations, never chosen by "auto".
GPU_ONLY_PRECISIONS = ("fp8", "bf16-gelu-tanh")
PRECISIONS = ("fp32", "bf16") + GPU_ONLY_PRECISIONS


def add_backend_arguments(parser, default: str, what: str) -> None:
    """``--backend`` and ``--precision`` for a command line (``ctxkit predict``, ``ctxkit serve``).

    Args:
        parser: an ``argparse`` parser.
        default: the default backend.
        what: what the backend runs, for the help text (e.g. "runtime of the task endpoint").
    """
    parser.add_argument("--backend", choices=BACKENDS, default=default,
                        help=f"{what}: auto = the fastest correct one here (on CPU by timing PyTorch and a verified ONNX "
                             "export; on a GPU the gpu backend for BERT-family runs), pytorch = as loaded, onnxruntime or "
                             "compiled on CPU, gpu = bf16 GPU encoder with CUDA graphs and packed batches; the choice is "
                             f"named (see docs/deployment.md; an int8 run always uses ONNX Runtime; default: {default})")
    parser.add_argument("--precision", choices=PRECISIONS, default=None,
                        help="for --backend compiled (default fp32) or gpu (default bf16; fp8: float8 GEMMs on Hopper GPUs; "
                             "bf16-gelu-tanh: bf16 with the FFN's GELU in tanh form inside the GEMM's epilogue, a declared "
                             "approximation of BERT's erf GELU, ~10 %% faster at large batches)")


def with_backend(model: nn.Module, backend: str = "pytorch", precision: Optional[str] = None) -> Tuple[nn.Module, str]:
    """``(model, description)`` for ``backend``.

    Args:
        model: from :func:`ctxkit.tasks.load_run` (PyTorch, or ONNX Runtime for an int8 run).
        backend: "auto" (see :func:`choose_backend`), "pytorch" (as loaded), "onnxruntime" (exported now, checked against
            PyTorch within 1e-4), "compiled" (:class:`~ctxkit.inference.cpu_compile.CompiledCPUModel`)
            or "gpu" (:class:`~ctxkit.inference.gpu.GPUTaskModel`, on the current CUDA device).
        precision: "fp32" or "bf16" for the compiled (default fp32) and gpu (default bf16)
            backends; "fp8" for the gpu backend (float8 matrix products, a declared
            precision: :mod:`ctxkit.inference.fp8`) and "bf16-gelu-tanh" (bf16 with the
            feed-forward GELU in tanh form inside the fc1 GEMM: ``GPUEncoder(gelu_epilogue=True)``).

    Raises:
        ValueError: an unknown backend, or one that cannot run this model.
    """
    from .export import OrtTaskModel, export_onnx, verify_onnx

    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "auto":
        return choose_backend(model, precision)
    if isinstance(model, OrtTaskModel):
        if backend == "compiled":
            raise ValueError("this run is an exported ONNX model (ctxkit quantize): it runs on ONNX Runtime only")
        return model, f"ONNX Runtime ({model.path.name})"
    if precision not in (None,) + PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision in GPU_ONLY_PRECISIONS and backend != "gpu":
        raise ValueError(f"{precision} is a precision of the gpu backend (GPU GEMM kernels); use --backend gpu")
    device = next(model.parameters()).device
    if backend == "gpu":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("the gpu backend needs a CUDA device; on CPU use pytorch, onnxruntime or compiled")
        if not _is_bert(model):
            raise ValueError(f"the gpu backend runs BERT-family encoders (packed batches go through BertModel); this run's "
                             f"encoder is {type(model.encoder).__name__}: use --backend pytorch on the GPU")
        from .gpu import GPUTaskModel

        precision = precision or "bf16"
        gpu = GPUTaskModel(model, dtype=torch.float32 if precision == "fp32" else torch.bfloat16, fp8=precision == "fp8",
                           gelu_epilogue=precision == "bf16-gelu-tanh")
        weights = {"fp8": "fp8 matrix products, bf16 elsewhere",
                   "bf16-gelu-tanh": "bf16 weights, tanh GELU in the fc1 GEMM epilogue"}.get(precision, f"{precision} weights")
        return gpu, f"GPU encoder ({weights}, CUDA graphs for full batches, packed flash-attention batches otherwise)"
    precision = precision or "fp32"
    if backend == "pytorch":
        return model, f"PyTorch ({device})"
    if device.type != "cpu":
        raise ValueError(f"the {backend} backend is for CPU inference; this model is on {device} (use --device cpu)")
    if backend == "onnxruntime":
        # The session holds the graph in memory, so the export is not kept on disk.
        with tempfile.TemporaryDirectory(prefix="ctxkit-onnx-") as folder:
            path = Path(folder) / "model.onnx"
            export_onnx(model, path)
            diff = verify_onnx(model, path)
            ort_model = OrtTaskModel(path)
        return ort_model, f"ONNX Runtime (fp32 export, max |ORT - PyTorch| {diff:.1e})"
    from .cpu_compile import CompiledCPUModel

    return CompiledCPUModel(model, precision), f"compiled PyTorch ({precision}, frozen weights, Inductor C++ GEMMs)"


def median_ms(fn, reps: int = 5, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` in milliseconds over ``reps`` calls, after ``warmup``
    calls (ONNX Runtime plans its memory on the first run)."""
    import statistics
    import time

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def choose_backend(model: nn.Module, precision: Optional[str] = None) -> Tuple[nn.Module, str]:
    """The fastest correct backend for ``model`` here, and a description saying which and why.

    * an exported (int8) run: ONNX Runtime, the only runtime it has;
    * a CUDA device: the GPU encoder (bf16 unless ``precision="fp32"``);
    * CPU, bf16: the compiled backend (AVX-512 BF16 GEMMs; autocast is 1.2-1.45x slower,
      docs/performance.md);
    * CPU, fp32: PyTorch and ONNX Runtime (exported and checked against PyTorch within
      1e-4) are both timed on a 4 x 64 batch and the faster is kept: which one wins depends
      on the CPU's BLAS (MKL is ~2x slower than ONNX Runtime's kernels on AMD CPUs).
    """
    import torch

    from .export import OrtTaskModel, _example_batch, _vocab_size

    if isinstance(model, OrtTaskModel):
        return with_backend(model, "onnxruntime")
    if torch.cuda.is_available() and next(model.parameters()).device.type == "cuda":
        if not _is_bert(model):
            return model, f"auto: PyTorch ({next(model.parameters()).device}; the gpu backend runs BERT-family encoders only)"
        gpu, description = with_backend(model, "gpu", precision)
        return gpu, f"auto: {description}"
    if precision in GPU_ONLY_PRECISIONS:
        raise ValueError(f"{precision} is a precision of the gpu backend (GPU GEMM kernels); this model is on the CPU")
    if (precision or "fp32") == "bf16":
        compiled, description = with_backend(model, "compiled", "bf16")
        return compiled, f"auto: {description}"
    ort, ort_description = with_backend(model, "onnxruntime")
    batch = _example_batch(_vocab_size(model), batch=4, seq=64)
    with torch.inference_mode():
        ms = {"pytorch": median_ms(lambda: model(**batch)), "onnxruntime": median_ms(lambda: ort(**batch))}
    timing = f"{ms['onnxruntime']:.1f} ms vs PyTorch {ms['pytorch']:.1f} ms on a 4x64 batch"
    if ms["onnxruntime"] <= ms["pytorch"]:
        return ort, f"auto: {ort_description}; {timing}"
    return model, f"auto: PyTorch (cpu); ONNX Runtime {timing}"


def _is_bert(model) -> bool:
    """Whether a task model's encoder is ctxkit's BertModel (what the GPU encoder packs)."""
    from ..models.bert import BertModel

    return isinstance(getattr(model, "encoder", None), BertModel)
