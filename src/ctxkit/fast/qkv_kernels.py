"""Triton kernel for :mod:`ctxkit.fast.qkv_grad`: the q/k/v gradients packed into the fused
projection's output gradient, with its bias gradient summed on the way.

The attention backward hands back ``dq``, ``dk``, ``dv`` as three ``(batch, heads, seq,
head_dim)`` tensors. The fused projection's backward needs them as one ``(tokens, 3 * embed)``
matrix (for ``dx = dY W`` and ``dW = dY^T x``) and needs ``dY``'s column sums (the bias
gradient). Autograd does that as a concatenation (read 3, write 3) and then a reduction over
the tokens (read 3 again). Here one kernel reads each gradient tile once, stores it in place
and writes the tile's float32 column sums; a small second pass adds the per-tile sums in a
fixed order, so the result does not depend on scheduling.

Importing this module needs ``triton`` (the ``gpu`` extra).
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["INTERPRETER", "pack_qkv_grad", "supported"]

INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
BLOCK_M = 128  # tokens per program: a (BLOCK_M, head_dim) tile of one head of one role


@triton.jit
def _copy_tile(src, sb, sh, ss, sd, head, rows, cols, row_ok, S):
    """A ``(rows, head_dim)`` tile of ``src[b, head, s, :]`` for token rows ``b * S + s``."""
    b = (rows // S).to(tl.int64)  # 64-bit offsets: large batches pass 2^31 elements
    s = (rows % S).to(tl.int64)
    ptrs = src + b[:, None] * sb + head * sh + s[:, None] * ss + cols[None, :] * sd
    return tl.load(ptrs, mask=row_ok[:, None], other=0.0)


@triton.jit
def _pack_kernel(q, k, v, out, partial, M, S,
                 qb, qh, qs, qd, kb, kh, ks, kd, vb, vh, vs, vd,
                 HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr):
    pid_m = tl.program_id(0)
    role = tl.program_id(1) // HEADS  # 0: q, 1: k, 2: v
    head = tl.program_id(1) % HEADS
    rows = pid_m * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, HEAD_DIM)
    row_ok = rows < M
    if role == 0:
        tile = _copy_tile(q, qb, qh, qs, qd, head, rows, cols, row_ok, S)
    elif role == 1:
        tile = _copy_tile(k, kb, kh, ks, kd, head, rows, cols, row_ok, S)
    else:
        tile = _copy_tile(v, vb, vh, vs, vd, head, rows, cols, row_ok, S)
    width = 3 * HEADS * HEAD_DIM
    col0 = role * (HEADS * HEAD_DIM) + head * HEAD_DIM
    tl.store(out + rows[:, None].to(tl.int64) * width + col0 + cols[None, :], tile, mask=row_ok[:, None])
    # Rows past M were loaded as zeros: they add nothing to the sums.
    tl.store(partial + pid_m * width + col0 + cols, tl.sum(tile.to(tl.float32), axis=0))


def supported(t: Tensor) -> Optional[str]:
    """Why :func:`pack_qkv_grad` cannot run on ``t``'s device (None when it can)."""
    if t.device.type == "cuda" or (t.device.type == "cpu" and INTERPRETER):
        return None
    return "CPU tensors run only through Triton's interpreter (TRITON_INTERPRET=1)"


def pack_qkv_grad(dq: Tensor, dk: Tensor, dv: Tensor) -> Tuple[Tensor, Tensor]:
    """``cat([dq, dk, dv])`` in the fused projection's layout and its float32 column sums.

    Args:
        dq, dk, dv: ``(batch, heads, seq, head_dim)`` each, one dtype, any strides;
            ``head_dim`` a power of two.

    Returns:
        ``dy`` ``(batch * seq, 3 * heads * head_dim)`` (contiguous, ``dq``'s dtype), where
        row ``b * seq + s`` holds ``[dq[b, :, s], dk[b, :, s], dv[b, :, s]]`` with heads
        flattened, and ``dy.sum(0)`` in float32 ``(3 * heads * head_dim,)``.
    """
    if not (dq.shape == dk.shape == dv.shape) or dq.dim() != 4 or not (dq.dtype == dk.dtype == dv.dtype):
        raise ValueError(f"pack_qkv_grad: dq, dk, dv must share one 4-D shape and dtype, got "
                         f"{tuple(dq.shape)}/{dq.dtype}, {tuple(dk.shape)}/{dk.dtype}, {tuple(dv.shape)}/{dv.dtype}")
    batch, heads, seq, head_dim = dq.shape
    if head_dim & (head_dim - 1):
        raise ValueError(f"pack_qkv_grad: head_dim must be a power of two, got {head_dim}")
    tokens, width = batch * seq, 3 * heads * head_dim
    out = torch.empty(tokens, width, dtype=dq.dtype, device=dq.device)
    tiles = triton.cdiv(tokens, BLOCK_M)
    partial = torch.empty(tiles, width, dtype=torch.float32, device=dq.device)
    if tokens:
        _pack_kernel[(tiles, 3 * heads)](dq, dk, dv, out, partial, tokens, seq, *dq.stride(), *dk.stride(), *dv.stride(),
                                         HEADS=heads, HEAD_DIM=head_dim, BLOCK=BLOCK_M, num_warps=4)
    return out, partial.sum(0)
