"""The trainer's micro-batches as a map-style dataset, so a DataLoader can prepare them
ahead of the GPU in worker processes."""

from __future__ import annotations

import inspect
from typing import Callable, Dict, List, Optional, Sequence

import torch

from ..data.batching import collate

__all__ = ["CollatedBatches"]


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
        self.keyed = collate_fn is not None and getattr(collate_fn, "keyed", False) and "key" in inspect.signature(collate_fn).parameters

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, j: int) -> Dict[str, torch.Tensor]:
        feats = [self.features[i] for i in self.batches[j]]
        if self.collate_fn is None:
            batch = collate(feats, multiple_of=self.pad_multiple)
        elif self.keyed:
            index = j if self.keys is None else self.keys[j]
            key = (self.epoch, index) if self.global_batches or self.world == 1 else (self.epoch, index, self.rank)
            batch = self.collate_fn(feats, key=key)
        else:
            batch = self.collate_fn(feats)
        if self.global_batches and self.world > 1:
            batch = {k: v[self.rank :: self.world] for k, v in batch.items()}
        return batch
