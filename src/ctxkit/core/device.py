"""Where and how tensors run: the device ("auto" = CUDA when available), bf16 autocast,
and one seed for Python, NumPy and torch."""

from __future__ import annotations

import random

import numpy as np
import torch

from .errors import UserError

__all__ = ["resolve_device", "check_device", "autocast", "set_seed"]


def resolve_device(device: str) -> torch.device:
    """"auto" means CUDA when available; anything else must be a device this machine has
    (:func:`check_device`)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return check_device(device)


def check_device(device) -> torch.device:
    """The device ``device`` names, if this machine has it.

    Raises:
        UserError: not a device name, or a device this machine lacks (one line, with what to use).
    """
    if isinstance(device, torch.device):
        dev = device
    else:
        try:
            dev = torch.device(str(device))
        except (RuntimeError, ValueError):
            raise UserError(f"--device {device}: not a device name; use auto, cpu, cuda, cuda:N or mps") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch is built without CUDA" if torch.version.cuda is None else "it sees no GPU"
            raise UserError(f"--device {device}: no CUDA device here ({why}); use --device cpu or auto")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UserError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s), cuda:0 to "
                            f"cuda:{torch.cuda.device_count() - 1}")
    elif dev.type == "mps":
        if not (getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()):
            raise UserError(f"--device {device}: no Apple MPS device here; use --device cpu or auto")
    elif dev.type not in ("cpu", "meta"):
        raise UserError(f"--device {device}: ctxkit runs on cpu, cuda or mps")
    return dev


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
