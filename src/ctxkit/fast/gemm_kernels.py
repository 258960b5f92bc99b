"""Triton GEMM with the feed-forward block's elementwise work in its epilogue.

A BERT feed-forward block computes ``gelu(x @ W1.T + b1)`` with the exact (erf) GELU.
cuBLASLt can add the bias in its epilogue but knows only the tanh GELU, so the exact
model pays a separate elementwise pass over the ``(tokens, 4h)`` activation: at batch
256 x 128 that is 200 MB read and 200 MB written per layer, ~0.16 ms on an H100 against
0.23 ms for the GEMM itself. Here the GEMM's epilogue does it while the tile is still in
registers:

* ``epilogue="gelu"``: ``out = gelu(acc + bias)`` (inference and the training forward; with
  ``pre_out`` the pre-activation ``acc + bias`` is stored too, for the backward);
* ``epilogue="gelu_grad"``: ``out = acc * gelu'(pre)`` -- the training backward's
  ``grad_pre = (grad_y @ W2) * gelu'(pre)``, the second product's input gradient and the
  GELU's derivative in one kernel (the weight read as ``(K, N)``, W2 as stored), with the
  first product's bias gradient ``grad_pre.sum(0)`` accumulated from each tile's column
  sums (float32 atomics);
* ``epilogue="bias"``: ``out = acc + bias`` (the plain linear, for comparison).

The kernel (:func:`linear_epilogue`) is persistent: one program per streaming
multiprocessor walks over output tiles (grouped along M so a group's weight tiles stay in
L2), each tile's K loop fed by the tensor memory accelerator (TMA) through host-side
tensor descriptors, products accumulated in float32 by ``tl.dot`` (wgmma on Hopper), the
epilogue applied to the float32 accumulator and rounded once to the output dtype. The
output is stored in ``EPI_SPLIT`` column slices to bound register pressure.

It needs Hopper or later (TMA) or Triton's interpreter (:data:`INTERPRETER`, used by the
CPU tests); :func:`supported` says whether a call would run here. Importing this module
needs ``triton`` (the ``gpu`` extra); :mod:`ctxkit.fast.ffn` falls back to PyTorch without it.
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple, Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - Triton < 3.4: supported() says no
    TensorDescriptor = None

__all__ = ["EPILOGUES", "INTERPRETER", "GemmConfig", "config_for", "linear_epilogue", "supported"]

INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"

EPILOGUES = {"bias": 0, "gelu": 1, "gelu_grad": 2}

# Globals a kernel reads must be constexpr.
_INV_SQRT_2PI = tl.constexpr(0.3989422804014327)  # 1 / sqrt(2 pi)


class GemmConfig(NamedTuple):
    """One tiling of :func:`linear_epilogue` (``block_n`` a power of two)."""

    block_m: int = 128
    block_n: int = 256
    block_k: int = 64
    group_m: int = 8
    stages: int = 3
    warps: int = 8
    epi_split: int = 2
    flatten: bool = True
    ctas_per_sm: int = 1  # persistent programs per multiprocessor (2: faster for the forward epilogues)
    warp_specialize: bool = False  # Triton's producer/consumer warp groups (Hopper: with flatten=False)


# Chosen on an H100 by `benchmarks/ffn_gemm.py --sweep` for BERT-base's (32768 x 768) @ (768 x 3072):
# the forward epilogues run best two programs per multiprocessor (staggering them so that one's GELU
# meets the other's products changed nothing), the backward's (which also loads pre) with one program of 128 x 256 tiles.
# group_m=1 (the tiles of one row block in turn: W, 4.7 MB, stays in L2 anyway) measured 2 % faster than 8
# for the GELU epilogue (0.316 vs 0.323 ms; bias only 0.245 vs 0.259).
DEFAULT_CONFIG = GemmConfig(block_m=128, block_n=128, block_k=64, group_m=1, stages=3, warps=8, epi_split=2,
                            flatten=True, ctas_per_sm=2)
GRAD_CONFIG = GemmConfig(block_m=128, block_n=256, block_k=64, group_m=8, stages=3, warps=8, epi_split=2,
                         flatten=True, ctas_per_sm=1)
# float8 operands: 128-byte K slices (one TMA swizzle row); chosen by `benchmarks/ffn_gemm.py --fp8 --sweep`.
FP8_CONFIG = GemmConfig(block_m=128, block_n=128, block_k=128, group_m=8, stages=3, warps=8, epi_split=2,
                        flatten=True, ctas_per_sm=2)

FP8 = torch.float8_e4m3fn


@triton.jit
def _tile_coords(tile, num_m, num_n, GROUP_M: tl.constexpr):
    # Grouped order: GROUP_M row-tiles share each column tile before moving on (L2 reuse of W).
    per_group = GROUP_M * num_n
    group = tile // per_group
    first_m = group * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (tile % per_group) % size_m
    pid_n = (tile % per_group) // size_m
    return pid_m, pid_n


# Abramowitz & Stegun 7.1.26 for Phi(-|x|) = erfc(|x| / sqrt 2) / 2, constants folded:
# t = 1 / (1 + p |x| / sqrt 2), Phi(-|x|) = (a1 t + ... + a5 t^5) / 2 * exp(-x^2 / 2).
_P = tl.constexpr(0.3275911 * 0.7071067811865476)
_A1 = tl.constexpr(0.254829592 / 2)
_A2 = tl.constexpr(-0.284496736 / 2)
_A3 = tl.constexpr(1.421413741 / 2)
_A4 = tl.constexpr(-1.453152027 / 2)
_A5 = tl.constexpr(1.061405429 / 2)
_NEG_HALF_LOG2E = tl.constexpr(-0.5 * 1.4426950408889634)  # exp(-x^2 / 2) = 2^(x^2 * this)
# On the GPU the reciprocal and the power of two are single PTX instructions (one special
# function unit operation each, no range fix-ups); Triton's interpreter runs no PTX.
_PTX = tl.constexpr(not INTERPRETER)


@triton.jit
def _rcp(x):
    if _PTX:
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True,
                                         pack=1)
    else:
        return 1.0 / x


@triton.jit
def _exp2(x):
    if _PTX:
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True,
                                         pack=1)
    else:
        return tl.math.exp2(x)


@triton.jit
def _normal_tail(x):
    """``(Phi(-|x|), exp(-x^2 / 2))`` in float32: erf by Abramowitz & Stegun 7.1.26
    (|error| < 1.5e-7), the tail as a product (no cancellation far out). The GELU's cost is
    what the epilogue adds to the GEMM, so this is written for instruction count: one fast
    reciprocal, one power of two, seven multiply-adds."""
    t = _rcp(1.0 + _P * tl.abs(x))
    poly = t * (_A1 + t * (_A2 + t * (_A3 + t * (_A4 + t * _A5))))
    e = _exp2(x * x * _NEG_HALF_LOG2E)
    return poly * e, e


@triton.jit
def _normal_cdf_pdf(x):
    """Phi(x) and phi(x) of the standard normal, in float32 (:func:`_normal_tail`; Phi to
    3e-7 with float32 rounding: 1/10,000 of bf16's rounding step near 1)."""
    tail, e = _normal_tail(x)
    cdf = tl.where(x >= 0, 1.0 - tail, tail)
    return cdf, e * _INV_SQRT_2PI


@triton.jit
def _gelu(x):
    """``x * Phi(x)`` as ``relu(x) - |x| Phi(-|x|)``: equal for either sign, and one
    multiply-add after the tail instead of a select, a subtraction and a product."""
    tail, _ = _normal_tail(x)
    return tl.maximum(x, 0.0) - tl.abs(x) * tail


@triton.jit
def _apply(acc, bias_ptr, pre_desc, out_desc, xs_ptr, ws_ptr, off_m, off_n, M, N,
           EPILOGUE: tl.constexpr, STORE_PRE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, OUT_DTYPE: tl.constexpr,
           SCALED: tl.constexpr):
    """Epilogue on one float32 (BM, BN) slice at (off_m, off_n); stores the result."""
    if SCALED:  # float8 operands: undo the row scales of x and the column scales of W first
        offs_m = off_m + tl.arange(0, BM)
        offs_c = off_n + tl.arange(0, BN)
        xs = tl.load(xs_ptr + offs_m, mask=offs_m < M, other=0.0)
        ws = tl.load(ws_ptr + offs_c, mask=offs_c < N, other=0.0)
        acc = acc * xs[:, None] * ws[None, :]
    if EPILOGUE == 2:  # acc * gelu'(pre); bias_ptr: the float32 bias gradient
        pre = pre_desc.load([off_m, off_n]).to(tl.float32)
        cdf, pdf = _normal_cdf_pdf(pre)
        out = acc * (cdf + pre * pdf)
        # Rows past M were loaded as zeros (TMA pads), so they add nothing to the sums.
        offs_n = off_n + tl.arange(0, BN)
        tl.atomic_add(bias_ptr + offs_n, tl.sum(out, axis=0), mask=offs_n < N, sem="relaxed")
    else:
        offs_n = off_n + tl.arange(0, BN)
        bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
        out = acc + bias[None, :]
        if STORE_PRE:
            pre_desc.store([off_m, off_n], out.to(OUT_DTYPE))
        if EPILOGUE == 1:
            out = _gelu(out)
    out_desc.store([off_m, off_n], out.to(OUT_DTYPE))


@triton.jit
def _linear_epilogue_kernel(a_desc, w_desc, out_desc, pre_desc, bias_ptr, xs_ptr, ws_ptr, M, N, K,
                            EPILOGUE: tl.constexpr, STORE_PRE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                            BK: tl.constexpr, GROUP_M: tl.constexpr, EPI_SPLIT: tl.constexpr,
                            NUM_PROGRAMS: tl.constexpr, FLATTEN: tl.constexpr, W_KN: tl.constexpr,
                            OUT_DTYPE: tl.constexpr, WS: tl.constexpr, SCALED: tl.constexpr):
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    num_tiles = num_m * num_n
    for tile in tl.range(tl.program_id(0), num_tiles, NUM_PROGRAMS, flatten=FLATTEN, warp_specialize=WS):
        pid_m, pid_n = _tile_coords(tile, num_m, num_n, GROUP_M)
        off_m = pid_m * BM
        off_n = pid_n * BN
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for ki in range(k_tiles):
            off_k = ki * BK
            a = a_desc.load([off_m, off_k])
            if W_KN:  # weight stored (K, N)
                acc = tl.dot(a, w_desc.load([off_k, off_n]), acc)
            else:  # weight stored (N, K), a Linear's layout
                acc = tl.dot(a, w_desc.load([off_n, off_k]).T, acc)
        if EPI_SPLIT == 1:
            _apply(acc, bias_ptr, pre_desc, out_desc, xs_ptr, ws_ptr, off_m, off_n, M, N, EPILOGUE, STORE_PRE, BM, BN,
                   OUT_DTYPE, SCALED)
        else:  # two column halves: half the epilogue's registers live at a time
            acc = tl.reshape(acc, (BM, 2, BN // 2))
            acc = tl.permute(acc, (0, 2, 1))
            left, right = tl.split(acc)
            _apply(left, bias_ptr, pre_desc, out_desc, xs_ptr, ws_ptr, off_m, off_n, M, N, EPILOGUE, STORE_PRE, BM,
                   BN // 2, OUT_DTYPE, SCALED)
            _apply(right, bias_ptr, pre_desc, out_desc, xs_ptr, ws_ptr, off_m, off_n + BN // 2, M, N, EPILOGUE, STORE_PRE,
                   BM, BN // 2, OUT_DTYPE, SCALED)


@functools.lru_cache(maxsize=None)
def _num_programs(device_index: int) -> int:  # streaming multiprocessors
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def supported(x: Tensor) -> Optional[str]:
    """Why :func:`linear_epilogue` cannot run on ``x``'s device (None when it can)."""
    if TensorDescriptor is None:
        return "Triton without tensor descriptors (needs Triton >= 3.4)"
    if x.is_cuda:
        if torch.cuda.get_device_capability(x.device)[0] < 9:
            return "the TMA GEMM needs a Hopper or later GPU (compute capability >= 9.0)"
        return None
    if not INTERPRETER:
        return "CPU tensors run only through Triton's interpreter (TRITON_INTERPRET=1)"
    return None


def config_for(m: int, n: int, k: int, epilogue: str = "gelu", fp8: bool = False) -> GemmConfig:
    """The tiling for an ``(m, k) @ (k, n)`` product with ``epilogue``: :data:`FP8_CONFIG`
    for float8 operands, :data:`GRAD_CONFIG` for ``"gelu_grad"`` on large products,
    :data:`DEFAULT_CONFIG` otherwise."""
    if fp8:
        return FP8_CONFIG
    if epilogue == "gelu_grad" and n >= 256 and m * n >= 132 * 128 * 256:
        return GRAD_CONFIG
    return DEFAULT_CONFIG


def _check(x: Tensor, weight: Tensor, k_axis: int) -> None:
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[k_axis]:
        raise ValueError(f"linear_epilogue: x {tuple(x.shape)} and weight {tuple(weight.shape)} do not multiply "
                         f"(x is (M, K); weight is {'(N, K)' if k_axis == 1 else '(K, N)'})")
    if x.dtype != weight.dtype or x.dtype not in (torch.bfloat16, torch.float16, FP8):
        raise ValueError(f"linear_epilogue: bf16, fp16 or float8_e4m3fn operands of one dtype (got {x.dtype}, {weight.dtype})")
    for name, t in (("x", x), ("weight", weight)):
        # TMA: unit stride along rows, the row stride and the base 16-byte aligned.
        if t.stride(1) != 1 or (t.stride(0) * t.element_size()) % 16 or t.data_ptr() % 16:
            raise ValueError(f"linear_epilogue: {name} must be row-major with 16-byte aligned rows")


def linear_epilogue(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, *, epilogue: str = "gelu",
                    pre: Optional[Tensor] = None, store_pre: bool = False, weight_kn: bool = False,
                    x_scale: Optional[Tensor] = None, w_scale: Optional[Tensor] = None,
                    out_dtype: Optional[torch.dtype] = None,
                    config: Optional[GemmConfig] = None) -> Tuple[Tensor, Optional[Tensor]]:
    """``x @ weight.T`` (or ``x @ weight`` with ``weight_kn``) with an epilogue, as one
    persistent TMA kernel.

    Args:
        x: ``(M, K)`` bf16/fp16, row-major.
        weight: ``(N, K)`` (a Linear's weight), or ``(K, N)`` with ``weight_kn``; x's dtype.
        bias: ``(N,)``; required by ``"bias"`` and ``"gelu"``.
        epilogue: ``"bias"`` (``acc + bias``), ``"gelu"`` (``gelu_erf(acc + bias)``) or
            ``"gelu_grad"`` (``acc * gelu_erf'(pre)``).
        pre: ``(M, N)`` pre-activation, required by ``"gelu_grad"``.
        store_pre: with ``"gelu"``, also return ``acc + bias`` (rounded to x's dtype).
        weight_kn: the weight is stored ``(K, N)`` (e.g. the second FFN product's weight
            when computing its input gradient), read as is: no transposed copy.
        x_scale, w_scale: float8 operands only (both ``float8_e4m3fn``, the weight
            ``(N, K)``): float32 ``(M,)`` row scales of x and ``(N,)`` row scales of the
            weight; the epilogue starts from ``acc * x_scale[:, None] * w_scale[None, :]``.
        out_dtype: the result's dtype (default x's; bf16 for float8 operands).
        config: the tiling (default: :func:`config_for`).

    Returns:
        ``(out, side)``: ``out`` ``(M, N)`` in x's dtype; ``side`` the stored pre-activation
        (``"gelu"`` with ``store_pre``), the float32 column sums of ``out`` (``"gelu_grad"``:
        the bias gradient of the product that made ``pre``), else None.
    """
    if epilogue not in EPILOGUES:
        raise ValueError(f"linear_epilogue: epilogue must be one of {sorted(EPILOGUES)}, got {epilogue!r}")
    why = supported(x)
    if why:
        raise RuntimeError(f"linear_epilogue: {why}")
    _check(x, weight, 0 if weight_kn else 1)
    m, k = x.shape
    n = weight.shape[1] if weight_kn else weight.shape[0]
    code = EPILOGUES[epilogue]
    fp8 = x.dtype == FP8
    if fp8:
        if weight_kn or code == 2 or store_pre:
            raise ValueError("linear_epilogue: float8 operands take an (N, K) weight and the 'bias' or 'gelu' epilogue")
        for name, t, size in (("x_scale", x_scale, m), ("w_scale", w_scale, n)):
            if t is None or t.shape != (size,) or t.dtype != torch.float32 or not t.is_contiguous():
                raise ValueError(f"linear_epilogue: float8 operands need a contiguous float32 {name} of shape ({size},)")
    elif x_scale is not None or w_scale is not None:
        raise ValueError("linear_epilogue: x_scale and w_scale go with float8 operands only")
    out_dtype = out_dtype or (torch.bfloat16 if fp8 else x.dtype)
    if out_dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"linear_epilogue: out_dtype must be bf16 or fp16, got {out_dtype}")
    if code != 2 and (bias is None or bias.shape != (n,)):
        raise ValueError(f"linear_epilogue: {epilogue!r} needs a bias of shape ({n},)")
    if code == 2 and (pre is None or pre.shape != (m, n) or pre.dtype != x.dtype or not pre.is_contiguous()):
        raise ValueError(f"linear_epilogue: 'gelu_grad' needs a contiguous {x.dtype} pre-activation of shape ({m}, {n})")
    cfg = config or config_for(m, n, k, epilogue, fp8=fp8)
    out = torch.empty(m, n, device=x.device, dtype=out_dtype)
    side = None
    if code == 1 and store_pre:
        side = torch.empty(m, n, device=x.device, dtype=x.dtype)
    elif code == 2:
        side = torch.zeros(n, device=x.device, dtype=torch.float32)
    half = cfg.block_n // cfg.epi_split
    a_desc = TensorDescriptor.from_tensor(x, [cfg.block_m, cfg.block_k])
    w_block = [cfg.block_k, cfg.block_n] if weight_kn else [cfg.block_n, cfg.block_k]
    w_desc = TensorDescriptor.from_tensor(weight, w_block)
    out_desc = TensorDescriptor.from_tensor(out, [cfg.block_m, half])
    # The side tensor's descriptor: pre read (gelu_grad) or written (store_pre); unused otherwise.
    pre_desc = TensorDescriptor.from_tensor(pre if code == 2 else (side if side is not None else out), [cfg.block_m, half])
    vector = side if code == 2 else bias
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    programs = min(tiles, cfg.ctas_per_sm * _num_programs(x.device.index or 0) if x.is_cuda else 4)
    # Unused scale pointers (half-precision operands) point at the bias / vector: never read.
    xs, ws = (x_scale, w_scale) if fp8 else (vector, vector)
    _linear_epilogue_kernel[(programs,)](
        a_desc, w_desc, out_desc, pre_desc, vector, xs, ws, m, n, k,
        EPILOGUE=code, STORE_PRE=code == 1 and store_pre, BM=cfg.block_m, BN=cfg.block_n, BK=cfg.block_k,
        GROUP_M=cfg.group_m, EPI_SPLIT=cfg.epi_split, NUM_PROGRAMS=programs, FLATTEN=cfg.flatten, W_KN=weight_kn,
        OUT_DTYPE=tl.bfloat16 if out_dtype == torch.bfloat16 else tl.float16, WS=cfg.warp_specialize, SCALED=fp8,
        num_stages=cfg.stages, num_warps=cfg.warps)
    return out, side
