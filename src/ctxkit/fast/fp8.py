"""FP8 (e4m3) matrix products for encoder inference: a separate, declared precision.

Hopper GPUs multiply float8 matrices at twice their bf16 rate. :class:`Fp8Linear` keeps a
Linear layer's weight in ``float8_e4m3fn`` with one scale per output channel and
quantises its input per row on the fly (scale = row max / 448, e4m3's largest value),
then calls ``torch._scaled_mm``, which rescales the fp32 accumulators and writes bf16.
Only the Transformer layers' projections and FFN are converted (embeddings, norms,
softmax, the pooler and the task head stay bf16), so the error is a per-GEMM rounding of
~2^-4 relative on each input row and weight row; `benchmarks/fp8_accuracy.py` measures
what that does to a fine-tuned classifier's accuracy.

``torch._scaled_mm`` also runs on CPU (slowly), which is how the tests and the accuracy
benchmark check the arithmetic without a GPU. (On the CPU the same arithmetic is spelled
out, see :meth:`Fp8Linear.forward`.)
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from ..core.errors import UserError
from ..layers.attention import MultiHeadAttention
from ..layers.transformer import TransformerDecoderLayer, TransformerEncoderLayer
from .attention import FusedQKVAttention
from ._swap import swap

__all__ = ["FP8_MAX", "Fp8Linear", "convert_to_fp8"]

FP8_MAX = float(torch.finfo(torch.float8_e4m3fn).max)  # 448


def _row_scales(x: Tensor) -> Tensor:
    """``(rows, 1)`` fp32 scales mapping each row's largest magnitude to ``FP8_MAX``."""
    return x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12) / FP8_MAX


class Fp8Linear(nn.Module):
    """``y = x W^T + b`` with ``W`` in float8 (per-output-channel scales) and ``x``
    quantised per row at call time.

    Args:
        linear: the layer to convert; its ``in_features`` and ``out_features`` must be
            multiples of 16 (``torch._scaled_mm``'s alignment).
        out_dtype: dtype of the result (bf16 by default).

    Shapes: ``x (..., in_features)`` -> ``(..., out_features)``.
    """

    # Not a Tensor: FusedQKVAttention then calls q/k/v one by one instead of concatenating
    # their weights into one bf16 GEMM.
    weight = None

    def __init__(self, linear: nn.Linear, out_dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        if linear.in_features % 16 or linear.out_features % 16:
            raise UserError(f"fp8 needs dimensions that are multiples of 16, got {linear.in_features} -> {linear.out_features}")
        self.in_features, self.out_features, self.out_dtype = linear.in_features, linear.out_features, out_dtype
        w = linear.weight.detach().float()
        scale = _row_scales(w)  # (out, 1)
        self.register_buffer("qweight", (w / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn))  # (out, in)
        self.register_buffer("weight_scale", scale.t().contiguous())  # (1, out): scale_b of _scaled_mm
        bias: Optional[Tensor] = linear.bias.detach().to(out_dtype) if linear.bias is not None else None
        self.register_buffer("bias", bias)

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features)
        scale = _row_scales(rows)
        q = (rows.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        if x.is_cuda:
            # qweight.t() is column-major, the layout _scaled_mm wants for its second operand.
            y = torch._scaled_mm(q, self.qweight.t(), scale_a=scale, scale_b=self.weight_scale, out_dtype=self.out_dtype)
        else:
            # CPU: the same arithmetic spelled out (e4m3 products are exact in fp32; the sums
            # accumulate unscaled, then both scales apply), since torch's CPU _scaled_mm takes
            # row-wise scales only from 2.13 on.
            y = ((q.float() @ self.qweight.float().t()) * scale * self.weight_scale).to(self.out_dtype)
        if self.bias is not None:
            y = y + self.bias  # outside the GEMM: fused into the next elementwise op under torch.compile
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, float8_e4m3fn weights, row-wise scales"


def convert_to_fp8(model: nn.Module) -> int:
    """Replace the q/k/v/output projections and FFN Linears of every ctxkit Transformer
    layer in ``model`` by :class:`Fp8Linear` (in place); returns how many. Self-attention
    becomes a :class:`~ctxkit.fast.attention.FusedQKVAttention` whose ``fused_qkv`` is one
    fp8 GEMM for q, k and v (the input quantised once).

    Raises:
        ValueError: when the model has no ctxkit Transformer layers.
    """
    layers = [m for m in model.modules() if isinstance(m, (TransformerEncoderLayer, TransformerDecoderLayer))]
    if not layers:
        raise UserError(f"{type(model).__name__} has no ctxkit Transformer layers to convert to fp8")
    count = 0
    for attn in [m for layer in layers for m in layer.modules() if isinstance(m, MultiHeadAttention)]:
        projs = (attn.q_proj, attn.k_proj, attn.v_proj)
        if all(type(p) is nn.Linear for p in projs) and len({(p.in_features, p.bias is None) for p in projs}) == 1:
            # Self-attention: q, k and v from one fp8 GEMM (the input quantised once).
            qkv = nn.Linear(projs[0].in_features, sum(p.out_features for p in projs), bias=projs[0].bias is not None,
                            device=projs[0].weight.device, dtype=projs[0].weight.dtype)
            with torch.no_grad():
                qkv.weight.copy_(torch.cat([p.weight for p in projs]))
                if qkv.bias is not None:
                    qkv.bias.copy_(torch.cat([p.bias for p in projs]))
            swap(attn, FusedQKVAttention)
            attn.fused_qkv = Fp8Linear(qkv)
    for layer in layers:
        for parent in list(layer.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is nn.Linear:  # (q/k/v too: cross-attention and sparse queries use them)
                    setattr(parent, name, Fp8Linear(child))
                    count += 1
    return count
