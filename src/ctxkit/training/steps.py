"""One optimiser step of the :class:`~ctxkit.training.Trainer`, as an object the loop calls.

Every step has the same call, ``step(micro_batches, weights) -> (scalars, sequences, tokens)``
(the :class:`Step` protocol): the collated host batches of one step on this rank, each one's
share of the global batch, and back the step's scalars (the loss and any other 0-dim model
output, on the device), the sequences and the real tokens it trained on. Two kinds:

* :class:`EagerStep`: forward and backward over the step's micro-batches (one: a plain step;
  several: gradient accumulation, with DDP's and FSDP's gradient sync only after the last),
  then clip, update and advance the schedule.
* :class:`StatefulStep`: an eager step that hands the model the state the previous step left
  (truncated backpropagation through time: a recurrent or memory-carrying LM whose class
  declares :class:`~ctxkit.core.capabilities.CarriesState`).
* :class:`GraphedStep`: the whole step replayed from a CUDA graph per batch shape
  (:class:`~ctxkit.training.graphs.GraphedTrainStep`).

:func:`make_step` builds the one a run's plan asks for.
"""

from __future__ import annotations

import contextlib
from typing import Dict, List, Optional, Protocol, Tuple

import torch
from torch import nn

from ..core.capabilities import CarriesState, declares
from ..core.run_state import autocast
from .graphs import GraphedTrainStep
from .optim import clipped_step

__all__ = ["EagerStep", "GraphedStep", "StatefulStep", "Step", "make_step", "rows_and_tokens", "to_device"]

Batch = Dict[str, torch.Tensor]


class Step(Protocol):
    """One optimiser step over this rank's micro-batches of it."""

    def __call__(self, group: List[Batch], weights: List[float]) -> Tuple[Dict[str, torch.Tensor], int, int]:
        ...


def to_device(batch: Batch, device: torch.device) -> Batch:
    """The batch's tensors on ``device`` (asynchronous copies from pinned host memory)."""
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def rows_and_tokens(cpu_batch: Batch) -> Tuple[int, int]:
    """``(sequences, real tokens)`` of a collated batch: rows of ``input_ids`` and the
    attention mask's ones (every token without a mask); a packed batch (one row holding
    its sequences one after another: ``seq_starts`` and ``cu_seqlens``, as
    :class:`~ctxkit.pretraining.masking.MLMCollator` packs them) counts its sequences."""
    if "seq_starts" in cpu_batch:
        rows = cpu_batch["seq_starts"].numel()
        return rows, int(cpu_batch["cu_seqlens"][rows])
    rows = cpu_batch["input_ids"].shape[0]
    return rows, int(cpu_batch["attention_mask"].sum()) if "attention_mask" in cpu_batch else cpu_batch["input_ids"].numel()


class EagerStep:
    """Forward/backward over a step's micro-batches, then clip, update and schedule.

    Args:
        model: the module whose parameters the optimiser updates.
        forward: what runs the batches (``model`` itself, or its DDP wrapper).
        optimizer, scheduler: the run's.
        device, precision: where and in which autocast the forward pass runs.
        max_grad_norm: clip threshold (0: none).
        sharded: the model is FSDP-sharded (its gradient sync is switched per micro-batch).
    """

    def __init__(self, model: nn.Module, forward: nn.Module, optimizer: torch.optim.Optimizer, scheduler, device: torch.device,
                 precision: str, max_grad_norm: float, sharded: bool = False):
        self.model, self.forward, self.optimizer, self.scheduler = model, forward, optimizer, scheduler
        self.device, self.precision, self.max_grad_norm, self.sharded = device, precision, max_grad_norm, sharded

    def __call__(self, group: List[Batch], weights: List[float]) -> Tuple[Dict[str, torch.Tensor], int, int]:
        """``weights``: each micro-batch's share of the global batch times the world size
        (:class:`~ctxkit.training.world_resume.EpochOrder`), so that the mean over ranks that
        DDP and FSDP take is the global batch's mean loss, however its rows are split. The
        scalars are averaged over the micro-batches by those weights."""
        n_examples = sum(rows_and_tokens(g)[0] for g, w in zip(group, weights) if w)
        sums: Dict[str, torch.Tensor] = {}
        n_tokens = 0
        for j, cpu_batch in enumerate(group):
            n_tokens += rows_and_tokens(cpu_batch)[1]
            batch = to_device(cpu_batch, self.device)
            # DDP / FSDP: all-reduce (reduce-scatter) gradients only after the last micro-batch.
            no_sync = getattr(self.forward, "no_sync", None)
            quiet = no_sync() if no_sync is not None and j < len(group) - 1 else contextlib.nullcontext()
            if self.sharded:
                self.model.set_requires_gradient_sync(j == len(group) - 1)
            with quiet:
                with autocast(self.device, self.precision):
                    out = self._run(batch)
                weight = weights[j]  # by size, so accumulation equals one big batch (0: a stand-in row)
                (out["loss"] * weight).backward()
            for k, v in out.items():
                if torch.is_tensor(v) and v.dim() == 0:
                    sums[k] = sums.get(k, 0) + v.detach() * weight
        clipped_step(self.optimizer, self.model.parameters(), self.max_grad_norm)
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return sums, n_examples, n_tokens


    def _run(self, batch: Batch) -> dict:
        return self.forward(**batch)


