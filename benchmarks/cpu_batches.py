"""The batches and the timing loop of ``benchmarks/inference_cpu.py``'s SST-2 throughput cases.

Kept apart from the benchmark (which exports and quantises BERT-base) so that a unit test
can check, without timing anything, that the fair peer is fed exactly the batches
:func:`ctxkit.training.predict` makes: the same sentences in the same batches, in the same
order, padded to the same lengths (``tests/test_bench_inference_cpu.py``).

* :func:`length_sorted_batches`: ctxkit's batching (``predict``: longest first, cut every
  ``batch_size``), built by the same two functions ``predict`` calls
  (``sequential_batches`` and ``collate``); the fair peer gets these.
* :func:`file_order_batches`: the same sentences in file order, each batch padded to its
  longest, as a plain loop over a dataset would do; the file-order peer gets these.
* :func:`interleaved_seconds`: every runner's pass timed in interleaved rounds, ctxkit and
  peer runs alternating and the order rotated each round, so a slow stretch of a shared
  machine lands on both sides instead of on whichever ran then.
"""

from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch

from ctxkit.data.batching import collate, sequential_batches

# What predict() hands the model (it drops labels and anything else a feature carries).
MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask")

__all__ = ["MODEL_INPUTS", "Batch", "length_sorted_batches", "file_order_batches", "token_counts", "interleaved_order",
           "interleaved_seconds", "median_seconds"]


@dataclass(frozen=True)
class Batch:
    """One padded batch.

    Attributes:
        indices: the features in it, in row order (positions in the feature list).
        inputs: ``input_ids``, ``token_type_ids``, ``attention_mask``, each ``(batch, seq)``
            int64, right-padded to the batch's longest feature.
    """

    indices: list[int]
    inputs: dict[str, torch.Tensor]


def _batches(features: Sequence[Mapping], batch_size: int, sort: bool) -> list[Batch]:
    lengths = [len(f["input_ids"]) for f in features]
    # The same two calls, with the same arguments, as ctxkit.training.predict.
    return [Batch(list(idx), collate([{k: v for k, v in features[i].items() if k in MODEL_INPUTS} for i in idx]))
            for idx in sequential_batches(lengths, batch_size, sort=sort)]


def length_sorted_batches(features: Sequence[Mapping], batch_size: int) -> list[Batch]:
    """The batches ``predict(model, features, batch_size)`` runs the model on, in its order.

    Args:
        features: feature dicts with list-valued ``input_ids`` (and ``token_type_ids``,
            ``attention_mask``); other keys (labels) are left out, as ``predict`` does.
        batch_size: sentences per batch.

    Returns:
        One :class:`Batch` per model call, longest sentences first.
    """
    return _batches(features, batch_size, sort=True)


def file_order_batches(features: Sequence[Mapping], batch_size: int) -> list[Batch]:
    """``batch_size`` features at a time in file order, each batch padded to its longest."""
    return _batches(features, batch_size, sort=False)


def token_counts(batches: Sequence[Batch]) -> dict[str, int]:
    """``{"real": tokens of the sentences, "computed": batch x padded length, summed}``."""
    return {"real": int(sum(int(b.inputs["attention_mask"].sum()) for b in batches)),
            "computed": int(sum(b.inputs["input_ids"].numel() for b in batches))}


def interleaved_order(ours: Sequence[str], peers: Sequence[str], round_index: int) -> list[str]:
    """The runners' order in one round: ctxkit and peer runners alternating, rotated by the round.

    Args:
        ours: ctxkit's runner names.
        peers: the peers' runner names.
        round_index: 0, 1, ...; round ``r`` starts ``r`` places further along.

    Returns:
        Every name once.
    """
    alternating = [name for pair in itertools.zip_longest(ours, peers) for name in pair if name is not None]
    shift = round_index % len(alternating) if alternating else 0
    return alternating[shift:] + alternating[:shift]


def interleaved_seconds(ours: Mapping[str, Callable[[], object]], peers: Mapping[str, Callable[[], object]], rounds: int,
                        warmup: int = 1, clock: Callable[[], float] = time.perf_counter,
                        log: Callable[[str], None] = lambda _: None) -> dict[str, list[float]]:
    """Wall time of one pass of every runner, per round.

    Every runner first makes ``warmup`` untimed passes (compilation per shape, ONNX
    Runtime's memory plans); then each of ``rounds`` rounds times one pass of every runner,
    in :func:`interleaved_order`.

    Args:
        ours: ctxkit's runners by name; each call does one whole pass over the data.
        peers: the peers' runners by name (distinct from ``ours``' names).
        rounds: timed rounds (at least 1).
        warmup: untimed passes per runner before the first round.
        clock: the timer (seconds).
        log: called with one line per timed pass.

    Returns:
        ``{name: [seconds of round 0, round 1, ...]}``.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if set(ours) & set(peers):
        raise ValueError(f"a runner name is on both sides: {sorted(set(ours) & set(peers))}")
    runners = {**ours, **peers}
    for name, fn in runners.items():
        for _ in range(warmup):
            fn()
    seconds: dict[str, list[float]] = {name: [] for name in runners}
    for r in range(rounds):
        for name in interleaved_order(list(ours), list(peers), r):
            start = clock()
            runners[name]()
            seconds[name].append(clock() - start)
            log(f"  round {r + 1}/{rounds}: {name} {seconds[name][-1]:.2f} s")
    return seconds


def median_seconds(seconds: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """The median of each runner's rounds."""
    return {name: statistics.median(values) for name, values in seconds.items()}
