"""Batched inference over feature dicts with a trained model (length-sorted batches)."""

from __future__ import annotations

from typing import Dict, Optional, Sequence

import numpy as np
import torch
from torch import nn

from ..data.batching import collate, sequential_batches
from . import progress
from ..core.run_state import autocast, resolve_device, resolve_precision
from .trainer import _to

__all__ = ["predict"]


@torch.inference_mode()
def predict(model: nn.Module, features: Sequence[dict], batch_size: int = 128, device: str = "auto", precision: Optional[str] = None,
            output: str = "logits") -> list:
    """Run ``model`` over features (length-sorted batches) and return per-feature outputs.

    Args:
        model: module returning a dict; ``output`` names the entry to collect. Entries may
            be a tensor or a tuple of tensors (e.g. start and end logits).
        features: feature dicts as for training (labels are ignored).
        precision: "fp32" (no autocast), "bf16" (bf16 autocast), or None / "auto" (bf16
            on CUDA, fp32 on CPU). A model that declares ``inference_precision`` (the pytorch
            backend asked for a precision: :class:`ctxkit.inference.backends.PrecisionModel`;
            the GPU encoder, which sets its own dtypes: "native") runs at that precision instead.

    Returns:
        One float32 numpy array (or tuple of arrays) per feature, in input order, with
        sequence outputs trimmed to the feature's own length.
    """
    dev = resolve_device(device)
    # What the model was built to run at wins over this call's precision; "native" = no autocast.
    declared = getattr(model, "inference_precision", None)
    if declared is not None:
        precision = "bf16" if declared == "bf16" else "fp32"
    precision = resolve_precision(precision, dev)
    was_training = model.training
    model.eval()
    lengths = [len(f["input_ids"]) for f in features]
    results: list = [None] * len(features)
    progress.begin(len(features))  # an enclosing evaluate() shows a bar; a no-op otherwise
    def finish(idx, batch, out) -> None:
        parts = out if isinstance(out, tuple) else (out,)
        parts = [p.float().cpu().numpy() for p in parts]
        for row, i in enumerate(idx):
            trimmed = tuple(p[row, : lengths[i]] if _is_seq(p, batch) else p[row] for p in parts)
            results[i] = trimmed if isinstance(out, tuple) else trimmed[0]
        progress.advance(len(idx))

    # One batch in flight: the next batch is collated and queued on the device before the
    # previous one's outputs are read back (which waits for the device), so host work
    # overlaps device work instead of alternating with it.
    pending = None
    for idx in sequential_batches(lengths, batch_size):
        batch = collate([{k: v for k, v in features[i].items() if k in ("input_ids", "token_type_ids", "attention_mask")} for i in idx])
        with autocast(dev, precision):
            out = model(**_to(batch, dev))[output]
        if pending is not None:
            finish(*pending)
        pending = (idx, batch, out)
    if pending is not None:
        finish(*pending)
    model.train(was_training)
    return results


def _is_seq(array: np.ndarray, batch: Dict[str, torch.Tensor]) -> bool:
    # A per-token output has the batch's padded length as its second axis.
    return array.ndim >= 2 and array.shape[1] == batch["input_ids"].shape[1]
