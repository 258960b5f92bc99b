"""Data-parallel gradient averaging that overlaps the backward pass, CUDA-graph safe.

:func:`ctxkit.training.speed.all_reduce_gradients` waits for the whole backward pass and
then sends every gradient at once; with short steps that transfer is fully exposed.
:class:`OverlappedGradReducer` instead keeps the gradients in a few persistent flat
buckets (``param.grad`` is a view into one) and starts each bucket's all-reduce as soon
as its last gradient is written, from ``register_post_accumulate_grad_hook``, while
autograd goes on with earlier layers. Because the buckets exist before any graph is
captured and are zeroed inside the step, the same launches are captured into the
trainer's CUDA graph and replayed.

Overlap needs gradients to appear before the backward pass ends: with the whole model
compiled as one graph its backward is a single autograd node and every gradient lands at
the end (still correct, no overlap), so pair this with per-layer compilation
(:func:`ctxkit.training.speed.compile_blocks`) or a model compiled in segments
(:func:`ctxkit.training.speed.compile_model` with ``segments > 1``, what the trainer does).
On 2 H100s neither beat the flat all-reduce after backward (docs/performance.md).
"""

from __future__ import annotations

from typing import Dict, List, Optional

import torch
import torch.distributed as dist
from torch import Tensor, nn

__all__ = ["OverlappedGradReducer"]


class OverlappedGradReducer:
    """Average ``model``'s gradients over all ranks, bucket by bucket, during backward.

    Use :meth:`start` before the forward pass and :meth:`finish` after ``backward()``;
    between them every rank must run the same backward (the same parameters receive
    gradients on every rank, as in DDP without ``find_unused_parameters``). A parameter
    that gets no gradient in a step ends it with ``grad = None``, as in a single process.

    Args:
        model: the module whose trainable parameters are averaged.
        bucket_mb: bucket size; larger buckets mean fewer, later launches.
        reduce_dtype: send the buckets in this dtype (e.g. bf16: half the bytes, the
            average rounded); None keeps the gradients' own dtype (exact).
    """

    def __init__(self, model: nn.Module, bucket_mb: float = 25.0, reduce_dtype: Optional[torch.dtype] = None):
        self.world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        self.reduce_dtype = reduce_dtype
        params = [p for p in model.parameters() if p.requires_grad]
        # Backward meets the parameters roughly in reverse order of definition, so the
        # first buckets to fill (and be sent) hold the last layers.
        groups: List[List[nn.Parameter]] = []
        size = 0
        for p in reversed(params):
            if not groups or size >= bucket_mb * 2**20 or p.dtype != groups[-1][0].dtype or p.device != groups[-1][0].device:
                groups.append([])
                size = 0
            groups[-1].append(p)
            size += p.numel() * p.element_size()
        self.buckets = []
        for group in groups:
            flat = torch.zeros(sum(p.numel() for p in group), dtype=group[0].dtype, device=group[0].device)
            views, offset = [], 0
            for p in group:
                views.append(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
            self.buckets.append((group, flat, views))
        self.bucket_of: Dict[int, int] = {id(p): i for i, (group, _, _) in enumerate(self.buckets) for p in group}
        self.pending: List[int] = []
        self.ready: set = set()
        self.works: list = []
        self.active = False
        self.handles = [p.register_post_accumulate_grad_hook(self._on_grad) for p in params]

    def start(self) -> None:
        """Zero the buckets and point every ``param.grad`` at its slot (call before forward)."""
        for group, flat, views in self.buckets:
            flat.zero_()
            for p, view in zip(group, views):
                p.grad = view
        self.pending = [len(group) for group, _, _ in self.buckets]
        self.ready = set()
        self.works = []
        self.active = True

    def _on_grad(self, param: Tensor) -> None:
        if not self.active:
            return
        if id(param) in self.ready:
            raise RuntimeError("a gradient arrived twice between start() and finish(): one backward per step")
        i = self.bucket_of[id(param)]
        self.ready.add(id(param))
        self.pending[i] -= 1
        if self.pending[i] == 0:
            self._launch(i)

    def _launch(self, i: int) -> None:
        _, flat, _ = self.buckets[i]
        flat.div_(self.world)  # before the sum, as DDP does
        buffer = flat if self.reduce_dtype in (None, flat.dtype) else flat.to(self.reduce_dtype)
        work = dist.all_reduce(buffer, async_op=True) if self.world > 1 else None
        self.works.append((work, buffer, flat))
        self.pending[i] = -1  # launched

    def finish(self) -> None:
        """Send the buckets still waiting (parameters without gradient this step), wait
        for every all-reduce and copy low-precision results back (call after backward)."""
        if not self.active:
            raise RuntimeError("finish() without start()")
        for i, left in enumerate(self.pending):
            if left > 0:
                self._launch(i)
        for work, buffer, flat in self.works:
            if work is not None:
                work.wait()
            if buffer is not flat:
                flat.copy_(buffer)
        for group, _, _ in self.buckets:
            for p in group:
                if id(p) not in self.ready:
                    p.grad = None  # untouched this step: let the optimiser skip it
        self.active = False

    def remove(self) -> None:
        """Detach the hooks (the reducer is then inert)."""
        for handle in self.handles:
            handle.remove()
        self.handles = []
