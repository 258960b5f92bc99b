"""Dynamic padding and length-grouped batching: no compute is spent on padding that a
smarter batch order could avoid.

Features are plain dicts of Python lists/scalars (``input_ids``, ``token_type_ids``,
``attention_mask``, and task fields such as ``labels``); :func:`collate` pads them to the
longest sequence in the batch.
"""

from __future__ import annotations

import itertools
import random
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["balanced_batches", "collate", "length_grouped_batches", "sequential_batches", "PAD_VALUES"]

# Padding value per sequence field; labels use -100, which cross-entropy ignores.
PAD_VALUES = {"input_ids": 0, "token_type_ids": 0, "attention_mask": 0, "labels": -100}


def _pad_ints(values: Sequence[Sequence[int]], longest: int, pad: int) -> torch.Tensor:
    """``(len(values), longest)`` int64, each row a value padded on the right with ``pad``.

    One flat pass over all values and one masked write: twice as fast as a tensor from
    padded Python lists, which mattered once the GPU outran the host collating its batches."""
    lengths = np.fromiter(map(len, values), np.int64, len(values))
    out = np.full((len(values), longest), pad, np.int64)
    out[np.arange(longest)[None, :] < lengths[:, None]] = np.fromiter(itertools.chain.from_iterable(values), np.int64,
                                                                       int(lengths.sum()))
    return torch.from_numpy(out)


def collate(features: Sequence[Mapping], pad_values: Optional[Dict[str, int]] = None, multiple_of: int = 1) -> Dict[str, torch.Tensor]:
    """Stack features into tensors, padding list fields on the right.

    Args:
        features: dicts with the same keys; list values are sequences, scalars are labels.
        pad_values: per-field pad value (defaults to :data:`PAD_VALUES`, then 0).
        multiple_of: round the padded length up (8 suits tensor cores).

    Returns:
        Dict of tensors; sequence fields are ``(batch, seq)``. Float scalars (regression
        targets) and float arrays (``(k,)`` or ``(seq, k)``, e.g. a teacher's logits) become
        float32, everything else int64. Fields whose values are None
        (e.g. labels of a test set) or strings are left out.
    """
    pads = {**PAD_VALUES, **(pad_values or {})}
    out: Dict[str, torch.Tensor] = {}
    for key in features[0]:
        values = [f[key] for f in features]
        if any(v is None for v in values) or isinstance(values[0], str):
            continue
        if isinstance(values[0], (list, tuple)):
            longest = max(len(v) for v in values)
            longest = -(-longest // multiple_of) * multiple_of
            pad = pads.get(key, 0)
            out[key] = _pad_ints(values, longest, pad)
        elif isinstance(values[0], (np.ndarray, torch.Tensor)):
            # float arrays per example (a teacher's logits): stacked as float32. A 1-D array has
            # a fixed size (classes); a 2-D one is (seq, k), padded with zero rows like the sequences.
            arrays = [torch.as_tensor(np.asarray(v), dtype=torch.float32) for v in values]
            longest = -(-max(a.shape[0] for a in arrays) // multiple_of) * multiple_of if arrays[0].dim() > 1 else 0
            if longest:
                arrays = [F.pad(a, (0, 0) * (a.dim() - 1) + (0, longest - a.shape[0])) for a in arrays]
            out[key] = torch.stack(arrays)
        elif isinstance(values[0], float):
            out[key] = torch.tensor(values, dtype=torch.float32)
        elif isinstance(values[0], (int, bool)):
            out[key] = torch.tensor(values, dtype=torch.long)
    return out


def length_grouped_batches(lengths: Sequence[int], batch_size: int, seed: int, epoch: int, group_factor: int = 50) -> List[List[int]]:
    """A shuffled epoch of batches whose members have similar lengths.

    Indices are shuffled, cut into groups of ``batch_size * group_factor``, each group is
    sorted by length and cut into batches, and the batch order is shuffled. The result is
    a pure function of ``(seed, epoch)``, so a resumed run regenerates the same order.

    Returns:
        List of index lists.
    """
    rng = random.Random(seed * 1_000_003 + epoch)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    if group_factor <= 0:  # plain shuffled batches
        return [order[b : b + batch_size] for b in range(0, len(order), batch_size)]
    group = batch_size * group_factor
    batches: List[List[int]] = []
    for g in range(0, len(order), group):
        chunk = sorted(order[g : g + group], key=lambda i: -lengths[i])
        batches.extend(chunk[b : b + batch_size] for b in range(0, len(chunk), batch_size))
    rng.shuffle(batches)
    return batches


def balanced_batches(lengths: Sequence[int], batch_size: int, seed: int, epoch: int) -> List[List[int]]:
    """A shuffled epoch of batches that all hold about the same number of tokens.

    For packed training (every batch's tokens in one row of a fixed width): the examples,
    shuffled, are sorted by length (ties keep the shuffled order) and dealt to the batches
    like cards in a snake draft (batch 0, 1, ..., n-1, then n-1, ..., 0, ...), so each batch
    gets one example of every rank of length and every batch's total is within about one
    example's length of the others'. The totals depend only on the lengths (the same every
    epoch), so one row width serves the whole run (:func:`balanced_batch_tokens`); which
    examples of equal length share a batch, and the batch order, change every epoch. Batches
    hold ``batch_size`` examples, or one fewer when the data does not divide evenly.

    Returns:
        List of index lists, a pure function of ``(seed, epoch)``.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    if n == 0:
        return []
    n_batches = -(-n // batch_size)
    rng = np.random.default_rng([seed, epoch])
    shuffled = rng.permutation(n)
    order = shuffled[np.argsort(-lengths[shuffled], kind="stable")]
    deal, pos = np.divmod(np.arange(n), n_batches)
    target = np.where(deal % 2 == 0, pos, n_batches - 1 - pos)
    by_batch = order[np.argsort(target, kind="stable")]
    batches = np.split(by_batch, np.cumsum(np.bincount(target, minlength=n_batches))[:-1])
    return [batches[b].tolist() for b in rng.permutation(n_batches)]


def balanced_batch_tokens(lengths: Sequence[int], batch_size: int) -> Tuple[int, int]:
    """The most and the fewest tokens a batch of :func:`balanced_batches` holds (the same
    every epoch), counting a short batch filled up to ``batch_size`` with copies of its
    shortest example."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if not len(lengths):
        return 0, 0
    totals = []
    for batch in balanced_batches(lengths, batch_size, 0, 0):
        sizes = lengths[batch]
        totals.append(int(sizes.sum()) + (batch_size - len(batch)) * int(sizes.min()))
    return max(totals), min(totals)


def sequential_batches(lengths: Sequence[int], batch_size: int, sort: bool = True) -> Iterator[List[int]]:
    """Batches for evaluation: sorted by length (less padding) when ``sort``; callers
    put results back in input order with the returned indices."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i]) if sort else list(range(len(lengths)))
    for b in range(0, len(order), batch_size):
        yield order[b : b + batch_size]
