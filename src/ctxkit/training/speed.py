"""Opt-in speed and memory switches that leave the maths unchanged.

* :func:`compile_blocks` -- ``torch.compile`` each Transformer layer ("regional"
  compilation): the layers share one compiled graph, so compiling is quick, and the
  elementwise tails (bias + GELU, dropout + residual + LayerNorm) become fused kernels.
  The compiled layers still run inside the trainer's whole-step CUDA graphs.
* :func:`enable_activation_checkpointing` -- recompute each layer in the backward pass
  instead of storing its activations.
* :func:`all_reduce_gradients` -- data-parallel gradient averaging as one flat NCCL call,
  which (unlike DDP's hooks) can be captured inside a CUDA graph.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.distributed as dist
from torch import nn

from ..layers.transformer import TransformerDecoderLayer, TransformerEncoder, TransformerEncoderLayer

__all__ = ["compile_blocks", "enable_activation_checkpointing", "all_reduce_gradients"]

BLOCK_TYPES = (TransformerEncoderLayer, TransformerDecoderLayer)


def compile_blocks(model: nn.Module, mode: str = "default") -> int:
    """Compile every Transformer layer of ``model`` in place; returns how many.

    Raises:
        ValueError: when the model has no ctxkit Transformer layers to compile.
    """
    # Every layer runs the same code on different weights: allow one graph per input
    # shape (the trainer pads lengths to a few buckets) without hitting the recompile cap.
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    blocks = [m for m in model.modules() if isinstance(m, BLOCK_TYPES)]
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no ctxkit Transformer layers to compile")
    for block in blocks:
        block.compile(mode=mode)
    return len(blocks)


def enable_activation_checkpointing(model: nn.Module) -> int:
    """Turn on per-layer activation checkpointing in every :class:`TransformerEncoder`;
    returns the number of layers affected.

    Raises:
        ValueError: when the model has no :class:`TransformerEncoder`.
    """
    encoders = [m for m in model.modules() if isinstance(m, TransformerEncoder)]
    if not encoders:
        raise ValueError(f"{type(model).__name__} has no TransformerEncoder to checkpoint")
    for encoder in encoders:
        encoder.checkpoint_layers = True
    return sum(len(e.layers) for e in encoders)


def all_reduce_gradients(parameters: Iterable[nn.Parameter]) -> None:
    """Average gradients over all ranks (no-op in a single process).

    The gradients are packed into one buffer per dtype, summed with one ``all_reduce``
    each, divided by the world size and copied back: a few large transfers, no Python
    hooks, so the whole thing can sit inside a captured CUDA graph. Every rank must hold
    gradients for the same parameters (true when all ranks run the same model code).
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    world = dist.get_world_size()
    by_dtype: dict = {}
    for p in parameters:
        if p.grad is not None:
            by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
    for grads in by_dtype.values():
        flat = torch._utils._flatten_dense_tensors(grads)
        dist.all_reduce(flat)
        flat.div_(world)
        for grad, synced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
            grad.copy_(synced)
