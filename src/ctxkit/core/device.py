"""Where and how tensors run: the device ("auto" = CUDA when available), bf16 autocast,
and one seed for Python, NumPy and torch."""

from __future__ import annotations

import random

import numpy as np
import torch

__all__ = ["resolve_device", "autocast", "set_seed"]


def resolve_device(device: str) -> torch.device:
    """"auto" means CUDA when available."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def autocast(device: torch.device, precision: str, cache_enabled: bool = True):
    """bf16 autocast on CUDA (or when asked), a no-op context for fp32.

    ``cache_enabled=False`` is required inside CUDA-graph capture.
    """
    use_bf16 = precision == "bf16" or (precision == "auto" and device.type == "cuda")
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_bf16, cache_enabled=cache_enabled)


def set_seed(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
