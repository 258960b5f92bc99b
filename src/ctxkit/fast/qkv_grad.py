"""Fused q/k/v projection whose backward packs the head gradients with one Triton kernel.

:class:`~ctxkit.fast.attention.FusedQKVAttention` computes ``Y = x [W_q; W_k; W_v]^T + b``
as one GEMM and splits ``Y`` into per-head q, k, v. Under autograd the split's backward is
a concatenation of the attention backward's ``dq``, ``dk``, ``dv`` into ``dY``, and the
bias gradient is a second pass over ``dY``. :class:`PackedGradQKVAttention` writes the
projection as one autograd function whose backward does both in one pass
(:func:`ctxkit.fast.qkv_kernels.pack_qkv_grad`: read each gradient once, store it packed,
sum its columns in float32), then ``dx = dY W`` and ``dW = dY^T x`` as cuBLAS products.

It runs where the kernel does (CUDA tensors, or the interpreter in the tests, with
``triton`` installed) for self-attention with plain biased ``Linear`` projections under
autograd in bf16/fp16 (autocast or half parameters). Elsewhere it is the fused layer.
Numbers: the same products; the bias gradient is a float32 sum in another order, rounded
once, as autograd's. Swap it in with :func:`pack_qkv_grad`.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor, nn

from ..layers.attention import MultiHeadAttention
from .attention import FusedQKVAttention
from .kernels import cached_answer, constant_result, supported

__all__ = ["PackedGradQKVAttention", "pack_qkv_grad", "unpack_qkv_grad"]

_HALF = (torch.bfloat16, torch.float16)


def _kernels():
    from . import qkv_kernels  # lazy: imports triton (the gpu extra), only where the kernel runs

    return qkv_kernels


@torch.library.custom_op("ctxkit::pack_qkv_grad", mutates_args=())
def _pack(dq: Tensor, dk: Tensor, dv: Tensor) -> Tuple[Tensor, Tensor]:
    return _kernels().pack_qkv_grad(dq, dk, dv)


@_pack.register_fake
def _(dq: Tensor, dk: Tensor, dv: Tensor) -> Tuple[Tensor, Tensor]:
    batch, heads, seq, head_dim = dq.shape
    width = 3 * heads * head_dim
    return dq.new_empty(batch * seq, width), dq.new_empty(width, dtype=torch.float32)


class _QKVProjection(torch.autograd.Function):
    """``x (batch, seq, in) -> q, k, v (batch, heads, seq, head_dim)`` through one biased GEMM."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor, heads: int):
        batch, seq, _ = x.shape
        flat = x.reshape(batch * seq, x.shape[-1])
        y = torch.addmm(bias, flat, weight.t())
        ctx.save_for_backward(flat, weight)
        ctx.shape = (batch, seq, x.shape[-1])
        width = weight.shape[0] // 3
        per_head = y.view(batch, seq, 3, heads, width // heads)
        return per_head[:, :, 0].transpose(1, 2), per_head[:, :, 1].transpose(1, 2), per_head[:, :, 2].transpose(1, 2)

    @staticmethod
    def backward(ctx, dq: Tensor, dk: Tensor, dv: Tensor):
        flat, weight = ctx.saved_tensors
        dy, dbias = _pack(dq, dk, dv)
        dx = (dy @ weight).view(ctx.shape)
        dweight = dy.t() @ flat
        return dx, dweight, dbias.to(dy.dtype), None


@cached_answer
def _runs_on_cached(device_type: str, index: Optional[int]) -> bool:
    # No gpu extra, or a device the kernel does not run on: the fused layer's path.
    return supported("qkv_grad", torch.device(device_type, index) if index is not None else torch.device(device_type)) is None


@constant_result
def _runs_on(device_type: str, index: Optional[int]) -> bool:
    """Whether the kernel runs on this device (cached; a constant to ``torch.compile``)."""
    return _runs_on_cached(device_type, index)


class PackedGradQKVAttention(FusedQKVAttention):
    """:class:`~ctxkit.fast.attention.FusedQKVAttention` whose self-attention projection,
    under autograd, packs the q/k/v gradients and sums the bias gradient in one Triton pass
    (see the module docstring). Same parameters, same ``state_dict``."""

    def _packed_dtype(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor]) -> Optional[torch.dtype]:
        """The half dtype of the packed path, if it serves this call (else None)."""
        if not torch.is_grad_enabled() or (key is not None and key is not query) or (value is not None and value is not query):
            return None
        if getattr(self, "fused_qkv", None) is not None or query.dim() != 3:
            return None
        projs = (self.q_proj, self.k_proj, self.v_proj)
        if not all(type(p) is nn.Linear and p.bias is not None for p in projs) or self.head_dim & (self.head_dim - 1):
            return None
        device = query.device
        dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else query.dtype
        if dtype not in _HALF or not _runs_on(device.type, device.index):
            return None
        return dtype

    def _project(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
        dtype = self._packed_dtype(query, key, value)
        if dtype is None:
            return super()._project(query, key, value)
        weight, bias = self._fused((self.q_proj, self.k_proj, self.v_proj))
        # The autocast casts are done here; inside, cuBLAS and the kernel see one dtype.
        x, weight, bias = query.to(dtype), weight.to(dtype), bias.to(dtype)
        with torch.autocast(query.device.type, enabled=False):
            return _QKVProjection.apply(x, weight, bias, self.num_heads)


def pack_qkv_grad(model: nn.Module) -> int:
    """Swap every self-attention module of ``model`` whose class is exactly
    :class:`~ctxkit.layers.attention.MultiHeadAttention` or
    :class:`~ctxkit.fast.attention.FusedQKVAttention` (subclasses such as Transformer-XL's
    relative attention project differently and are left alone) to
    :class:`PackedGradQKVAttention`, in place; idempotent. Returns how many modules have that
    form. Parameters and ``state_dict`` are unchanged; :func:`unpack_qkv_grad` undoes it
    (leaving the fused form)."""
    count = 0
    for module in model.modules():
        if type(module) in (MultiHeadAttention, FusedQKVAttention):
            module.__class__ = PackedGradQKVAttention  # same attributes: a subclass that adds no state
        count += type(module) is PackedGradQKVAttention
    return count


def unpack_qkv_grad(model: nn.Module) -> int:
    """Turn every :class:`PackedGradQKVAttention` of ``model`` back into
    :class:`~ctxkit.fast.attention.FusedQKVAttention`; returns how many."""
    count = 0
    for module in model.modules():
        if type(module) is PackedGradQKVAttention:
            module.__class__ = FusedQKVAttention
            count += 1
    return count
