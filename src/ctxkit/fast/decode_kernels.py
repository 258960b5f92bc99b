"""Triton kernels for one decoding step of a pre-norm Transformer layer, a few rows at a time.

A pre-norm layer decoding one token runs, per row: LayerNorm, the q/k/v product, a cache
write, attention over the cache, the output product plus the residual, LayerNorm, the
first FFN product with its activation, the second FFN product plus the residual. Launched
as PyTorch operations that is ~11 kernels per layer, each a few microseconds long on a GPU
while the work (reading the weights once) takes ~1 us per matrix. Five kernels do it here:

1. :func:`row_linear` with ``ln`` and ``kv``: LayerNorm of the row (each program
   recomputes the row's mean and variance: 768 numbers, cheaper than another launch), the
   q/k/v product and bias; q goes to an output row, k and v straight into the KV cache at
   the device-side write index.
2. :func:`decode_attention`: programs over (head, block of cache slots, row) read the
   filled slots only (``0 .. write_index``), key-masked, each a partial softmax; the last
   program of each head to finish combines them.
3. :func:`row_linear` with ``residual``: output product + bias + residual.
4. :func:`row_linear` with ``ln`` and ``activation``: LayerNorm, fc1, bias, GELU/ReLU.
5. :func:`row_linear` with ``residual``: fc2 + bias + residual.

Each matrix-vector product is split over many programs of ``block_n`` output features (a
768 x 2304 matrix over 288 programs), each reading its rows of the matrix once in chunks of
``block_k`` inputs and accumulating in float32. Numerics follow the PyTorch layer in the
same dtype: the LayerNorm output is rounded to the activation dtype before the product (as
``nn.LayerNorm`` returns it), products accumulate in float32, and bias, activation and
residual are applied to the float32 sum before one rounding (PyTorch rounds the product
first; the difference is within one rounding of the result).

The kernels run on CUDA tensors; tests also run them on CPU tensors through Triton's
interpreter (:data:`INTERPRETER`). Importing this module needs ``triton`` (the ``gpu``
extra); :mod:`ctxkit.fast.decode_layer` falls back to PyTorch without it.
"""

from __future__ import annotations

import os
from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

try:  # programmatic dependent launch (Hopper and later; Triton >= 3.4)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - older Triton: never called (PDL stays off)
    gdc_launch_dependents = gdc_wait = None

__all__ = ["ACTIVATION_CODES", "INTERPRETER", "decode_attention", "interpreted", "row_linear", "tiles"]

# Triton's interpreter (CPU tensors, NumPy underneath) is chosen for the whole process by
# TRITON_INTERPRET=1 before triton is imported; the test suite sets it on machines without a GPU.
INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"

# Activation names (ctxkit.layers.ffn.ACTIVATIONS) -> the kernel's code.
ACTIVATION_CODES = {None: 0, "gelu_new": 1, "gelu_tanh": 1, "gelu_pytorch_tanh": 1, "gelu": 2, "relu": 3}


