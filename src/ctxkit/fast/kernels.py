"""Which of ctxkit's fast kernels run where: one availability registry.

Every fast variant that needs more than PyTorch (Triton, torchao, a GPU generation) asks
here, through :func:`supported`, instead of testing for packages and compute capabilities
on its own. The answer is a reason (one line a user can act on, e.g. ``needs triton (pip
install 'ctxkit[gpu]')``) or None when the kernel runs. :func:`ctxkit.fast.plan.resolve`
uses the same answers to say why ``--fast auto`` left something off.

A device is described by :class:`DeviceInfo` (type, capability, name), read from torch by
:func:`device_info`; tests pass a made-up one to see how a plan resolves on a GPU this
machine does not have.

CPU tensors never take a Triton kernel, except inside :func:`interpret_on_cpu` with
``TRITON_INTERPRET=1`` set before the kernel modules were imported (Triton reads it when a
kernel is defined): then the kernels marked ``interpreter`` run on them through Triton's
interpreter (NumPy underneath; slow). That is how the tests check the kernels on a machine
without a GPU (tests/README.md); the environment variable alone changes nothing, and
``--fast auto`` never picks a Triton kernel on a CPU (:func:`ctxkit.fast.plan.resolve`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Tuple, Union

import torch

__all__ = ["DeviceInfo", "KERNELS", "Kernel", "cached_answer", "clear_cache", "constant_result", "device_info", "has_package",
           "interpret_on_cpu", "supported"]

_HALF = (torch.float16, torch.bfloat16)
GPU_EXTRA = "pip install 'ctxkit[gpu]'"


@dataclass(frozen=True)
class DeviceInfo:
    """What the registry needs to know of a device.

    Attributes:
        type: ``"cuda"``, ``"cpu"``, ...
        capability: CUDA compute capability ``(major, minor)``; None off CUDA.
        name: the device's name, for messages (``"NVIDIA H100 80GB HBM3"``).
        index: the CUDA device index (None: the current one, or not CUDA).
    """

    type: str
    capability: Optional[Tuple[int, int]] = None
    name: str = ""
    index: Optional[int] = None

    @property
    def label(self) -> str:
        """``"NVIDIA H100 80GB HBM3 (sm 9.0)"`` or ``"cpu"``."""
        if self.type != "cuda":
            return self.type
        cc = f"sm {self.capability[0]}.{self.capability[1]}" if self.capability else "sm ?"
        return f"{self.name or 'CUDA GPU'} ({cc})"


def device_info(device: Union[str, torch.device, DeviceInfo, None] = None) -> DeviceInfo:
    """The :class:`DeviceInfo` of ``device`` (None or ``"auto"``: CUDA when available, else CPU)."""
    if isinstance(device, DeviceInfo):
        return device
    if device is None or device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type != "cuda":
        return DeviceInfo(device.type)
    if not torch.cuda.is_available():
        return DeviceInfo("cuda", None, "no CUDA device visible", device.index)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return DeviceInfo("cuda", tuple(torch.cuda.get_device_capability(index)), torch.cuda.get_device_name(index), device.index)


def constant_result(fn: Callable) -> Callable:
    """``torch.compiler.assume_constant_result`` without importing Dynamo (2-3 s of ``import
    ctxkit``): the same marker Dynamo reads (``_dynamo_marked_constant``); Dynamo's own
    function when it is loaded already (``tests/test_fast_plan.py`` checks they agree)."""
    import sys

    dynamo = sys.modules.get("torch._dynamo")
    return dynamo.assume_constant_result(fn) if dynamo is not None else _mark_constant(fn)


def _mark_constant(fn: Callable) -> Callable:
    fn._dynamo_marked_constant = True
    return fn


def has_package(name: str) -> bool:
    """Whether ``name`` is importable here (a module-level function so tests can patch it)."""
    return importlib.util.find_spec(name) is not None


_interpret_cpu = False  # inside interpret_on_cpu()


def _interpreter() -> bool:
    """Whether Triton's interpreter runs kernels on CPU tensors: inside :func:`interpret_on_cpu`,
    with ``TRITON_INTERPRET=1`` (the tests)."""
    return _interpret_cpu and os.environ.get("TRITON_INTERPRET") == "1"


@contextlib.contextmanager
def interpret_on_cpu() -> Iterator[None]:
    """Within the block, the kernels that Triton's interpreter runs are supported on CPU
    tensors, when ``TRITON_INTERPRET=1`` was set before the kernel modules were imported (the
    kernel tests on a machine without a GPU; slow). Every cached answer is forgotten on entry
    and exit."""
    global _interpret_cpu
    before = _interpret_cpu
    _interpret_cpu = True
    clear_cache()
    try:
        yield
    finally:
        _interpret_cpu = before
        clear_cache()


def _tensor_descriptors() -> Optional[str]:
    from . import gemm_kernels  # lazy: imports triton (the gpu extra), only once triton is known to be there

    return "needs Triton >= 3.4 (tensor descriptors)" if gemm_kernels.TensorDescriptor is None else None


@dataclass(frozen=True)
class Kernel:
    """One fast kernel family and what it needs.

    Attributes:
        what: what it is, for messages.
        packages: Python packages it imports (each names the extra that brings it).
        min_capability: the CUDA compute capability it needs (None: any CUDA GPU).
        dtypes: the activation dtypes it computes in (empty: any).
        interpreter: whether it also runs on CPU tensors through Triton's interpreter.
        cpu: whether it runs on CPU tensors without the interpreter (a PyTorch op).
        check: a further check once the packages are there (e.g. the Triton version).
    """

    what: str
    packages: Tuple[str, ...] = ("triton",)
    min_capability: Optional[Tuple[int, int]] = None
    dtypes: Tuple[torch.dtype, ...] = ()
    interpreter: bool = True
    cpu: bool = False
    check: Optional[Callable[[], Optional[str]]] = None


#: The registry: every fast kernel family, by the name the fast variants ask with.
KERNELS: Dict[str, Kernel] = {
    "gelu_gemm": Kernel("the GELU GEMM (Triton TMA GEMM with the GELU in its epilogues)", min_capability=(9, 0), dtypes=_HALF,
                        check=_tensor_descriptors),
    "fp8_gemm": Kernel("the float8 GEMM with scales, bias and GELU in its epilogue", min_capability=(9, 0),
                       check=_tensor_descriptors),
    "scaled_mm": Kernel("float8 matrix products (torch._scaled_mm)", packages=(), min_capability=(8, 9), interpreter=False,
                        cpu=True),
    "qkv_grad": Kernel("the packed q/k/v gradient kernel", dtypes=_HALF),
    "dropout_bits": Kernel("the packed dropout-mask kernel"),
    "decode_layers": Kernel("the Triton decoding layers (batch 1)"),
    "master_adamw": Kernel("the flat master-weight AdamW update"),
    "fp8_training": Kernel("torchao's float8 training Linears", packages=("torchao",), min_capability=(8, 9), interpreter=False),
}

# The extra that installs each package the kernels import.
_EXTRAS = {"triton": GPU_EXTRA, "torchao": GPU_EXTRA}


def supported(kernel: str, device: Union[str, torch.device, DeviceInfo, None] = None,
              dtype: Optional[torch.dtype] = None) -> Optional[str]:
    """Why ``kernel`` cannot run on ``device`` in ``dtype`` (None when it can).

    Args:
        kernel: a key of :data:`KERNELS`.
        device: a torch device, a :class:`DeviceInfo`, or None/"auto" (CUDA when available).
        dtype: the activation dtype (None: not checked).

    Raises:
        KeyError: for a name that is not in :data:`KERNELS`.
    """
    if kernel not in KERNELS:
        raise KeyError(f"no fast kernel named {kernel!r}; known: {', '.join(sorted(KERNELS))}")
    return _supported(kernel, device_info(device), dtype, _interpreter())


@functools.lru_cache(maxsize=None)
def _supported(kernel: str, info: DeviceInfo, dtype: Optional[torch.dtype], interpreter: bool) -> Optional[str]:
    spec = KERNELS[kernel]
    for package in spec.packages:
        if not has_package(package):
            return f"needs {package} ({_EXTRAS.get(package, f'pip install {package}')})"
    if info.type == "cuda":
        if spec.min_capability is not None and (info.capability is None or tuple(info.capability) < spec.min_capability):
            need = ".".join(map(str, spec.min_capability))
            have = ".".join(map(str, info.capability)) if info.capability else "unknown"
            return f"needs compute capability >= {need} ({info.name or 'this GPU'} is {have})"
    elif not spec.cpu and not (spec.interpreter and interpreter and info.type == "cpu"):
        return "needs a CUDA GPU"
    if dtype is not None and spec.dtypes and dtype not in spec.dtypes:
        return f"computes in {' or '.join(str(d).replace('torch.', '') for d in spec.dtypes)}, not {str(dtype).replace('torch.', '')}"
    if spec.check is not None:
        return spec.check()
    return None


_DEPENDENT_CACHES: List[Callable[[], None]] = []


def cached_answer(fn: Callable) -> Callable:
    """``functools.lru_cache`` for a function whose answer comes from :func:`supported` (a
    module's "does the kernel run on this device"): :func:`clear_cache` forgets it too."""
    cached = functools.lru_cache(maxsize=None)(fn)
    _DEPENDENT_CACHES.append(cached.cache_clear)
    return cached


def clear_cache() -> None:
    """Forget the cached answers, :func:`cached_answer` ones included (after a test patches
    packages or the environment)."""
    _supported.cache_clear()
    for clear in _DEPENDENT_CACHES:
        clear()
