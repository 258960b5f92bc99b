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

``convert_to_fp8(model, scope="norm_inputs")`` converts only the products whose input
comes straight from a LayerNorm -- self-attention's q/k/v and the FFN's first product --
and runs them as :class:`Fp8EpilogueLinear`: the input's row scales and float8 cast are
computed next to the norm (``torch.compile`` fuses them into the norm's kernel, a
persistent reduction over the row), and the product is a Triton GEMM
(:mod:`ctxkit.fast.gemm_kernels`) whose epilogue applies both scales, the bias and, for
the FFN, the exact GELU before one rounding to bf16. The attention output projection and
the FFN's second product (whose inputs no norm precedes: quantising them per row costs a
pass of its own) stay bf16.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.errors import UserError
from ..layers.attention import MultiHeadAttention
from ..layers.ffn import PositionwiseFFN
from ..layers.transformer import TransformerDecoderLayer, TransformerEncoderLayer
from . import gelu_gemm  # _runs_on / _load_kernels: the Triton GEMM (module attribute: tests patch it)
from .attention import FusedQKVAttention
from ._swap import swap

__all__ = ["FP8_MAX", "FP8_SCOPES", "Fp8EpilogueLinear", "Fp8GeluFFN", "Fp8Linear", "convert_to_fp8"]

FP8_SCOPES = ("all", "norm_inputs")

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


def _fp8_epilogue_op(q: Tensor, x_scale: Tensor, qweight: Tensor, w_scale: Tensor, bias: Tensor, gelu: bool) -> Tensor:
    return gelu_gemm._load_kernels().linear_epilogue(q, qweight, bias, epilogue="gelu" if gelu else "bias", x_scale=x_scale,
                                           w_scale=w_scale, out_dtype=bias.dtype)[0]


_fp8_epilogue = torch.library.custom_op("ctxkit::fp8_linear_epilogue", _fp8_epilogue_op, mutates_args=())


@_fp8_epilogue.register_fake
def _(q: Tensor, x_scale: Tensor, qweight: Tensor, w_scale: Tensor, bias: Tensor, gelu: bool) -> Tensor:
    return q.new_empty(q.shape[0], qweight.shape[0], dtype=bias.dtype)


