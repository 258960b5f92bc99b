"""The trainer's micro-batches as a map-style dataset, so a DataLoader can prepare them
ahead of the GPU in worker processes."""

from __future__ import annotations

import inspect
from typing import Callable, Dict, List, Optional, Sequence

import torch

from ..data.batching import collate
from ..core.capabilities import KeyedCollator, declares

__all__ = ["CollatedBatches", "EpochItems"]


class CollatedBatches(torch.utils.data.Dataset):
    """Item ``j`` is micro-batch ``batches[j]`` collated into tensors.

    Args:
        features: the training examples.
        batches: example indices per micro-batch, in training order.
        collate_fn: features -> tensors (default: dynamic padding to ``pad_multiple``). A
            collate function with ``keyed = True`` also gets ``key=(epoch, keys[j][, rank])``
            so its randomness (e.g. MLM masks) depends on the batch, not on call order.
        pad_multiple: padding multiple of the default collation.
        epoch: the epoch, part of the key.
        rank, world: this process and the number of processes.
        global_batches: ``batches`` are global: collate all rows (one key for every rank,
            so ranks agree on shapes and masks exactly as one process would) and keep this
            rank's rows. Otherwise ``batches`` are this rank's own share and the rank joins
            the key, so ranks draw independent masks.
        keys: each micro-batch's key (default: its index ``j``).

    "Reads": item ``j`` fetches (``features[i]``) the rows of ``batches[j]`` alone, so a rank
    whose ``batches`` are its share reads only its own rows of the data.
    """

    def __init__(self, features: Sequence[dict], batches: List[List[int]], collate_fn: Optional[Callable], pad_multiple: int,
                 epoch: int, rank: int = 0, world: int = 1, global_batches: bool = False, keys: Optional[List[int]] = None):
        self.features = features
        self.batches = batches
        self.collate_fn = collate_fn
        self.pad_multiple = pad_multiple
        self.epoch = epoch
        self.rank, self.world = rank, world
        self.global_batches = global_batches
        self.keys = keys
        self.keyed = declares(collate_fn, KeyedCollator) and "key" in inspect.signature(collate_fn).parameters

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, j) -> Dict[str, torch.Tensor]:
        """Micro-batch ``j`` of ``batches``, or, given ``(epoch, key, example ids)`` (an item
        of :class:`EpochItems`), that micro-batch of that epoch."""
        if isinstance(j, tuple):
            epoch, index, ids = j
        else:
            epoch, index, ids = self.epoch, j if self.keys is None else self.keys[j], self.batches[j]
        feats = [self.features[i] for i in ids]
        if self.collate_fn is None:
            batch = collate(feats, multiple_of=self.pad_multiple)
        elif self.keyed:
            key = (epoch, index) if self.global_batches or self.world == 1 else (epoch, index, self.rank)
            batch = self.collate_fn(feats, key=key)
        else:
            batch = self.collate_fn(feats)
        if self.global_batches and self.world > 1:
            batch = {k: v[self.rank :: self.world] for k, v in batch.items()}
        return batch


class EpochItems:
    """A run's micro-batches as ``(epoch, key, example ids)``, epoch after epoch: the sampler
    of one loader that serves the whole run (its items index :class:`CollatedBatches`).

    Args:
        start: ``(order, step)``: the first epoch's :class:`~ctxkit.training.world_resume.EpochOrder`
            and the step it starts from (a resumed run's position).
        order_of: epoch -> that epoch's order from its first step (called when the loader
            reaches the epoch; a pure function of the epoch).
        n_epochs: the epochs are ``start``'s up to ``n_epochs - 1``.
    """

    def __init__(self, start: tuple, order_of: Callable, n_epochs: int):
        self.start, self.order_of, self.n_epochs = start, order_of, n_epochs

    def empty(self) -> bool:
        order, step = self.start
        return order.epoch >= self.n_epochs or (order.bounds[step] >= len(order.micro) and order.epoch + 1 >= self.n_epochs)

    def __iter__(self):
        order, step = self.start
        for epoch in range(order.epoch, self.n_epochs):
            if epoch > order.epoch:
                order, step = self.order_of(epoch), 0
            for j in range(order.bounds[step], len(order.micro)):
                yield epoch, order.keys[j], order.micro[j]
