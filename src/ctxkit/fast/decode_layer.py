"""A pre-norm Transformer layer whose one-token decoding step is five Triton kernels.

Batch-1 decoding of a small model is bound by kernel count, not by arithmetic or memory:
GPT-2 small launched ~129 kernels per token (H100, compiled, in a CUDA graph), most of them
a few microseconds of fixed cost. :class:`FusedDecodeLayer` computes the same layer with
the five kernels of :mod:`ctxkit.fast.decode_kernels` when it decodes one position per row
over a static KV cache (the path :class:`~ctxkit.decoding.static_decode.StaticDecoder`
captures in a CUDA graph); every other call (training, prompts, CPU without Triton) is the
plain :class:`~ctxkit.layers.transformer.TransformerEncoderLayer`.

Swap it in with :func:`fuse_decode_layers`. It changes the class of each eligible layer,
never its parameters (``state_dict`` unchanged), and is idempotent.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import Tensor, nn

from ..layers.attention import MultiHeadAttention
from ..layers.ffn import PositionwiseFFN
from ..layers.transformer import TransformerEncoderLayer
from .attention import FusedQKVAttention, fuse_qkv
from .rows import OneRowFusedQKVAttention, OneRowLinear
from ._swap import swap, unswap
from .kernels import has_package

_kernels = None  # ctxkit.fast.decode_kernels once a layer is fused (it imports triton: the gpu extra)
# Activations the kernels compute (decode_kernels.ACTIVATION_CODES; tests check the two agree).
FUSED_ACTIVATIONS = ("gelu_new", "gelu_tanh", "gelu_pytorch_tanh", "gelu", "relu")

__all__ = ["FUSED_ACTIVATIONS", "FusedDecodeLayer", "decode_kernels_available", "fuse_decode_layers", "unfuse_decode_layers", "why_not_fused"]

_ATTENTION_TYPES = (MultiHeadAttention, FusedQKVAttention, OneRowFusedQKVAttention)
_LINEAR_TYPES = (nn.Linear, OneRowLinear)


def decode_kernels_available() -> bool:
    """Whether Triton is installed (the kernels need it; ``pip install ctxkit[gpu]``;
    :func:`ctxkit.fast.kernels.supported` ``("decode_layers", device)`` says where they run)."""
    return has_package("triton")


#: FusedDecodeLayer._step_kernels behind torch.compiler.disable (set by fuse_decode_layers)
_disabled_step = None


def _load_kernels():
    global _kernels
    if _kernels is None:
        from . import decode_kernels  # lazy: imports triton (the gpu extra), only when a layer is fused

        _kernels = decode_kernels
    return _kernels


def why_not_fused(layer: nn.Module) -> Optional[str]:
    """Why ``layer`` cannot use the fused decoding step (None when it can)."""
    if not isinstance(layer, TransformerEncoderLayer):
        return f"{type(layer).__name__} is not a TransformerEncoderLayer"
    attn, ffn = layer.self_attn, layer.ffn
    if type(attn) not in _ATTENTION_TYPES or getattr(attn, "fused_qkv", None) is not None:
        return f"attention {type(attn).__name__} has its own projection or score"
    if not all(type(p) in _LINEAR_TYPES and p.bias is not None for p in (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj)):
        return "attention projections are not plain Linears with biases"
    if attn.head_dim & (attn.head_dim - 1):
        return f"head size {attn.head_dim} is not a power of two"
    if type(ffn) is not PositionwiseFFN or ffn.activation_name not in FUSED_ACTIVATIONS:
        return f"FFN {type(ffn).__name__} / activation {getattr(ffn, 'activation_name', None)!r} has no fused kernel"
    if not all(type(p) in _LINEAR_TYPES and p.bias is not None for p in (ffn.fc1, ffn.fc2)):
        return "FFN projections are not plain Linears with biases"
    for res in (layer.self_attn_res, layer.ffn_res):
        if not res.norm_first:
            return "post-norm layer (the fused step is pre-norm)"
        if type(res.norm) is not nn.LayerNorm or res.norm.weight is None or res.norm.bias is None:
            return "norm is not an affine LayerNorm with bias"
    return None


class FusedDecodeLayer(TransformerEncoderLayer):
    """:class:`~ctxkit.layers.transformer.TransformerEncoderLayer` (pre-norm) whose step
    for one new position per row over a static KV cache runs five Triton kernels.

    The fused step runs when all hold: a static-mode cache, one position per row, at most
    ``max_rows`` rows, no
    attention weights or ``query_index`` asked for, eval mode, Triton importable, and the
    input on CUDA (or, with ``interpret_on_cpu`` set on the layer, on the CPU through
    Triton's interpreter, ``TRITON_INTERPRET=1``: how the tests check the kernels without a GPU). Otherwise the
    parent's forward runs.
    """

    interpret_on_cpu = False
    # Rows one fused step takes: every row re-reads the weights, so the kernels pay off for
    # matrix-vector work only (measured at batch 1; cuBLAS serves wider batches).
    max_rows = 1

    def _fused_applies(self, x: Tensor, mask, need_weights: bool, query_index, cache) -> bool:
        if cache is None or not cache.cache.is_static or need_weights or query_index is not None or self.training:
            return False
        if _kernels is None or x.dim() != 3 or x.size(1) != 1 or x.size(0) > self.max_rows:
            return False
        if not (x.is_cuda or self.interpret_on_cpu and _kernels.INTERPRETER):
            return False
        return mask is None or (isinstance(mask, Tensor) and mask.dtype == torch.bool
                                and mask.numel() == x.size(0) * cache.cache.max_len)

    def forward(self, x: Tensor, mask: Optional[Tensor] = None, need_weights: bool = False,
                query_index: Optional[Tensor] = None, cache=None) -> Tuple[Tensor, Optional[Tensor]]:
        """See :meth:`TransformerEncoderLayer.forward`; ``x (batch, 1, dim)`` with a static
        cache takes the fused step."""
        if self._fused_applies(x, mask, need_weights, query_index, cache):
            return self._fused_step(x, mask, cache), None
        return super().forward(x, mask, need_weights, query_index, cache)

    def _fused_step(self, x: Tensor, mask: Optional[Tensor], cache) -> Tensor:
        # Outside torch.compile's graphs (one graph break per layer; inside a captured CUDA
        # graph that costs nothing): traced, each layer's cache index specialised the graph,
        # one recompilation per layer up to Dynamo's limit. The disabled wrapper is made by
        # fuse_decode_layers, so importing ctxkit does not load Dynamo.
        return _disabled_step(self, x, mask, cache)

    def _step_kernels(self, x: Tensor, mask: Optional[Tensor], cache) -> Tensor:
        """``x (batch, 1, dim)`` -> ``(batch, 1, dim)``; writes this position's keys and
        values into the cache at its write index (the encoder advances it)."""
        batch, _, dim = x.shape
        attn, ffn = self.self_attn, self.ffn
        norm1, norm2 = self.self_attn_res.norm, self.ffn_res.norm
        kv = cache.cache.kv[cache.index]  # (2, batch, heads, max_len, head_dim)
        write_index = cache.cache.write_index
        if mask is None:
            key_mask = torch.ones(batch, kv.size(3), dtype=torch.bool, device=x.device)
        else:
            key_mask = mask.reshape(batch, kv.size(3))  # bool: Triton reads it as i1
        rows = x.reshape(batch, dim).contiguous()
        weight, bias = attn._fused([attn.q_proj, attn.k_proj, attn.v_proj])  # fuse_decode_layers fused attn
        q = _kernels.row_linear(rows, weight, bias, ln=(norm1.weight, norm1.bias, norm1.eps), kv=kv,
                                write_index=write_index, num_heads=attn.num_heads)
        # The attention kernel's per-head counters: zero between calls, kept (no memset per step).
        counters = getattr(self, "_attention_counters", None)
        if counters is None or counters.device != x.device or counters.numel() < batch * attn.num_heads:
            counters = self._attention_counters = torch.zeros(batch * attn.num_heads, dtype=torch.int32, device=x.device)
        heads = _kernels.decode_attention(q, kv, key_mask, write_index, 1.0 / math.sqrt(attn.head_dim), counters=counters)
        rows = _kernels.row_linear(heads, attn.out_proj.weight, attn.out_proj.bias, residual=rows)
        inner = _kernels.row_linear(rows, ffn.fc1.weight, ffn.fc1.bias, ln=(norm2.weight, norm2.bias, norm2.eps),
                                    activation=ffn.activation_name)
        rows = _kernels.row_linear(inner, ffn.fc2.weight, ffn.fc2.bias, residual=rows)
        return rows.view(batch, 1, dim)


def fuse_decode_layers(model: nn.Module, interpret_on_cpu: Optional[bool] = None) -> int:
    """Swap every eligible :class:`~ctxkit.layers.transformer.TransformerEncoderLayer` of
    ``model`` to :class:`FusedDecodeLayer` (in place, idempotent; attention is fused with
    :func:`~ctxkit.fast.attention.fuse_qkv` first). Returns how many layers are fused; 0
    when Triton is missing or no layer is eligible (:func:`why_not_fused` says why).

    Args:
        interpret_on_cpu: also take the fused step for CPU tensors, through Triton's
            interpreter (slow; for tests); None leaves each layer's setting as it is.
    """
    global _disabled_step
    if not decode_kernels_available():
        return 0
    _load_kernels()
    if _disabled_step is None:
        _disabled_step = torch.compiler.disable(FusedDecodeLayer._step_kernels)
    count = 0
    for module in list(model.modules()):
        if isinstance(module, TransformerEncoderLayer) and why_not_fused(module) is None:
            fuse_qkv(module)
            swap(module, FusedDecodeLayer)
            if interpret_on_cpu is not None:
                module.interpret_on_cpu = interpret_on_cpu
            count += 1
    return count


def unfuse_decode_layers(model: nn.Module) -> int:
    """Turn every :class:`FusedDecodeLayer` of ``model`` back into the plain layer (in
    place); returns how many. Graphs captured before keep the kernels they recorded."""
    count = 0
    for module in list(model.modules()):
        if unswap(module, FusedDecodeLayer):
            module.__dict__.pop("interpret_on_cpu", None)
            module.__dict__.pop("max_rows", None)
            module.__dict__.pop("_attention_counters", None)
            count += 1
    return count
