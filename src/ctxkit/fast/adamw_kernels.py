"""Triton kernels for :class:`ctxkit.training.master.MasterAdamW`: the AdamW update of a
flat segment of fp32 master weights, reading the gradients where autograd left them and
writing the bf16 copy the model computes with; and the gradients' sum of squares for
clipping.

Gradients are separate tensors (autograd allocates each), so a launch covers a segment of
parameters through tables: for each block of ``BLOCK`` elements its parameter and the
block's start inside it; for each parameter its offset in the flat buffers, its size and
the address of its gradient (a device table refreshed each step; inside a CUDA graph the
addresses are those of the graph's memory pool, fixed across replays). Gathering the
gradients into one buffer first would cost a read and a write of every gradient.

Per element the update reads the gradient, the master and both moments and writes the
master, both moments and (for the bf16 kind) the bf16 weight: the traffic of PyTorch's
fused AdamW, with the weight cast for the next forward and the clipping factor folded in.

Importing this module needs ``triton`` (the ``gpu`` extra).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["BLOCK", "adamw_update", "build_tables", "set_grad_addresses", "sum_of_squares"]

BLOCK = 2048


@triton.jit
def _locate(block_param_ptr, block_start_ptr, param_offset_ptr, param_size_ptr, grad_addr_ptr, GRAD_DTYPE: tl.constexpr,
            BLOCK: tl.constexpr):
    """This program's block: gradient addresses, flat offsets, and whether it is whole."""
    b = tl.program_id(0)
    t = tl.load(block_param_ptr + b)
    # The allocator aligns gradients and MasterAdamW starts every parameter at a multiple of
    # 16 elements; said here so the loads and stores vectorise.
    start = tl.multiple_of(tl.load(block_start_ptr + b), BLOCK)
    size = tl.load(param_size_ptr + t)
    inside = start + tl.arange(0, BLOCK)
    grads = tl.multiple_of(tl.load(grad_addr_ptr + t).to(tl.pointer_type(GRAD_DTYPE)), 16)
    flat = tl.multiple_of(tl.load(param_offset_ptr + t), 16) + inside
    return grads + inside, flat, inside < size, start + BLOCK <= size


