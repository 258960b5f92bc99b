"""Mixed-precision helper shared by the layers that write the residual stream."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

__all__ = ["to_stream_dtype"]


def to_stream_dtype(x: Tensor, dtype: Optional[torch.dtype]) -> Tensor:
    """Cast the residual stream ``x`` to ``dtype`` while autocast is on, else return it.

    Under autocast LayerNorm runs (and returns) float32, so the residual stream between
    layers is float32: every norm, residual add and dropout then moves twice the bytes,
    and every following matmul casts it back to bf16 first. Keeping the stream in bf16
    (the norm still computes in float32 inside) halves that memory traffic; the price is
    bf16 rounding of the stream once per sub-layer, as in pure-bf16 training recipes.
    """
    if dtype is None or x.dtype == dtype or not torch.is_autocast_enabled(x.device.type):
        return x
    return x.to(dtype)
