"""One-row linears as fused reductions, for compiled batch-1 decoding.

Decoding one token for one sequence multiplies a single row by every weight matrix. cuBLAS
serves that with GEMM kernels built for many rows: on an H100/H200 each takes 4-5 us for a
768 x 2304 matrix that a bandwidth-bound read finishes in about 1 us, and GPT-2 small runs
48 of them per token. Written as a broadcast multiply and a sum over the input features,
``(x[..., None, :] * W).sum(-1)``, the same product becomes a reduction that Inductor emits
as one Triton kernel per matrix (bias, and often the GELU or residual add that follows,
fused in), reading the matrix once. Measured (``benchmarks/decode_variants.py``, H200,
GPT-2 small bf16): 2,109 -> 2,295 tokens/s, greedy tokens unchanged.

Only inside a compiled graph: eagerly, the multiply would materialise the whole
``(out, in)`` product, so outside ``torch.compile`` (and for more than one row) the
modules here are exactly the plain ``F.linear``. Swap them in with :func:`one_row_linears`.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import FusedQKVAttention
from ._swap import swap

__all__ = ["OneRowLinear", "OneRowFusedQKVAttention", "one_row_linear", "one_row_linears"]


def one_row_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """``F.linear(x, weight, bias)``; a single row inside a compiled graph as multiply + sum.

    Args:
        x: ``(..., in_features)``.
        weight: ``(out_features, in_features)``; bias: ``(out_features,)`` or None.

    Returns:
        ``(..., out_features)``, multiplied and summed in float32 (as a GEMM accumulates)
        and returned in ``x``'s dtype.
    """
    if not torch.compiler.is_compiling() or x.shape[:-1].numel() != 1:
        return F.linear(x, weight, bias)
    # Products and sum in float32, as a GEMM computes them (inside the compiled kernel the
    # upcast happens in registers: the matrix is still read once, in its own dtype).
    acc = torch.promote_types(x.dtype, torch.float32)  # never below float32 (float64 stays float64)
    out = (x.unsqueeze(-2).to(acc) * weight.to(acc)).sum(-1)
    if bias is not None:
        out = out + bias
    return out.to(x.dtype)


class OneRowLinear(nn.Linear):
    """``nn.Linear`` computing through :func:`one_row_linear` (same parameters, same function)."""

    def forward(self, x: Tensor) -> Tensor:
        """Args: x ``(..., in_features)``. Returns ``(..., out_features)``."""
        return one_row_linear(x, self.weight, self.bias)


class OneRowFusedQKVAttention(FusedQKVAttention):
    """:class:`~ctxkit.fast.attention.FusedQKVAttention` whose concatenated q/k/v product
    goes through :func:`one_row_linear`."""

    _linear = staticmethod(one_row_linear)


def one_row_linears(model: nn.Module) -> int:
    """Swap ``model``'s plain ``nn.Linear`` layers to :class:`OneRowLinear` and its fused
    attention modules to :class:`OneRowFusedQKVAttention`, in place; idempotent. Returns how
    many modules are in that form. Eager calls and batches of more than one row are
    unchanged; a compiled one-row call reads each matrix in one fused reduction."""
    count = 0
    for module in model.modules():
        if type(module) is nn.Linear or type(module) is OneRowLinear:
            swap(module, OneRowLinear)
            count += 1
        elif isinstance(module, FusedQKVAttention) and getattr(module, "fused_qkv", None) is None:
            swap(module, OneRowFusedQKVAttention)
            count += 1
    return count