class StatefulStep(EagerStep):
    """An eager step for a model that carries state between batches (truncated BPTT): each
    forward gets ``state=`` what the previous step returned as ``out["state"]``, detached (the
    gradient stops at the batch boundary); :meth:`reset` clears it (the Trainer does at each
    epoch's start) and :meth:`state_dict` / :meth:`load_state_dict` put it in a checkpoint, so
    a resumed run continues from the very state the interrupted one had."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.state = None

    def _run(self, batch: Batch) -> dict:
        out = dict(self.forward(**batch, state=self.state))
        self.state = _detached(out.pop("state", None))
        return out

    def reset(self) -> None:
        self.state = None

    def state_dict(self) -> dict:
        return {"state": _detached(self.state, "cpu")}

    def load_state_dict(self, saved: dict) -> None:
        self.state = _detached(saved["state"], self.device)


def _detached(state, device=None):
    """``state`` (a tensor, a tuple or list of them, or None) detached, on ``device`` if given."""
    if state is None:
        return None
    if torch.is_tensor(state):
        state = state.detach()
        return state if device is None else state.to(device)
    return type(state)(_detached(s, device) for s in state)


class GraphedStep:
    """The whole step from a CUDA graph per batch shape; a batch with fewer rows than the
    graphs' (one the collator could not fill) runs eagerly.

    Args:
        graphed: the graph runner (it holds the model, optimiser and clip threshold).
        scheduler: advanced after every step.
        device: where the batches go.
        rows: rows of a full batch on this rank.
    """

    def __init__(self, graphed: GraphedTrainStep, scheduler, device: torch.device, rows: int):
        self.graphed, self.scheduler, self.device, self.rows = graphed, scheduler, device, rows

    def __call__(self, group: List[Batch], weights: List[float]) -> Tuple[Dict[str, torch.Tensor], int, int]:
        cpu_batch = group[0]  # one micro-batch: graphs need grad_accum 1
        rows, n_tokens = rows_and_tokens(cpu_batch)
        batch = to_device(cpu_batch, self.device)
        # A full batch replays its graph; so does a short one that the collator filled up to
        # the full row count (rows with ignored targets, e.g. pretraining's).
        scalars = self.graphed(batch) if rows == self.rows else self.graphed.eager(batch)
        self.scheduler.step()
        return scalars, rows, n_tokens


def make_step(model: nn.Module, forward: nn.Module, optimizer: torch.optim.Optimizer, scheduler, *, device: torch.device,
              precision: str, max_grad_norm: float, graphed: Optional[GraphedTrainStep] = None, rows: int = 0,
              sharded: bool = False) -> Step:
    """The step a run's plan asks for: :class:`GraphedStep` when its graphs were built
    (``graphed``; ``rows``: a full batch's rows on this rank), :class:`StatefulStep` for a model
    that carries state between batches, else :class:`EagerStep`."""
    if graphed is not None:
        return GraphedStep(graphed, scheduler, device, rows)
    kind = StatefulStep if declares(model, CarriesState) else EagerStep
    return kind(model, forward, optimizer, scheduler, device, precision, max_grad_norm, sharded)
