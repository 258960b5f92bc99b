"""``ctxkit.fast.apply(model, plan)``: a plan's module variants swapped into a built model.

The front door of the speed wing. A :class:`~ctxkit.fast.plan.FastPlan` names options;
this turns the module-level ones into swaps (:mod:`ctxkit.fast`'s variants, in the one
order that composes: float8 first, then the fused projections, the GELU forms, dropout
masks, the residual stream, compile segments and recomputation). What wraps a call
rather than a module -- compiling, CUDA graphs, master weights, the gradient all-reduce --
is done by the runner that owns the call (the Trainer, the GPU encoder, the static
decoder), reading the same plan.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import nn

from ..core.errors import UserError
from ..layers.transformer import TransformerEncoder
from .attention import fuse_qkv
from .dropout import fast_dropout
from .ffn import enable_gelu_epilogue
from .fp8 import convert_to_fp8
from .fp8_training import enable_fp8_training
from .gelu_gemm import fuse_gelu_gemm
from .plan import FastPlan
from .qkv_grad import pack_qkv_grad
from .segments import segment_encoders
from .stream import set_stream_dtype

__all__ = ["apply", "enable_activation_checkpointing"]


def enable_activation_checkpointing(model: nn.Module, on: bool = True) -> int:
    """Recompute each layer of every :class:`TransformerEncoder` in the backward pass (plan
    option ``ckpt``); returns the number of layers affected.

    Raises:
        UserError: when the model has no :class:`TransformerEncoder`.
    """
    encoders = [m for m in model.modules() if isinstance(m, TransformerEncoder)]
    if not encoders and on:
        raise UserError(f"{type(model).__name__} has no TransformerEncoder to checkpoint (fast option ckpt)")
    for encoder in encoders:
        encoder.checkpoint_layers = on
    return sum(len(e.layers) for e in encoders)


def apply(model: nn.Module, plan: Union[str, FastPlan], *, use: Optional[str] = None, segments: Optional[int] = None) -> nn.Module:
    """Swap ``plan``'s module variants into ``model`` in place and return it.

    Args:
        model: a built model (on the device it will run on, for ``fp8train``).
        plan: a resolved plan or a plan string without ``auto`` (resolve ``auto`` first:
            :func:`ctxkit.fast.plan.resolve`).
        use: narrow the plan to one use first (:meth:`FastPlan.for_use`).
        segments: compile segments to set when the plan leaves them to the runner
            (``plan.segments == 0``); None leaves the encoder as it is.

    Returns:
        ``model`` (the same object). Parameters and ``state_dict`` keys are unchanged,
        except by ``fp8`` / ``fp8norm`` (float8 buffers, inference only).

    Raises:
        UserError: ``auto`` not resolved, or ``fp8train`` / ``ckpt`` on a model they cannot serve.
    """
    plan = FastPlan.parse(plan)
    if plan.auto:
        raise UserError(f"fast plan {plan} is not resolved: call ctxkit.fast.resolve(plan, use=..., device=...) first")
    if use is not None:
        plan = plan.for_use(use)
    if plan.fp8 == "rowwise":
        enable_fp8_training(model)  # torchao's Linears: q/k/v stay three float8 GEMMs
    elif plan.fused_qkv:
        fuse_qkv(model)
    if plan.packed_qkv_grad and plan.fp8 != "rowwise":
        pack_qkv_grad(model)
    if plan.fp8 in ("all", "norm_inputs"):
        convert_to_fp8(model, plan.fp8)
    if plan.gelu == "tanh":
        enable_gelu_epilogue(model)
    elif plan.gelu == "gemm":
        fuse_gelu_gemm(model)
    if plan.dropout_masks:
        fast_dropout(model)
    if plan.residual == "bfloat16":
        set_stream_dtype(model, torch.bfloat16)
    count = plan.segments or segments
    if count:
        segment_encoders(model, count)
    if plan.recompute:
        enable_activation_checkpointing(model)
    return model
