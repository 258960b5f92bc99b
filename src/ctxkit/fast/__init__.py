"""Deployment fast paths, swapped into a built model.

The teaching layers (:mod:`ctxkit.layers`) compute each formula as the lecture writes it.
Each fast variant here is a subclass of the layer it speeds up, computing the same
function (or a declared approximation: fp8, the tanh-GELU epilogue, a bf16 stream) with
faster kernels:

* :class:`FusedQKVAttention` -- q, k, v of a shared input as one GEMM over cached
  concatenated weights (:func:`fuse_qkv`);
* :class:`Fp8Linear` -- float8 e4m3 GEMMs for the Transformer layers (:func:`convert_to_fp8`);
  :class:`Fp8EpilogueLinear` / :class:`Fp8GeluFFN` -- the norm-fed ones only, with scales,
  bias and GELU in a Triton epilogue (``convert_to_fp8(model, "norm_inputs")``);
* :class:`GeluEpilogueFFN` -- fc1 + bias + tanh GELU as one cuBLASLt GEMM (:func:`enable_gelu_epilogue`);
* :class:`GemmGeluFFN` -- the exact (erf) GELU and its derivative inside Triton GEMM
  epilogues, training and inference (:func:`fuse_gelu_gemm`; Hopper, needs the ``gpu`` extra);
* :class:`PackedGradQKVAttention` -- the fused q/k/v projection whose backward packs the
  head gradients and sums the bias gradient in one Triton pass (:func:`pack_qkv_grad`;
  training, needs the ``gpu`` extra);
* :class:`MaskDropout` -- dropout masks from PyTorch's Bernoulli kernel, outside compiled
  graphs (:func:`fast_dropout`; training);
* :class:`StreamDtypeAddNorm` / :class:`StreamDtypeEmbeddings` -- a bf16 residual stream
  under autocast (:func:`set_stream_dtype`);
* :class:`OneRowLinear` / :class:`OneRowFusedQKVAttention` -- one-row products as fused
  reductions inside compiled graphs (:func:`one_row_linears`; batch-1 decoding on CUDA);
* :class:`FusedDecodeLayer` -- a pre-norm layer's one-token step as five Triton kernels
  (:func:`fuse_decode_layers`; batch-1 decoding on CUDA, needs the ``gpu`` extra);
* :class:`SegmentedEncoder` -- graph breaks for ``torch.compile`` between runs of layers
  (:func:`segment_encoders`).

:func:`apply_fast_paths` applies any of them to a built model in place. A swap changes the
class of the module objects (as :mod:`torch.nn.utils.parametrize` does), never their
parameters: ``state_dict`` keys, parameter identity, optimisers and hooks are untouched
(fp8 excepted: it replaces the Linears by float8 buffers, for inference only). Swapping
twice is the same as once. CUDA-graph capture is a wrapper around the call
(:class:`ctxkit.inference.gpu.GPUEncoder`, :class:`ctxkit.training.graphs.GraphedTrainStep`),
not a module swap. See docs/fast_paths.md.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import nn

from .attention import FusedQKVAttention, fuse_qkv, prepare_inference
from .decode_layer import (FusedDecodeLayer, decode_kernels_available, fuse_decode_layers, unfuse_decode_layers,
                           why_not_fused)
from .dropout import MaskDropout, dropout_keep_mask, fast_dropout, unfast_dropout
from .gelu_gemm import GemmGeluFFN, fuse_gelu_gemm, gelu_gemm_available, linear_gelu, unfuse_gelu_gemm
from .ffn import GeluEpilogueFFN, enable_gelu_epilogue, linear_gelu_tanh
from .fp8 import FP8_MAX, FP8_SCOPES, Fp8EpilogueLinear, Fp8GeluFFN, Fp8Linear, convert_to_fp8
from .qkv_grad import PackedGradQKVAttention, pack_qkv_grad, unpack_qkv_grad
from .rows import OneRowFusedQKVAttention, OneRowLinear, one_row_linear, one_row_linears
from .segments import SegmentedEncoder, segment_encoders
from .stream import StreamDtypeAddNorm, StreamDtypeEmbeddings, set_stream_dtype, to_stream_dtype

__all__ = [
    "FP8_MAX",
    "FP8_SCOPES",
    "Fp8EpilogueLinear",
    "Fp8GeluFFN",
    "Fp8Linear",
    "FusedDecodeLayer",
    "FusedQKVAttention",
    "GeluEpilogueFFN",
    "GemmGeluFFN",
    "MaskDropout",
    "OneRowFusedQKVAttention",
    "OneRowLinear",
    "PackedGradQKVAttention",
    "SegmentedEncoder",
    "StreamDtypeAddNorm",
    "StreamDtypeEmbeddings",
    "apply_fast_paths",
    "convert_to_fp8",
    "decode_kernels_available",
    "dropout_keep_mask",
    "enable_gelu_epilogue",
    "fast_dropout",
    "gelu_gemm_available",
    "fuse_decode_layers",
    "fuse_gelu_gemm",
    "fuse_qkv",
    "linear_gelu",
    "linear_gelu_tanh",
    "one_row_linear",
    "one_row_linears",
    "pack_qkv_grad",
    "prepare_inference",
    "segment_encoders",
    "set_stream_dtype",
    "to_stream_dtype",
    "unfast_dropout",
    "unfuse_decode_layers",
    "unfuse_gelu_gemm",
    "unpack_qkv_grad",
    "why_not_fused",
]


def apply_fast_paths(model: nn.Module, *, fused_qkv: bool = False, fp8: Union[bool, str] = False, gelu_epilogue: bool = False,
                     gelu_gemm: bool = False, packed_qkv_grad: bool = False, dropout_masks: bool = False,
                     stream_dtype: Optional[torch.dtype] = None, compile_segments: Optional[int] = None) -> nn.Module:
    """Swap the chosen fast variants into ``model`` in place and return it.

    Args:
        fused_qkv: attention projections of a shared input as one GEMM (:func:`fuse_qkv`;
            the same function, float32 sums in another order).
        fp8: the Transformer layers' Linears as float8 GEMMs, self-attention's q/k/v as one
            (:func:`convert_to_fp8`; inference only, a declared precision; implies the
            fused attention for self-attention). True converts them all; a scope of
            :func:`convert_to_fp8` (``"norm_inputs"``: only q/k/v and the FFN's first
            product, with their bias and GELU in a Triton epilogue) picks which.
        gelu_epilogue: each GELU FFN's ``gelu(fc1(x))`` as one GEMM with a tanh-GELU
            epilogue when autograd is off (:func:`enable_gelu_epilogue`; applied after fp8,
            which leaves no plain fc1 to fuse).
        gelu_gemm: each erf-GELU FFN's GELU (and its derivative) inside Triton GEMM
            epilogues (:func:`fuse_gelu_gemm`; exact; where the kernels run, else the plain
            layer; not with ``gelu_epilogue``, which takes those FFNs first).
        packed_qkv_grad: self-attention's q/k/v projection as one GEMM whose backward packs
            the head gradients and sums the bias gradient in one Triton pass
            (:func:`pack_qkv_grad`; implies the fused projection; where the kernel runs,
            else the fused layer).
        dropout_masks: every ``nn.Dropout`` as :class:`MaskDropout` (:func:`fast_dropout`;
            the same function with masks from PyTorch's Bernoulli kernel; training speed).
        stream_dtype: keep the residual stream in this dtype under autocast
            (:func:`set_stream_dtype`); None leaves the model's setting alone.
        compile_segments: split each encoder stack into this many ``torch.compile``
            graphs (:func:`segment_encoders`; 1 restores the plain stack); None leaves it alone.

    Returns:
        ``model`` (the same object).
    """
    if fused_qkv:
        fuse_qkv(model)
    if packed_qkv_grad:
        pack_qkv_grad(model)
    if fp8:
        convert_to_fp8(model, "all" if fp8 is True else fp8)
    if gelu_epilogue:
        enable_gelu_epilogue(model)
    if gelu_gemm:
        fuse_gelu_gemm(model)
    if dropout_masks:
        fast_dropout(model)
    if stream_dtype is not None:
        set_stream_dtype(model, stream_dtype)
    if compile_segments is not None:
        segment_encoders(model, compile_segments)
    return model