@triton.jit
def _adamw_block(grad_at, flat, mask, master_ptr, m_ptr, v_ptr, low_ptr, lr, step_size, inv_bc2_sqrt, clip,
                 weight_decay, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, WRITE_LOW: tl.constexpr):
    g = tl.load(grad_at, mask=mask).to(tl.float32) * clip
    p = tl.load(master_ptr + flat, mask=mask)
    m = tl.load(m_ptr + flat, mask=mask)
    v = tl.load(v_ptr + flat, mask=mask)
    # The order of torch's fused AdamW (decoupled decay first, then the moments and the step).
    p = p - lr * weight_decay * p
    m = beta1 * m + one_minus_beta1 * g
    v = beta2 * v + one_minus_beta2 * g * g
    denom = tl.sqrt(v) * inv_bc2_sqrt + eps
    p = p - step_size * m / denom
    tl.store(master_ptr + flat, p, mask=mask)
    tl.store(m_ptr + flat, m, mask=mask)
    tl.store(v_ptr + flat, v, mask=mask)
    if WRITE_LOW:
        tl.store(low_ptr + flat, p.to(low_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mask)


@triton.jit
def _adamw_kernel(block_param_ptr, block_start_ptr, param_offset_ptr, param_size_ptr, grad_addr_ptr, param_group_ptr,
                  master_ptr, m_ptr, v_ptr, low_ptr, scal_ptr, hyper_ptr,
                  GRAD_DTYPE: tl.constexpr, WRITE_LOW: tl.constexpr, BLOCK: tl.constexpr):
    grad_at, flat, mask, whole = _locate(block_param_ptr, block_start_ptr, param_offset_ptr, param_size_ptr,
                                         grad_addr_ptr, GRAD_DTYPE, BLOCK)
    group = tl.load(param_group_ptr + tl.load(block_param_ptr + tl.program_id(0)))
    # scal[group] = [lr, lr / (1 - beta1^t), 1 / sqrt(1 - beta2^t), clip factor], computed on
    # the device each step so a CUDA graph replays with the current rate and step.
    lr = tl.load(scal_ptr + 4 * group)
    step_size = tl.load(scal_ptr + 4 * group + 1)
    inv_bc2_sqrt = tl.load(scal_ptr + 4 * group + 2)
    clip = tl.load(scal_ptr + 4 * group + 3)
    # hyper[group] = [weight decay, beta1, 1 - beta1, beta2, 1 - beta2, eps]
    weight_decay = tl.load(hyper_ptr + 6 * group)
    beta1 = tl.load(hyper_ptr + 6 * group + 1)
    one_minus_beta1 = tl.load(hyper_ptr + 6 * group + 2)
    beta2 = tl.load(hyper_ptr + 6 * group + 3)
    one_minus_beta2 = tl.load(hyper_ptr + 6 * group + 4)
    eps = tl.load(hyper_ptr + 6 * group + 5)
    if whole:  # unmasked: vector loads and stores
        _adamw_block(grad_at, flat, None, master_ptr, m_ptr, v_ptr, low_ptr, lr, step_size, inv_bc2_sqrt, clip,
                     weight_decay, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, WRITE_LOW)
    else:  # a parameter's last, partial block
        _adamw_block(grad_at, flat, mask, master_ptr, m_ptr, v_ptr, low_ptr, lr, step_size, inv_bc2_sqrt, clip,
                     weight_decay, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, WRITE_LOW)


@triton.jit
def _sumsq_kernel(block_param_ptr, block_start_ptr, param_offset_ptr, param_size_ptr, grad_addr_ptr, out_ptr,
                  GRAD_DTYPE: tl.constexpr, BLOCK: tl.constexpr):
    grad_at, flat, mask, whole = _locate(block_param_ptr, block_start_ptr, param_offset_ptr, param_size_ptr,
                                         grad_addr_ptr, GRAD_DTYPE, BLOCK)
    if whole:
        g = tl.load(grad_at).to(tl.float32)
    else:
        g = tl.load(grad_at, mask=mask, other=0.0).to(tl.float32)
    # One partial sum per block, added up by the caller in a fixed order (deterministic).
    tl.store(out_ptr + tl.program_id(0), tl.sum(g * g, axis=0))


@triton.jit
def _put16(out_ptr, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15):
    # Addresses as kernel arguments: a CUDA graph keeps them by value, so each graph
    # (each with its own gradient buffers) refills its table on replay with its own.
    tl.store(out_ptr + 0, a0)
    tl.store(out_ptr + 1, a1)
    tl.store(out_ptr + 2, a2)
    tl.store(out_ptr + 3, a3)
    tl.store(out_ptr + 4, a4)
    tl.store(out_ptr + 5, a5)
    tl.store(out_ptr + 6, a6)
    tl.store(out_ptr + 7, a7)
    tl.store(out_ptr + 8, a8)
    tl.store(out_ptr + 9, a9)
    tl.store(out_ptr + 10, a10)
    tl.store(out_ptr + 11, a11)
    tl.store(out_ptr + 12, a12)
    tl.store(out_ptr + 13, a13)
    tl.store(out_ptr + 14, a14)
    tl.store(out_ptr + 15, a15)


def set_grad_addresses(table: Tensor, grads) -> None:
    """Write the gradients' addresses into ``table`` (int64, length a multiple of 16) with
    launches that carry them as arguments (valid inside CUDA-graph capture, unlike a copy
    from host memory)."""
    addrs = [g.data_ptr() for g in grads]
    addrs += [0] * (table.numel() - len(addrs))
    for i in range(0, len(addrs), 16):
        _put16[(1,)](table[i:], *addrs[i:i + 16], num_warps=1)


def build_tables(sizes, offsets, groups, device) -> dict:
    """Block tables for one kind's parameters (their element counts, flat offsets and param
    group indices); the caller adds the ``grad_addr`` table."""
    block_param, block_start = [], []
    for i, size in enumerate(sizes):
        for start in range(0, size, BLOCK):
            block_param.append(i)
            block_start.append(start)

    def as_tensor(values):
        return torch.tensor(values, dtype=torch.int64, device=device)

    return {"block_param": as_tensor(block_param), "block_start": as_tensor(block_start),
            "param_offset": as_tensor(list(offsets)), "param_size": as_tensor(list(sizes)), "param_group": as_tensor(list(groups))}


_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


def _tables(tables: dict):
    return (tables["block_param"], tables["block_start"], tables["param_offset"], tables["param_size"], tables["grad_addr"])


def sum_of_squares(tables: dict, grad_dtype: torch.dtype, out: Tensor) -> Tensor:
    """Per-block sums of squared gradients into ``out`` (float32, one per block)."""
    n = tables["block_param"].numel()
    _sumsq_kernel[(n,)](*_tables(tables), out, GRAD_DTYPE=_DTYPES[grad_dtype], BLOCK=BLOCK, num_warps=8)
    return out


def adamw_update(tables: dict, grad_dtype: torch.dtype, master: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor,
                 low: Optional[Tensor], scalars: Tensor, hyper: Tensor) -> None:
    """Update the parameters ``tables`` lists, in place, in one launch.

    Args:
        tables: int64 device tensors ``block_param``, ``block_start`` (per block) and
            ``param_offset``, ``param_size``, ``param_group``, ``grad_addr`` (per parameter).
        master, exp_avg, exp_avg_sq: the kind's flat fp32 buffers.
        low: its flat bf16 weights (overwritten with the rounded masters), or None.
        scalars: fp32 ``(groups, 4)``: ``[lr, lr / bias_correction1, 1 / sqrt(bias_correction2), clip factor]``.
        hyper: fp32 ``(groups, 6)``: ``[weight_decay, beta1, 1 - beta1, beta2, 1 - beta2, eps]``.
    """
    n = tables["block_param"].numel()
    if n == 0:
        return
    _adamw_kernel[(n,)](*_tables(tables), tables["param_group"], master, exp_avg, exp_avg_sq,
                        low if low is not None else master, scalars, hyper,
                        GRAD_DTYPE=_DTYPES[grad_dtype], WRITE_LOW=low is not None, BLOCK=BLOCK, num_warps=8)
