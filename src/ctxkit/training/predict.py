"""Batched inference over feature dicts with a trained model (length-sorted batches)."""

from __future__ import annotations

import queue
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, Iterable, Iterator, Optional, Sequence, Union

import numpy as np
import torch
from torch import nn

from ..data.batching import collate, sequential_batches
from ..data.blocks import TokenBlock
from . import progress
from ..core.capabilities import TakesHostInputs, declared_precision, declares
from ..core.run_state import autocast, resolve_device, resolve_precision
from .steps import to_device

__all__ = ["predict", "featurized_ahead"]


_INPUTS = ("input_ids", "token_type_ids", "attention_mask")


@torch.inference_mode()
def predict(model: nn.Module, features: Union[Sequence[dict], TokenBlock, Iterable], batch_size: int = 128,
            device: str = "auto", precision: Optional[str] = None, output: str = "logits", total: Optional[int] = None) -> list:
    """Run ``model`` over features (length-sorted batches) and return per-feature outputs.

    On a GPU, batches are collated into pinned memory by a helper thread while the device
    runs the batch before, and outputs come back by asynchronous copies: the host never
    waits for the device except to read a finished batch, so host work overlaps device work.

    Args:
        model: module returning a dict; ``output`` names the entry to collect. Entries may
            be a tensor or a tuple of tensors (e.g. start and end logits). A model whose
            class sets ``takes_host_inputs`` (the GPU encoder, which copies from pinned
            memory into its captured graphs itself) gets the host tensors.
        features: feature dicts as for training (labels are ignored), or a
            :class:`~ctxkit.data.blocks.TokenBlock` of single texts; or an iterable of
            either (chunks, e.g. tokenized by a helper while the chunk before runs:
            :func:`featurized_ahead`), each sorted into batches of its own, the outputs
            concatenated in order.
        precision: "fp32" (no autocast), "bf16" (bf16 autocast), or None / "auto" (bf16
            on CUDA, fp32 on CPU). A model that declares ``inference_precision`` (the pytorch
            backend asked for a precision: :class:`ctxkit.inference.backends.PrecisionModel`;
            the GPU encoder, which sets its own dtypes: "native") runs at that precision instead.
        total: the number of features in all chunks (sizes the progress bar; chunks only).

    Returns:
        One float32 numpy array (or tuple of arrays) per feature, in input order, with
        sequence outputs trimmed to the feature's own length.
    """
    dev = resolve_device(device)
    # What the model was built to run at wins over this call's precision; "native" = no autocast.
    declared = declared_precision(model)
    if declared is not None:
        precision = "bf16" if declared == "bf16" else "fp32"
    precision = resolve_precision(precision, dev)
    whole = isinstance(features, (Sequence, TokenBlock))
    chunks = [features] if whole else features
    if whole:
        total = len(features)
    on_gpu = dev.type == "cuda"
    host_inputs = declares(model, TakesHostInputs)
    was_training = model.training
    model.eval()
    results: list = []
    progress.begin(total or 0)  # an enclosing evaluate() shows a bar; a no-op otherwise

    def batches():
        """``(lengths, first index, indices, host batch)`` for every batch of every chunk."""
        for chunk in chunks:
            block = isinstance(chunk, TokenBlock)
            lengths = chunk.lengths.tolist() if block else [len(f["input_ids"]) for f in chunk]
            first = len(results)
            results.extend([None] * len(chunk))
            for idx in sequential_batches(lengths, batch_size):
                if block:  # array slices, no per-text objects
                    batch = {k: torch.from_numpy(v) for k, v in chunk.batch(idx).items()}
                else:
                    batch = collate([{k: v for k, v in chunk[i].items() if k in _INPUTS} for i in idx])
                if on_gpu:  # pinned: the copy to the device runs while the host goes on
                    batch = {k: v.pin_memory() for k, v in batch.items()}
                yield lengths, first, idx, batch

    def finish(lengths, first, idx, batch, out, done) -> None:
        if done is not None:
            done.synchronize()  # this batch only: the one queued after it keeps the device busy
        parts = out if isinstance(out, tuple) else (out,)
        parts = [p.float().cpu().numpy() for p in parts]
        for row, i in enumerate(idx):
            trimmed = tuple(p[row, : lengths[i]] if _is_seq(p, batch) else p[row] for p in parts)
            results[first + i] = trimmed if isinstance(out, tuple) else trimmed[0]
        progress.advance(len(idx))

    pending: deque = deque()
    for lengths, first, idx, batch in (_ahead(batches(), depth=4) if on_gpu else batches()):
        with autocast(dev, precision):
            out = model(**(batch if host_inputs else to_device(batch, dev)))[output]
        done = None
        if on_gpu:  # read back asynchronously; finish() waits for this batch alone
            out = tuple(t.to("cpu", non_blocking=True) for t in out) if isinstance(out, tuple) else out.to("cpu", non_blocking=True)
            done = torch.cuda.Event()
            done.record()
        pending.append((lengths, first, idx, batch, out, done))
        if len(pending) > 1:  # one batch in flight on the device while the host reads the one before
            finish(*pending.popleft())
    while pending:
        finish(*pending.popleft())
    model.train(was_training)
    return results


def featurized_ahead(featurize: Callable[[list], list], items: Sequence, chunk: int) -> Iterator[list]:
    """``featurize`` over ``items`` in chunks of ``chunk``, each tokenized by a helper thread
    while the caller uses the chunk before (the ``tokenizers`` library releases the GIL), for
    :func:`predict`'s chunked form."""
    # The first chunk small: nothing runs beside its tokenizing, so it is the pipeline's start-up.
    first = max(1, chunk // 8)
    parts = [items[:first]] + [items[i:i + chunk] for i in range(first, len(items), chunk)] if items else []
    with ThreadPoolExecutor(1, thread_name_prefix="ctxkit-featurize") as pool:
        future = pool.submit(featurize, parts[0]) if parts else None
        for k in range(len(parts)):
            feats = future.result()
            future = pool.submit(featurize, parts[k + 1]) if k + 1 < len(parts) else None
            yield feats


def _ahead(iterator: Iterator, depth: int) -> Iterator:
    """The items of ``iterator``, produced by a helper thread up to ``depth`` ahead of the
    consumer; its exceptions are raised in the consumer. The thread stops when the consumer
    stops early."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    end = object()

    def produce():
        try:
            for item in iterator:
                while not stop.is_set():
                    try:
                        q.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put((end, None))
        except BaseException as exc:  # handed to the consumer, raised there
            q.put((end, exc))

    thread = threading.Thread(target=produce, name="ctxkit-collate", daemon=True)
    thread.start()
    try:
        while True:
            item, exc = q.get()
            if item is end:
                if exc is not None:
                    raise exc
                return
            yield item
    finally:
        stop.set()
        thread.join(timeout=5)


def _is_seq(array: np.ndarray, batch: Dict[str, torch.Tensor]) -> bool:
    # A per-token output has the batch's padded length as its second axis.
    return array.ndim >= 2 and array.shape[1] == batch["input_ids"].shape[1]
