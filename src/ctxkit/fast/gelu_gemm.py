"""Exact-GELU feed-forward block with the GELU inside Triton GEMMs (training and inference).

:class:`GemmGeluFFN` computes the same function as :class:`~ctxkit.layers.ffn.PositionwiseFFN`
with the erf GELU (BERT's), but never runs the GELU as its own pass over the
``(tokens, 4h)`` activation (:mod:`ctxkit.fast.gemm_kernels`):

* forward: ``h = gelu(x @ W1.T + b1)`` is one GEMM whose epilogue adds the bias and applies
  the GELU (in float32, rounded once); under autograd it also stores the pre-activation for
  the backward; ``y = h @ W2.T + b2`` is cuBLAS's;
* backward: ``grad_pre = (grad_y @ W2) * gelu'(pre)`` is one GEMM whose epilogue also sums
  the columns into ``b1``'s gradient; the weight gradients and ``grad_x`` are cuBLAS's.

Unlike :class:`~ctxkit.fast.ffn.GeluEpilogueFFN` (cuBLASLt's tanh GELU, an approximation for
BERT) this is exact: the erf GELU of the float32 sum, one rounding (PyTorch rounds the sum
to bf16 before its GELU: the two differ by at most one rounding of the output).

It runs where the kernels do: CUDA tensors on Hopper or later, in bf16/fp16 (autocast or
half parameters), with ``triton`` installed (the ``gpu`` extra); CPU tensors through
Triton's interpreter in the tests. Elsewhere (float32, CPU, older GPUs, dropout inside the
block while training) the swapped module is the plain layer, computing the same function.
Swap it in with :func:`fuse_gelu_gemm`.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..layers.ffn import PositionwiseFFN
from ._swap import swap, unswap
from .kernels import cached_answer, constant_result, has_package, supported

__all__ = ["GemmGeluFFN", "fuse_gelu_gemm", "gelu_gemm_available", "linear_gelu", "unfuse_gelu_gemm"]

_kernels = None
_HALF = (torch.bfloat16, torch.float16)


def gelu_gemm_available() -> bool:
    """Whether Triton is installed (the kernels themselves also need a Hopper GPU, or the
    interpreter: :func:`ctxkit.fast.kernels.supported` ``("gelu_gemm", device)`` says)."""
    return has_package("triton")


def _load_kernels():
    global _kernels
    if _kernels is None:
        from . import gemm_kernels  # lazy: imports triton (the gpu extra), only when an FFN runs fused

        _kernels = gemm_kernels
    return _kernels


@torch.library.custom_op("ctxkit::linear_gelu", mutates_args=())
def _linear_gelu(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    return _load_kernels().linear_epilogue(x, weight, bias, epilogue="gelu")[0]


@_linear_gelu.register_fake
def _(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])


@torch.library.custom_op("ctxkit::linear_gelu_pre", mutates_args=())
def _linear_gelu_pre(x: Tensor, weight: Tensor, bias: Tensor) -> Tuple[Tensor, Tensor]:
    return _load_kernels().linear_epilogue(x, weight, bias, epilogue="gelu", store_pre=True)


@_linear_gelu_pre.register_fake
def _(x: Tensor, weight: Tensor, bias: Tensor) -> Tuple[Tensor, Tensor]:
    return x.new_empty(x.shape[0], weight.shape[0]), x.new_empty(x.shape[0], weight.shape[0])


@torch.library.custom_op("ctxkit::matmul_gelu_grad", mutates_args=())
def _matmul_gelu_grad(grad_y: Tensor, weight2: Tensor, pre: Tensor) -> Tuple[Tensor, Tensor]:
    return _load_kernels().linear_epilogue(grad_y, weight2, epilogue="gelu_grad", pre=pre, weight_kn=True)


@_matmul_gelu_grad.register_fake
def _(grad_y: Tensor, weight2: Tensor, pre: Tensor) -> Tuple[Tensor, Tensor]:
    return pre.new_empty(pre.shape), pre.new_empty(pre.shape[1], dtype=torch.float32)


def linear_gelu(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """``gelu_erf(x @ weight.T + bias)`` as one Triton GEMM (no autograd formula: use
    :class:`GemmGeluFFN` for training).

    Args:
        x: ``(tokens, in_features)`` bf16/fp16 on a Hopper GPU (or CPU under the interpreter).
        weight: ``(out_features, in_features)``; bias: ``(out_features,)``; x's dtype.

    Returns:
        ``(tokens, out_features)``.
    """
    return _linear_gelu(x, weight, bias)


class _GemmGeluFFNFunction(torch.autograd.Function):
    """``fc2(gelu(fc1(x)))`` on 2-D half-precision inputs, with the fused forward and backward."""

    @staticmethod
    def forward(ctx, x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor) -> Tensor:
        h, pre = _linear_gelu_pre(x, w1, b1)
        ctx.save_for_backward(x, w1, w2, h, pre)
        return F.linear(h, w2, b2)

    @staticmethod
    def backward(ctx, grad_y: Tensor):
        x, w1, w2, h, pre = ctx.saved_tensors
        grad_y = grad_y.contiguous()
        grad_pre, grad_b1 = _matmul_gelu_grad(grad_y, w2, pre)
        grad_x = grad_pre @ w1
        grad_w1 = grad_pre.t() @ x
        grad_w2 = grad_y.t() @ h
        grad_b2 = grad_y.sum(0, dtype=torch.float32).to(grad_y.dtype)
        return grad_x, grad_w1, grad_b1.to(grad_y.dtype), grad_w2, grad_b2


class GemmGeluFFN(PositionwiseFFN):
    """:class:`~ctxkit.layers.ffn.PositionwiseFFN` (erf GELU) whose GELU and its derivative
    run inside Triton GEMM epilogues where the kernels can run, the plain layer elsewhere.
    Swap it in with :func:`fuse_gelu_gemm`."""

    def _fused_dtype(self, x: Tensor) -> Optional[torch.dtype]:
        """The half dtype the block would compute in, if the fused kernels serve this call."""
        device = x.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
        if dtype not in _HALF or not _runs_on(device, x.device.index):
            return None
        if self.training and self.dropout.p > 0 and torch.is_grad_enabled():
            return None  # dropout between the GELU and fc2: not in the epilogue
        return dtype

    def forward(self, x: Tensor) -> Tensor:
        """Args: x ``(batch, seq, dim)``. Returns ``(batch, seq, dim)``."""
        dtype = self._fused_dtype(x)
        if dtype is None:
            return super().forward(x)
        shape = x.shape
        flat = x.reshape(-1, shape[-1]).to(dtype).contiguous()
        w1, b1 = self.fc1.weight.to(dtype), self.fc1.bias.to(dtype)
        w2, b2 = self.fc2.weight.to(dtype), self.fc2.bias.to(dtype)
        # The autocast casts are done above; inside, the kernels and cuBLAS see one dtype.
        with torch.autocast(x.device.type, enabled=False):
            if torch.is_grad_enabled():
                y = _GemmGeluFFNFunction.apply(flat, w1, b1, w2, b2)
            else:
                y = F.linear(_linear_gelu(flat, w1, b1), w2, b2)
        return y.view(*shape[:-1], y.shape[-1])


@cached_answer
def _runs_on_cached(device_type: str, index: Optional[int]) -> bool:
    if not gelu_gemm_available():  # no triton (the gpu extra): callers take their PyTorch path
        return False
    return supported("gelu_gemm", torch.device(device_type, index) if index is not None else torch.device(device_type)) is None


@constant_result
def _runs_on(device_type: str, index: Optional[int]) -> bool:
    """Whether the kernels run on this device (cached; a constant to ``torch.compile``)."""
    return _runs_on_cached(device_type, index)


def _fusable(module: nn.Module) -> bool:
    return (type(module) is PositionwiseFFN and module.activation_name == "gelu"
            and all(type(p) is nn.Linear and p.bias is not None for p in (module.fc1, module.fc2))
            and (module.fc1.in_features * 2) % 16 == 0 and (module.fc1.out_features * 2) % 16 == 0)


def fuse_gelu_gemm(model: nn.Module) -> int:
    """Swap every erf-GELU :class:`~ctxkit.layers.ffn.PositionwiseFFN` of ``model`` (plain
    Linears with biases, 16-byte aligned rows) to :class:`GemmGeluFFN`, in place; idempotent.
    Returns how many are in that form (0 without ``triton``: nothing is swapped). Parameters
    and ``state_dict`` are unchanged; :func:`unfuse_gelu_gemm` undoes it."""
    if not gelu_gemm_available():
        return 0
    _load_kernels()  # imported here, outside any compiled region
    count = 0
    for module in model.modules():
        if isinstance(module, GemmGeluFFN):
            count += 1
        elif _fusable(module):
            swap(module, GemmGeluFFN)
            count += 1
    return count


def unfuse_gelu_gemm(model: nn.Module) -> int:
    """Turn every :class:`GemmGeluFFN` of ``model`` back into the plain layer; returns how many."""
    return sum(unswap(m, GemmGeluFFN) for m in list(model.modules()))
