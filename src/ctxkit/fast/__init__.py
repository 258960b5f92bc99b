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

The front door is the plan (:mod:`ctxkit.fast.plan`): a :class:`FastPlan` names the
options, :func:`resolve` turns ``auto`` into the fastest exact plan for a machine and a
use, :func:`apply` swaps the plan's variants into a model (the runners -- Trainer, GPU
encoder, static decoder -- do the compiling and the CUDA graphs it names), and
:func:`supported` (:mod:`ctxkit.fast.kernels`) says where each kernel runs. A swap changes
the class of the module objects (as :mod:`torch.nn.utils.parametrize` does), never their
parameters: ``state_dict`` keys, parameter identity, optimisers and hooks are untouched
(fp8 excepted: it replaces the Linears by float8 buffers, for inference only). Swapping
twice is the same as once. See docs/fast_paths.md.
"""

from __future__ import annotations

from .apply import apply, enable_activation_checkpointing
from .attention import FusedQKVAttention, fuse_qkv, prepare_inference, varying_shape_attention
from .decode_layer import (FusedDecodeLayer, decode_kernels_available, fuse_decode_layers, unfuse_decode_layers,
                           why_not_fused)
from .dropout import MaskDropout, dropout_keep_mask, fast_dropout, unfast_dropout
from .gelu_gemm import GemmGeluFFN, fuse_gelu_gemm, gelu_gemm_available, linear_gelu, unfuse_gelu_gemm
from .ffn import GeluEpilogueFFN, enable_gelu_epilogue, linear_gelu_tanh
from .fp8 import FP8_MAX, FP8_SCOPES, Fp8EpilogueLinear, Fp8GeluFFN, Fp8Linear, convert_to_fp8
from .fp8_training import enable_fp8_training, fp8_training_unavailable
from .graph_cache import GraphCache, capture_graph
from .kernels import DeviceInfo, device_info, supported
from .plan import FastPlan, PRESETS, resolve
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
    "DeviceInfo",
    "FastPlan",
    "GraphCache",
    "PRESETS",
    "apply",
    "capture_graph",
    "device_info",
    "enable_activation_checkpointing",
    "enable_fp8_training",
    "fp8_training_unavailable",
    "resolve",
    "supported",
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
    "varying_shape_attention",
    "why_not_fused",
]