class Fp8EpilogueLinear(Fp8Linear):
    """:class:`Fp8Linear` whose scales, bias and optional exact GELU are applied in the GEMM's
    epilogue (float32, one rounding to ``out_dtype``): a Triton kernel on Hopper GPUs with
    the ``gpu`` extra (:func:`ctxkit.fast.gemm_kernels.linear_epilogue`); elsewhere the same
    arithmetic in PyTorch (float32 sums of the exact e4m3 products, then scales, bias, GELU).

    Args:
        linear: the layer to convert (dimensions multiples of 16, with a bias).
        activation: ``"gelu"`` (erf) applied after the bias, or None.
        out_dtype: dtype of the result (bf16 by default).

    Shapes: ``x (..., in_features)`` -> ``(..., out_features)``.
    """

    def __init__(self, linear: nn.Linear, activation: Optional[str] = None, out_dtype: torch.dtype = torch.bfloat16):
        if linear.bias is None:
            raise UserError("Fp8EpilogueLinear needs a Linear with a bias")
        if activation not in (None, "gelu"):
            raise UserError(f"Fp8EpilogueLinear: activation must be None or 'gelu', got {activation!r}")
        super().__init__(linear, out_dtype)
        self.activation = activation

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features)
        # Written next to the producer of x so that torch.compile fuses the row maximum and
        # the cast into that kernel (a LayerNorm: a persistent reduction over the row).
        scale = _row_scales(rows)
        q = (rows.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        gelu = self.activation == "gelu"
        if gelu_gemm._runs_on(x.device.type, x.device.index):
            y = _fp8_epilogue(q, scale.view(-1), self.qweight, self.weight_scale.view(-1), self.bias, gelu)
        else:
            if x.is_cuda:  # cuBLAS (a GPU without the kernels): bias and GELU after the product
                acc = torch._scaled_mm(q, self.qweight.t(), scale_a=scale, scale_b=self.weight_scale, out_dtype=torch.float32)
            else:
                acc = (q.float() @ self.qweight.float().t()) * scale * self.weight_scale
            acc = acc + self.bias.float()
            y = (F.gelu(acc) if gelu else acc).to(self.out_dtype)
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", epilogue: scales, bias{' and GELU' if self.activation else ''}"


class Fp8GeluFFN(PositionwiseFFN):
    """:class:`~ctxkit.layers.ffn.PositionwiseFFN` (erf GELU) whose ``fc1`` is an
    :class:`Fp8EpilogueLinear` computing ``gelu(fc1(x))`` itself; ``fc2`` stays as it was."""

    def forward(self, x: Tensor) -> Tensor:
        """Args: x ``(batch, seq, dim)``. Returns ``(batch, seq, dim)``."""
        return self.fc2(self.dropout(self.fc1(x)))


def _fused_qkv_linear(attn: MultiHeadAttention) -> Optional[nn.Linear]:
    """q, k and v of a self-attention's shared input as one Linear (None for other attentions)."""
    projs = (attn.q_proj, attn.k_proj, attn.v_proj)
    if not (all(type(p) is nn.Linear for p in projs) and len({(p.in_features, p.bias is None) for p in projs}) == 1):
        return None
    qkv = nn.Linear(projs[0].in_features, sum(p.out_features for p in projs), bias=projs[0].bias is not None,
                    device=projs[0].weight.device, dtype=projs[0].weight.dtype)
    with torch.no_grad():
        qkv.weight.copy_(torch.cat([p.weight for p in projs]))
        if qkv.bias is not None:
            qkv.bias.copy_(torch.cat([p.bias for p in projs]))
    return qkv


def convert_to_fp8(model: nn.Module, scope: str = "all") -> int:
    """Run the Transformer layers' products of ``model`` in float8 (in place); returns how
    many Linears were converted.

    Args:
        model: a model with ctxkit Transformer layers.
        scope: ``"all"``: the q/k/v/output projections and both FFN products of every
            layer become :class:`Fp8Linear` (self-attention's q/k/v as one fp8 GEMM,
            :class:`~ctxkit.fast.attention.FusedQKVAttention`, the input quantised once).
            ``"norm_inputs"``: only self-attention's q/k/v (as one product) and the erf-GELU
            FFNs' first product, the products a LayerNorm feeds, as
            :class:`Fp8EpilogueLinear` (bias and GELU in the epilogue); the rest stays bf16.

    Raises:
        UserError: for an unknown scope, or when the model has no ctxkit Transformer layers.
    """
    if scope not in FP8_SCOPES:
        raise UserError(f"fp8 scope must be one of {FP8_SCOPES}, got {scope!r}")
    layers = [m for m in model.modules() if isinstance(m, (TransformerEncoderLayer, TransformerDecoderLayer))]
    if not layers:
        raise UserError(f"{type(model).__name__} has no ctxkit Transformer layers to convert to fp8")
    count = 0
    if scope == "norm_inputs":
        for layer in layers:
            attn = layer.self_attn
            qkv = _fused_qkv_linear(attn) if type(attn) in (MultiHeadAttention, FusedQKVAttention) else None
            if qkv is not None and qkv.bias is not None:
                swap(attn, FusedQKVAttention)
                attn.fused_qkv = Fp8EpilogueLinear(qkv)
                count += 3
            for ffn in [m for m in layer.modules() if type(m) is PositionwiseFFN and m.activation_name == "gelu"]:
                if type(ffn.fc1) is nn.Linear and ffn.fc1.bias is not None:
                    ffn.fc1 = Fp8EpilogueLinear(ffn.fc1, activation="gelu")
                    swap(ffn, Fp8GeluFFN)
                    count += 1
        return count
    for attn in [m for layer in layers for m in layer.modules() if isinstance(m, MultiHeadAttention)]:
        qkv = _fused_qkv_linear(attn)
        if qkv is not None:
            # Self-attention: q, k and v from one fp8 GEMM (the input quantised once).
            swap(attn, FusedQKVAttention)
            attn.fused_qkv = Fp8Linear(qkv)
    for layer in layers:
        for parent in list(layer.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is nn.Linear:  # (q/k/v too: cross-attention and sparse queries use them)
                    setattr(parent, name, Fp8Linear(child))
                    count += 1
    return count
