"""Triton kernel for :mod:`ctxkit.fast.dropout`: dropout keep-masks as packed bits.

One Philox-4x32-10 evaluation makes 128 random bits. PyTorch's Bernoulli kernel turns them
into 4 float uniforms (4 mask elements), Inductor's fused dropout into 1; here they become
8 uniforms of 16 bits each, compared with ``p`` rounded to a multiple of 2^-16, and the 8
outcomes are packed into one byte. At BERT-base's 32768 x 768 activations that is 3.1 M
Philox evaluations and a 3 MB mask instead of 6.3 M (25 M) and 25 MB: the kernel is
about a quarter of PyTorch's, and the norm kernels that read the mask read 8x fewer bytes.

Importing this module needs ``triton`` (the ``gpu`` extra).
"""

from __future__ import annotations

import os
from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["INTERPRETER", "keep_bits", "supported"]

INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _byte(w0, w1, w2, w3, threshold):
    """8 keep bits from four 32-bit words: each 16-bit half kept when >= threshold."""
    b = ((w0 & 0xFFFF) >= threshold).to(tl.uint32)
    b |= ((w0 >> 16) >= threshold).to(tl.uint32) << 1
    b |= ((w1 & 0xFFFF) >= threshold).to(tl.uint32) << 2
    b |= ((w1 >> 16) >= threshold).to(tl.uint32) << 3
    b |= ((w2 & 0xFFFF) >= threshold).to(tl.uint32) << 4
    b |= ((w2 >> 16) >= threshold).to(tl.uint32) << 5
    b |= ((w3 & 0xFFFF) >= threshold).to(tl.uint32) << 6
    b |= ((w3 >> 16) >= threshold).to(tl.uint32) << 7
    return b


@triton.jit
def _keep_bits_kernel(out_ptr, seed_ptr, n_bytes, threshold, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    seed = tl.load(seed_ptr)
    # One Philox evaluation per output byte, counter = the byte's index (unique per call's seed).
    w0, w1, w2, w3 = tl.randint4x(seed, offs)
    tl.store(out_ptr + offs, _byte(w0, w1, w2, w3, threshold).to(tl.uint8), mask=offs < n_bytes)


def supported(device: torch.device) -> Optional[str]:
    """Why :func:`keep_bits` cannot run on ``device`` (None when it can)."""
    if device.type == "cuda" or (device.type == "cpu" and INTERPRETER):
        return None
    return "CPU tensors run only through Triton's interpreter (TRITON_INTERPRET=1)"


def keep_bits(n: int, threshold: int, device: torch.device) -> Tensor:
    """``ceil(n / 8)`` bytes whose bits (least significant first) keep each of ``n``
    elements with probability ``1 - threshold / 2**16``, drawn from a seed that the default
    generator of ``device`` makes (so seeding, RNG state and CUDA-graph replays behave as
    for PyTorch's own random ops)."""
    if not 0 <= threshold <= 1 << 16:
        raise ValueError(f"keep_bits: threshold must be in [0, 65536], got {threshold}")
    n_bytes = (n + 7) // 8
    out = torch.empty(n_bytes, dtype=torch.uint8, device=device)
    seed = torch.randint(0, 2 ** 62, (1,), dtype=torch.int64, device=device)
    block = 1024
    _keep_bits_kernel[(triton.cdiv(n_bytes, block),)](out, seed, n_bytes, threshold, BLOCK=block)
    return out
