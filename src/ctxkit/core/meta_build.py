"""Building a module on the meta device without running its initialisers.

Loaders build the module skeleton on ``torch.device("meta")`` and assign the checkpoint's
tensors into it (``load_state_dict(..., assign=True)``): no memory, no random numbers. But
``nn.init.normal_`` on a meta tensor goes through ``torch._refs``, whose wrapper imports
``torch._dynamo`` on first use: 2.8 s of a process's start (``ctxkit predict`` or ``serve`` on
a CPU spent most of its model loading there) for an initialisation that does nothing on meta.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

import torch
from torch.nn import init

#: the initialisers torch's layers (and ctxkit's) call from ``reset_parameters``
_INITS = ("normal_", "uniform_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_", "xavier_normal_",
          "zeros_", "ones_", "constant_", "orthogonal_")
_lock = threading.Lock()
_depth = 0
_originals: dict = {}


def _skipping_meta(original):
    def initialise(tensor, *args, **kwargs):
        # On a meta tensor an initialiser has nothing to write: return it untouched. Any other
        # tensor (another thread building a real model meanwhile) is initialised as always.
        return tensor if tensor.is_meta else original(tensor, *args, **kwargs)

    initialise.__wrapped__ = original
    return initialise


@contextlib.contextmanager
def meta_device() -> Iterator[None]:
    """``with torch.device("meta")``, with ``torch.nn.init``'s initialisers returning meta
    tensors untouched (the same result, without importing ``torch._dynamo``)."""
    global _depth
    with _lock:
        if _depth == 0:
            for name in _INITS:
                if hasattr(init, name):
                    _originals[name] = getattr(init, name)
                    setattr(init, name, _skipping_meta(_originals[name]))
        _depth += 1
    try:
        with torch.device("meta"):
            yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                for name, original in _originals.items():
                    setattr(init, name, original)
                _originals.clear()
