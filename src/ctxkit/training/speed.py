"""How the trainer carries out a fast plan's training options.

:func:`prepare_model` applies a resolved :class:`~ctxkit.fast.FastPlan` to a model about
to be trained: the module swaps (:func:`ctxkit.fast.apply`), then ``torch.compile`` in the
plan's scope:

* :func:`compile_model` -- the whole model (embeddings, heads and losses fused too), in
  ``segN`` graphs; still inside the trainer's whole-step CUDA graphs.
* :func:`compile_blocks` -- each Transformer layer ("regional" compilation, option
  ``layercompile``; what FSDP needs): the layers share one compiled graph, so compiling is
  quick.
* :func:`set_norm_grad_split` -- option ``normsplitN``.
* :func:`compile_warm_up` -- every shape of a fixed set compiled before step 1.

:func:`graph_grad_sync` builds the multi-rank gradient average a graphed step captures
(options ``overlap`` and ``bf16grad``); :func:`all_reduce_gradients` is data-parallel
gradient averaging as one flat NCCL call, which (unlike DDP's hooks) can be captured
inside a CUDA graph.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Dict, Iterable, List, Optional

import torch
import torch.distributed as dist
from torch import nn

from ..fast import FastPlan, apply, segment_encoders
from ..layers.transformer import TransformerDecoderLayer, TransformerEncoderLayer
from ..core.errors import UserError
from .reducer import OverlappedGradReducer

__all__ = ["compile_blocks", "compile_model", "compile_warm_up", "prepare_model", "set_norm_grad_split", "graph_grad_sync", "FlatGradAllReduce",
           "all_reduce_gradients"]

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
        raise UserError(f"{type(model).__name__} has no ctxkit Transformer layers to compile")
    for block in blocks:
        block.compile(mode=mode)
    return len(blocks)


def set_norm_grad_split(rows: Optional[int]) -> bool:
    """Rows per partial sum in Inductor's mix-order reductions, for every later compile in
    this process (a global Inductor setting; None restores Inductor's heuristic).

    A compiled LayerNorm backward computes the input gradient and the weight and bias
    gradients (sums over all rows) in one kernel that leaves per-block partial sums,
    then adds them with an eager column sum. Inductor's heuristic makes blocks of 16 rows
    on an H100 at 32768 rows (2048 partial rows per parameter, 11 us per sum); 64 took a
    BERT-base pretraining step 0.19 ms faster (benchmarks/floor.py, option ``mixsplit64``).

    Returns:
        Whether this torch has the setting (torch >= 2.10); older ones ignore it.
    """
    triton_config = torch._inductor.config.triton
    if not hasattr(triton_config, "mix_order_reduction_split_size"):
        return False
    if rows is not None and (rows < 1 or rows & (rows - 1)):
        raise UserError(f"norm-gradient split must be a power of two >= 1, got {rows}")
    triton_config.mix_order_reduction_split_size = rows
    return True


def compile_model(model: nn.Module, segments: int = 1, mode: str = "default", dynamic: Optional[bool] = None) -> None:
    """``torch.compile`` the whole model in place: unlike :func:`compile_blocks` the
    embeddings, heads and losses are fused too (BERT-base pretraining: ~10 % faster).

    Args:
        model: compiled in place.
        segments: split each :class:`TransformerEncoder` into this many compiled graphs
            (graph breaks between equal runs of layers). One graph is fastest alone, but
            its backward is a single autograd node that hands every gradient over at the
            end; with several, the upper layers' gradients are complete while the lower
            layers' backward still runs, so an
            :class:`~ctxkit.training.reducer.OverlappedGradReducer` can send them early.
        mode: ``torch.compile`` mode.
        dynamic: ``torch.compile``'s ``dynamic``: False specialises a graph per input shape
            (for inputs from a fixed set of shapes, e.g. pretraining's length buckets); None
            lets a second shape recompile with dynamic sizes.
    """
    if segments < 1:
        raise UserError(f"segments must be >= 1, got {segments}")
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    segment_encoders(model, segments)  # ctxkit.fast.SegmentedEncoder: graph breaks between the segments
    model.compile(mode=mode, dynamic=dynamic)


def prepare_model(model: nn.Module, plan: FastPlan, whole_model: bool = True, segments: int = 1, static_shapes: bool = False) -> None:
    """Apply a resolved plan's training options to ``model`` in place: the module swaps
    (:func:`ctxkit.fast.apply`: fp8train, q/k/v, qkvpack, gelugemm, maskdrop, bf16res,
    ckpt), then ``torch.compile`` -- the whole model in ``plan.segments`` graphs (else
    ``segments``), or each layer with ``layercompile`` or when ``whole_model`` is False (as
    FSDP needs) -- with the ``normsplitN`` setting first. ``static_shapes``: the batches come
    from a fixed set of shapes, so each gets its own specialised graph."""
    apply(model, plan)
    if plan.compile == "off":
        return
    if plan.norm_split is not None:
        set_norm_grad_split(plan.norm_split)
    mode = plan.compile_mode or "default"
    if plan.compile == "layers" or not whole_model:
        compile_blocks(model, mode=mode)
    else:
        compile_model(model, segments=plan.segments or segments, mode=mode, dynamic=False if static_shapes else None)


def compile_warm_up(model: nn.Module, batches: List[Dict[str, torch.Tensor]], autocast: Callable[[], contextlib.AbstractContextManager],
                    device: torch.device, before: Optional[Callable[[Dict[str, torch.Tensor]], None]] = None) -> float:
    """Compile a model for each batch shape it will meet, before the first training step.

    A compiled model compiles a shape the first time it sees it, and for a whole BERT-base
    that takes ~40 s on a GPU host: with pretraining's two length buckets, the half-length
    one may turn up only after the first log interval, where it reads as a recompilation and
    stalls the measured steps. One forward and backward per shape here, on copies of the
    run's own batches, with no optimiser update and the random streams (dropout, masks)
    restored afterwards, so training then goes exactly as it would have.

    Args:
        model: compiled (``prepare_model``), in training mode.
        batches: one collated CPU batch per shape, as the collator makes them.
        autocast: the context the training step runs its forward in (the same guards).
        device: where the model is.
        before: called with each batch first (e.g. to name the shape on a progress bar).

    Returns:
        The seconds it took.
    """
    start = time.perf_counter()
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        for cpu_batch in batches:
            if before is not None:
                before(cpu_batch)
            batch = {k: v.to(device) for k, v in cpu_batch.items()}
            with autocast():
                loss = model(**batch)["loss"]
            loss.backward()
            model.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def graph_grad_sync(model: nn.Module, plan: FastPlan):
    """The multi-rank gradient average a graphed step captures, per a plan's ``bf16grad``
    and ``overlap`` options: an :class:`~ctxkit.training.reducer.OverlappedGradReducer` or
    a :class:`FlatGradAllReduce`."""
    reduce_dtype = torch.bfloat16 if plan.grad_reduce == "bfloat16" else None
    if plan.overlap_grad_reduce:
        return OverlappedGradReducer(model, reduce_dtype=reduce_dtype)
    return FlatGradAllReduce(model, reduce_dtype)


class FlatGradAllReduce:
    """The gradient average a graphed step calls after backward: one flat all-reduce
    (:func:`all_reduce_gradients`) that only sums. The step multiplies the loss by
    ``loss_scale`` (1 / world size) before backward, so the sum is already the mean and no
    division pass over the gradients is needed (exact for 2, 4, 8 ... ranks).

    Args:
        model: whose gradients are averaged.
        reduce_dtype: send the gradients in this dtype (e.g. bf16), None for their own.
    """

    def __init__(self, model: nn.Module, reduce_dtype: Optional[torch.dtype] = None):
        self.params = list(model.parameters())
        self.reduce_dtype = reduce_dtype
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        self.loss_scale = 1.0 / world

    def __call__(self) -> None:
        all_reduce_gradients(self.params, self.reduce_dtype, average=False)


def all_reduce_gradients(parameters: Iterable[nn.Parameter], reduce_dtype: Optional[torch.dtype] = None, average: bool = True) -> None:
    """Average gradients over all ranks (no-op in a single process).

    The gradients are packed into one buffer per dtype, summed with one ``all_reduce``
    each and divided by the world size; the buffer then becomes the gradients (each
    ``p.grad`` a view of it; copied back instead when sent in another dtype): a few large
    transfers, no Python hooks, so the whole thing can sit inside a captured CUDA graph. Every rank must hold
    gradients for the same parameters (true when all ranks run the same model code).
    ``reduce_dtype`` (e.g. bf16) sends the gradients in that dtype: half the bytes, at the
    cost of rounding the average (what DDP's ``bf16_compress_hook`` does). With
    ``average=False`` the gradients are only summed (for losses already divided by the
    world size, see :class:`FlatGradAllReduce`).
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    world = dist.get_world_size()
    by_dtype: dict = {}
    for p in parameters:
        if p.grad is not None:
            by_dtype.setdefault(p.grad.dtype, []).append(p)
    for params in by_dtype.values():
        grads = [p.grad for p in params]
        flat = torch.empty(sum(g.numel() for g in grads), dtype=reduce_dtype or grads[0].dtype, device=grads[0].device)
        views = [piece.view_as(g) for piece, g in zip(flat.split([g.numel() for g in grads]), grads)]
        # Multi-tensor copies (a few kernels, casting on the way) instead of one copy
        # kernel per parameter: in a ~50 ms step every exposed 0.1 ms counts.
        torch._foreach_copy_(views, grads)
        if average:
            flat.div_(world)  # before the sum, as DDP does: no overflow in low precision
        dist.all_reduce(flat)
        if flat.dtype == grads[0].dtype:
            # The summed buffer becomes the gradients (views, as DDP's
            # gradient_as_bucket_view): no copy back, ~0.3 ms a BERT-base step.
            for p, view in zip(params, views):
                p.grad = view
        else:
            torch._foreach_copy_(grads, views)