def _row_linear(x_ptr, x_stride, ln_w_ptr, ln_b_ptr, eps, w_ptr, b_ptr, res_ptr, res_stride, out_ptr, out_stride,
                kv_ptr, kv_s_part, kv_s_row, kv_s_head, kv_s_pos, pos_ptr, N, K, HIDDEN, HEAD_DIM,
                HAS_LN: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr,
                KV: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    pid_n = tl.program_id(0)
    row = tl.program_id(1)
    x_row = x_ptr + row * x_stride
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    if BLOCK_K >= K:
        # The whole row in one tile: the weights' load is issued first, so the memory reads
        # overlap the LayerNorm instead of waiting for it. Each weight is read once per token:
        # evict it first, keep the cache and activations in L2.
        offs_k = tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        w = tl.load(w_ptr + offs_n[:, None] * K + offs_k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0,
                    eviction_policy="evict_first")
        if PDL:
            # Launched early (programmatic dependent launch): the weights are being read while the
            # previous kernel finishes; its outputs are read only after it has.
            gdc_launch_dependents()
            gdc_wait()
        x = tl.load(x_row + offs_k, mask=k_mask, other=0.0).to(tl.float32)
        if HAS_LN:
            # Mean, then the centred squares (two passes, in registers), as nn.LayerNorm.
            mean = tl.sum(x, axis=0) / K
            centred = tl.where(k_mask, x - mean, 0.0)
            rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=0) / K + eps)
            gamma = tl.load(ln_w_ptr + offs_k, mask=k_mask, other=0.0).to(tl.float32)
            beta = tl.load(ln_b_ptr + offs_k, mask=k_mask, other=0.0).to(tl.float32)
            # Rounded to the activation dtype: the product reads what nn.LayerNorm returns.
            x = tl.where(k_mask, (centred * rstd * gamma + beta).to(x_ptr.dtype.element_ty).to(tl.float32), 0.0)
        acc = w.to(tl.float32) * x[None, :]
    else:
        if PDL:
            gdc_launch_dependents()
            gdc_wait()
        mean = 0.0
        rstd = 1.0
        if HAS_LN:
            total = tl.zeros([BLOCK_K], dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                offs_k = k0 + tl.arange(0, BLOCK_K)
                total += tl.load(x_row + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
            mean = tl.sum(total, axis=0) / K
            total = tl.zeros([BLOCK_K], dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                offs_k = k0 + tl.arange(0, BLOCK_K)
                centred = tl.where(offs_k < K, tl.load(x_row + offs_k, mask=offs_k < K, other=0.0).to(tl.float32) - mean, 0.0)
                total += centred * centred
            rstd = 1.0 / tl.sqrt(tl.sum(total, axis=0) / K + eps)
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_mask = offs_k < K
            x = tl.load(x_row + offs_k, mask=k_mask, other=0.0).to(tl.float32)
            if HAS_LN:
                gamma = tl.load(ln_w_ptr + offs_k, mask=k_mask, other=0.0).to(tl.float32)
                beta = tl.load(ln_b_ptr + offs_k, mask=k_mask, other=0.0).to(tl.float32)
                x = tl.where(k_mask, ((x - mean) * rstd * gamma + beta).to(x_ptr.dtype.element_ty).to(tl.float32), 0.0)
            w = tl.load(w_ptr + offs_n[:, None] * K + offs_k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0,
                        eviction_policy="evict_first")
            acc += w.to(tl.float32) * x[None, :]
    y = tl.sum(acc, axis=1)  # (BLOCK_N,)
    if HAS_BIAS:
        y += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    if ACT == 1:  # GELU, tanh form; tanh(u) = 1 - 2 / (exp(2u) + 1) (no tanh in every Triton)
        u = 0.7978845608028654 * (y + 0.044715 * y * y * y)
        y = 0.5 * y * (2.0 - 2.0 / (tl.exp(2.0 * u) + 1.0))
    elif ACT == 2:  # GELU, exact erf form
        y = 0.5 * y * (1.0 + tl.math.erf(y * 0.7071067811865476))
    elif ACT == 3:
        y = tl.maximum(y, 0.0)
    if HAS_RES:
        y += tl.load(res_ptr + row * res_stride + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    if KV:
        # Features [0, HIDDEN) are q (to out); [HIDDEN, 2 HIDDEN) k and [2 HIDDEN, 3 HIDDEN) v,
        # stored at cache[part, row, head, write_index, d].
        part = offs_n // HIDDEN
        within = offs_n - part * HIDDEN
        head = within // HEAD_DIM
        d = within - head * HEAD_DIM
        is_q = part == 0
        tl.store(out_ptr + row * out_stride + offs_n, y.to(out_ptr.dtype.element_ty), mask=n_mask & is_q)
        pos = tl.load(pos_ptr)
        kv_off = (part - 1) * kv_s_part + row * kv_s_row + head * kv_s_head + pos * kv_s_pos + d
        tl.store(kv_ptr + kv_off, y.to(kv_ptr.dtype.element_ty), mask=n_mask & (part > 0))
    else:
        tl.store(out_ptr + row * out_stride + offs_n, y.to(out_ptr.dtype.element_ty), mask=n_mask)


def _attention_split(q_ptr, q_stride, kv_ptr, kv_s_part, kv_s_row, kv_s_head, kv_s_pos, mask_ptr, mask_stride,
                     part_ptr, count_ptr, out_ptr, out_stride, pos_ptr, scale, SPLITS,
                     HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, MAX_SPLITS: tl.constexpr, PDL: tl.constexpr):
    # One program per (head, split of BLOCK_S cache slots, row): the scores of its slots, their
    # max m, sum of exp l and exp-weighted values acc, written to part[row, head, split] as
    # (acc[0..HEAD_DIM), m, l); splits past the filled slots write m = -inf, l = 0, acc = 0.
    # The last program of a (head, row) to finish (a counter, atomically incremented after
    # the stores) combines the splits and resets the counter for the next step: no second
    # kernel launch.
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    head = tl.program_id(0)
    split = tl.program_id(1)
    row = tl.program_id(2)
    heads = tl.num_programs(0)
    d = tl.arange(0, HEAD_DIM)
    filled = tl.load(pos_ptr).to(tl.int32) + 1  # slots 0 .. write_index (this token's included)
    s = split * BLOCK_S + tl.arange(0, BLOCK_S)
    valid = s < filled
    keep = (tl.load(mask_ptr + row * mask_stride + s, mask=valid, other=0) != 0) & valid
    q = tl.load(q_ptr + row * q_stride + head * HEAD_DIM + d).to(tl.float32) * scale
    base = kv_ptr + row * kv_s_row + head * kv_s_head
    k = tl.load(base + s[:, None] * kv_s_pos + d[None, :], mask=keep[:, None], other=0.0).to(tl.float32)
    v = tl.load(base + kv_s_part + s[:, None] * kv_s_pos + d[None, :], mask=keep[:, None], other=0.0).to(tl.float32)
    scores = tl.where(keep, tl.sum(k * q[None, :], axis=1), float("-inf"))
    m = tl.max(scores, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)  # every slot of the split masked (or unfilled)
    p = tl.exp(scores - m_safe)
    parts = part_ptr + (row * heads + head) * SPLITS * (HEAD_DIM + 2)
    mine = parts + split * (HEAD_DIM + 2)
    tl.store(mine + d, tl.sum(p[:, None] * v, axis=0))
    tl.store(mine + HEAD_DIM, m)
    tl.store(mine + HEAD_DIM + 1, tl.sum(p, axis=0))
    # acq_rel: this program's stores are visible to whoever sees its increment.
    done = tl.atomic_add(count_ptr + row * heads + head, 1, sem="acq_rel")
    if done == SPLITS - 1:
        sp = tl.arange(0, MAX_SPLITS)
        ms = tl.load(parts + sp * (HEAD_DIM + 2) + HEAD_DIM, mask=sp < SPLITS, other=float("-inf"), cache_modifier=".cg")
        ls = tl.load(parts + sp * (HEAD_DIM + 2) + HEAD_DIM + 1, mask=sp < SPLITS, other=0.0, cache_modifier=".cg")
        accs = tl.load(parts + sp[:, None] * (HEAD_DIM + 2) + d[None, :], mask=(sp < SPLITS)[:, None], other=0.0,
                       cache_modifier=".cg")
        w = tl.exp(ms - tl.max(ms, axis=0))  # the max is finite: this token's own slot is attended
        total = tl.sum(accs * w[:, None], axis=0) / tl.sum(ls * w, axis=0)
        tl.store(out_ptr + row * out_stride + head * HEAD_DIM + d, total.to(out_ptr.dtype.element_ty))
        tl.store(count_ptr + row * heads + head, 0)


_row_linear_kernel = triton.jit(_row_linear)
_attention_split_kernel = triton.jit(_attention_split)


def _pdl(device: torch.device) -> bool:
    """Launch with programmatic dependent launch: on CUDA devices of compute capability 9+,
    when Triton has it."""
    if device.type != "cuda" or gdc_wait is None:
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def interpreted(device: torch.device) -> bool:
    """Whether kernels for tensors on ``device`` run through Triton's interpreter (CPU
    tensors, with :data:`INTERPRETER` on).

    Raises:
        ValueError: for CPU tensors without the interpreter.
    """
    if device.type == "cuda":
        return False
    if not INTERPRETER:
        raise ValueError("the decoding kernels run on CUDA tensors (or on the CPU with TRITON_INTERPRET=1 set before importing triton)")
    return True


def tiles(n: int, k: int, interpreter: bool = False) -> tuple:
    """``(block_n, block_k, num_warps)`` for an ``n x k`` matrix-vector product.

    From ``benchmarks/decode_kernels.py`` on an H100 (GPT-2 small, bf16, microseconds per
    launch in a CUDA graph, weights read from memory, with programmatic dependent launch):
    a few hundred programs or more keep every SM reading, the whole input row in one tile
    lets the weights' load start at once, and a long row (k >= 2048) is best one output per
    program. Chosen: 2304 x 768 (4, 1024, 2) 2.86 us, 768 x 768 (2, 1024, 4) 1.61 us,
    3072 x 768 (4, 1024, 2) 3.16 us, 768 x 3072 (1, 4096, 4) 2.47 us, against cuBLAS's 4.7,
    4.2, 4.9 and 7.6 us (without the fused LayerNorm, GELU or residual).
    The interpreter runs programs one after another: few, wide ones.
    """
    if interpreter:
        return min(64, triton.next_power_of_2(n)), min(256, triton.next_power_of_2(k)), 4
    block_k = min(triton.next_power_of_2(k), 4096)  # the whole row in one tile up to 4096 inputs
    if k >= 2048:
        return 1, block_k, 4
    block_n = 4
    while block_n > 1 and n // block_n < 384:
        block_n //= 2
    return block_n, block_k, 2 if block_n >= 4 else 4


# Both launchers run outside torch.compile's graphs (a graph break each): Dynamo would not pass
# the launch_pdl option through, and inside a captured CUDA graph the breaks cost nothing
# (H100, GPT-2 small batch 1: 3,019 tokens/s traced, without PDL, against 3,560 with it).
@torch.compiler.disable
def row_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, *, ln: Optional[tuple] = None,
               activation: Optional[str] = None, residual: Optional[Tensor] = None, out: Optional[Tensor] = None,
               kv: Optional[Tensor] = None, write_index: Optional[Tensor] = None, num_heads: int = 1,
               tile: Optional[tuple] = None) -> Tensor:
    """``[residual +] act(LN(x) W^T + b)`` for a few rows, one program per ``block_n`` features.

    Args:
        x: ``(rows, in_features)``, last dimension contiguous.
        weight: ``(out_features, in_features)``, contiguous; bias ``(out_features,)`` or None.
        ln: ``(weight, bias, eps)`` of a LayerNorm applied to ``x`` first, or None.
        activation: a name in :data:`ACTIVATION_CODES` (None: none).
        residual: ``(rows, out_features)`` added last.
        out: where to write ``(rows, out_features)`` (a new tensor by default); with ``kv``
            only the first third (q) goes here, ``(rows, out_features // 3)``.
        kv: a layer's KV cache ``(2, rows, heads, max_len, head_dim)``; features
            ``[H, 2H)`` and ``[2H, 3H)`` are written to ``kv[0]``/``kv[1]`` at ``write_index``.
        write_index: ``(1,)`` long tensor, the cache slot to write (with ``kv``).
        num_heads: heads of the cache (with ``kv``).
        tile: ``(block_n, block_k, num_warps)`` instead of :func:`tiles`' choice (benchmarks).

    Returns:
        ``out``.
    """
    rows, k = x.shape
    n = weight.shape[0]
    if x.stride(1) != 1 or not weight.is_contiguous():
        raise ValueError("row_linear needs x with a contiguous last dimension and a contiguous weight")
    hidden = n // 3 if kv is not None else n
    if out is None:
        out = torch.empty(rows, hidden, dtype=x.dtype, device=x.device)
    block_n, block_k, warps = tile or tiles(n, k, interpreted(x.device))
    ln_w, ln_b, eps = ln if ln is not None else (x, x, 0.0)
    dummy = out
    kv_t = kv if kv is not None else dummy
    kv_strides = (kv.stride(0), kv.stride(1), kv.stride(2), kv.stride(3)) if kv is not None else (0, 0, 0, 0)
    res = residual if residual is not None else dummy
    pdl = _pdl(x.device)
    launch = {} if interpreted(x.device) else {"num_warps": warps, **({"launch_pdl": True} if pdl else {})}
    _row_linear_kernel[(triton.cdiv(n, block_n), rows)](
        x, x.stride(0), ln_w, ln_b if ln_b is not None else ln_w, float(eps), weight, bias if bias is not None else weight,
        res, res.stride(0), out, out.stride(0), kv_t, *kv_strides,
        write_index if write_index is not None else dummy, n, k, hidden, hidden // num_heads,
        HAS_LN=ln is not None, HAS_BIAS=bias is not None, ACT=ACTIVATION_CODES[activation], HAS_RES=residual is not None,
        KV=kv is not None, BLOCK_N=block_n, BLOCK_K=block_k, PDL=pdl, **launch)
    return out


@torch.compiler.disable
def decode_attention(q: Tensor, kv: Tensor, key_mask: Tensor, write_index: Tensor, scale: float,
                     out: Optional[Tensor] = None, block_s: int = 64, num_warps: int = 4,
                     counters: Optional[Tensor] = None) -> Tensor:
    """Attention of one new query per row over the filled slots of a static KV cache.

    Split over the cache (flash-decoding): one program per (head, ``block_s`` slots, row)
    computes its slots' partial softmax in one pass; the last of a head's programs to finish
    combines them (one launch). A single program per head walking the slots in a loop was
    latency-bound (H100: 10 us over 288 slots against 3.2 us for 64); split, the time hardly
    grows with the length.

    Args:
        q: ``(rows, heads * head_dim)``, last dimension contiguous.
        kv: ``(2, rows, heads, max_len, head_dim)`` with this step's keys/values written.
        key_mask: ``(rows, max_len)`` bool/uint8, nonzero where a slot may be attended (this
            token's slot included; slots after ``write_index`` are never read).
        write_index: ``(1,)`` long, this token's slot.
        scale: score scale (``1/sqrt(head_dim)``).
        block_s, num_warps: cache slots per program; warps per program.
        counters: ``(rows * heads,)`` int32 zeros, reused across calls (each call leaves
            them zero); None allocates them (one more small kernel per call).

    Returns:
        ``(rows, heads * head_dim)``.
    """
    _, rows, heads, max_len, head_dim = kv.shape
    if kv.stride(4) != 1 or key_mask.stride(1) != 1:
        raise ValueError("decode_attention needs a cache and a key mask contiguous in their last dimension")
    if out is None:
        out = torch.empty(rows, heads * head_dim, dtype=q.dtype, device=q.device)
    splits = triton.cdiv(max_len, block_s)
    parts = torch.empty(rows, heads, splits, head_dim + 2, dtype=torch.float32, device=q.device)
    if counters is None:
        counters = torch.zeros(rows * heads, dtype=torch.int32, device=q.device)
    elif counters.numel() < rows * heads or counters.dtype != torch.int32:
        raise ValueError(f"counters must hold {rows * heads} int32 zeros")
    pdl = _pdl(q.device)
    launch = {} if interpreted(q.device) else {"num_warps": num_warps, **({"launch_pdl": True} if pdl else {})}
    _attention_split_kernel[(heads, splits, rows)](
        q, q.stride(0), kv, kv.stride(0), kv.stride(1), kv.stride(2), kv.stride(3), key_mask, key_mask.stride(0),
        parts, counters, out, out.stride(0), write_index, float(scale), splits, HEAD_DIM=head_dim, BLOCK_S=block_s,
        MAX_SPLITS=triton.next_power_of_2(splits), PDL=pdl, **launch)
    return out
