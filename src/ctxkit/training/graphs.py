"""Whole-step CUDA graphs for fine-tuning small models.

A BERT-small training step launches several hundred short kernels; for a model like
MiniLM the GPU finishes each before the CPU has issued the next, so the step costs what
the launches cost. Capturing forward, loss, backward, gradient clipping and the fused
AdamW update as one CUDA graph per input shape turns those launches into one replay.

Shapes are kept few by padding sequence lengths to a multiple (``pad_multiple``); the
batch size is fixed. A batch of any other shape (the last, partial batch of an epoch)
runs eagerly with the same optimiser. Each shape is first run once eagerly (which also
warms up cuBLAS and the attention kernels) and captured on its second occurrence, so no
step is ever computed twice or skipped: every batch trains the model exactly once.

With several ranks the gradient average is one flat NCCL all-reduce inside the graph
(``grad_sync``), every rank capturing the same shapes in the same order.

Requirements, checked by :func:`graphs_supported`: a CUDA device, no gradient
accumulation, and an AdamW built with ``capturable=True`` and tensor learning rates
(:func:`ctxkit.training.optim.build_adamw` with ``capturable=True``), whose learning
rate the scheduler updates in place.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple  # noqa: F401

import torch
from torch import Tensor, nn

from ..fast import GraphCache, capture_graph
from .optim import clipped_step

__all__ = ["GraphedTrainStep", "graphs_supported"]


def graphs_supported(device: torch.device, grad_accum: int) -> bool:
    """Whether whole-step graphs can be used."""
    return device.type == "cuda" and grad_accum == 1


class GraphedTrainStep:
    """Run training steps through per-shape CUDA graphs.

    Args:
        model: returns ``{"loss": ...}`` from ``model(**batch)``.
        optimizer: capturable AdamW with tensor learning rates.
        max_grad_norm: clip threshold (0 disables).
        autocast: ``autocast()`` context factory for the forward pass.
        grad_sync: called between backward and clipping, e.g. the data-parallel gradient
            average of :class:`ctxkit.training.speed.FlatGradAllReduce` (captured too; its
            ``loss_scale`` multiplies the loss before backward);
            or an :class:`~ctxkit.training.reducer.OverlappedGradReducer`, started before
            the forward pass and finished after backward.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, max_grad_norm: float, autocast: Callable,
                 grad_sync: Optional[Callable[[], None]] = None):
        self.grad_sync = grad_sync
        self.model = model
        self.optimizer = optimizer
        self.max_grad_norm = max_grad_norm
        self.autocast = autocast
        self.seen: Dict[tuple, int] = {}
        # Every padded shape keeps its graph (a step has few: lengths are padded to buckets).
        self.graphs = GraphCache(max_entries=None)
        self.replays = 0
        self.eager_steps = 0
        # One memory pool for all shapes: graphs never run concurrently, and what a replay
        # leaves behind (the scalars) is cloned at once, so their temporaries may overlap.
        # Separate pools ran out of memory with ~8 shapes of a batch-256 pretraining step.
        self.pool = None

    @staticmethod
    def _key(batch: Dict[str, Tensor]) -> tuple:
        return tuple(sorted((k, tuple(v.shape), v.dtype) for k, v in batch.items()))

    def _body(self, batch: Dict[str, Tensor]) -> Dict[str, Tensor]:
        overlapped = hasattr(self.grad_sync, "start")  # an OverlappedGradReducer
        if overlapped:
            self.grad_sync.start()
        with self.autocast():
            out = self.model(**batch)
        # A flat all-reduce that only sums asks for the loss pre-divided by the world size.
        scale = getattr(self.grad_sync, "loss_scale", 1.0)
        (out["loss"] * scale if scale != 1.0 else out["loss"]).backward()
        if overlapped:
            self.grad_sync.finish()
        elif self.grad_sync is not None:
            self.grad_sync()
        # Clipping rides into the fused update (ctxkit.training.optim.clipped_step).
        clipped_step(self.optimizer, self.model.parameters(), self.max_grad_norm)
        # The loss and any other scalar the model reports (e.g. MLM accuracy).
        return {k: v.detach() for k, v in out.items() if torch.is_tensor(v) and v.dim() == 0}

    def eager(self, batch: Dict[str, Tensor]) -> Dict[str, Tensor]:
        """One ordinary step (also used for shapes without a graph)."""
        self.optimizer.zero_grad(set_to_none=True)
        self.eager_steps += 1
        return self._body(batch)

    def _capture(self, key: tuple, batch: Dict[str, Tensor]) -> None:
        static = {k: v.clone() for k, v in batch.items()}
        # Gradients allocated inside the capture belong to this graph's memory pool, so
        # each graph's optimiser update reads the gradients its own backward wrote.
        self.optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        # No warm-up here: this shape already ran eagerly once (see __call__). The capture is
        # thread-local: the DataLoader's pin-memory thread keeps allocating pinned host memory
        # meanwhile, which in the global mode invalidates it.
        graph, scalars = capture_graph(lambda: self._body(static), warmup=0, pool=self.pool)
        self.graphs.put(key, (graph, static, scalars))

    def __call__(self, batch: Dict[str, Tensor]) -> Dict[str, Tensor]:
        """Train on ``batch`` (tensors already on the GPU); returns the step's scalars
        (``loss`` and any other 0-dim model outputs) as fresh tensors."""
        key = self._key(batch)
        count = self.seen.get(key, 0)
        self.seen[key] = count + 1
        if count == 0:
            return self.eager(batch)
        if key not in self.graphs:
            self._capture(key, batch)
        graph, static, scalars = self.graphs.get(key)
        for k, v in batch.items():
            static[k].copy_(v, non_blocking=True)
        graph.replay()
        self.replays += 1
        return {k: v.clone() for k, v in scalars.items()}
