"""Faster fp32 matrix-vector products on CPU for token-by-token decoding.

Decoding one token per row multiplies each weight matrix by a single vector, so a step
costs one read of every weight: it is bound by memory bandwidth. PyTorch's CPU build
sends these products to MKL, which on some processors (this project's AMD CPUs among
them) reads weights at about half the speed of OpenBLAS, the BLAS that NumPy ships with
(`benchmarks/generate.py --device cpu` measures both). :class:`NumpyGemv` routes the
``linear`` calls of a decoding step with at most ``max_rows`` rows to NumPy's BLAS,
reading the same weight memory (no copies), in fp32 as before; larger products (the
prompt) and everything else stay in PyTorch.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

__all__ = ["NumpyGemv", "cpu_decoding_context"]


class NumpyGemv(TorchFunctionMode):
    """A torch-function mode: fp32 CPU ``F.linear`` with few rows runs through NumPy.

    Args:
        max_rows: products with at most this many rows (batch x new positions) are
            routed; NumPy's BLAS is no faster for wider ones.

    Only used without autograd (NumPy cannot record gradients).
    """

    def __init__(self, max_rows: int = 2):
        super().__init__()
        self.max_rows = max_rows

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and not torch.is_grad_enabled():
            x, weight = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            if (x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
                    and weight.dim() == 2 and x.numel() // max(x.size(-1), 1) <= self.max_rows):
                rows = x.reshape(-1, x.size(-1)).contiguous().numpy()
                out = torch.from_numpy(rows @ weight.detach().numpy().T)
                if bias is not None:
                    out += bias.detach()
                return out.view(*x.shape[:-1], weight.size(0))
        return func(*args, **kwargs)


def cpu_decoding_context(input_ids: torch.Tensor, model, batch: int, enabled: Optional[bool] = None):
    """The context to decode in: :class:`NumpyGemv` (with NumPy's BLAS limited to
    PyTorch's thread count) for fp32 CPU models decoding one or two rows, else nothing.

    Args:
        input_ids: the prompts (their device decides).
        model: the model (its dtype decides).
        batch: rows decoded together (beams included).
        enabled: force on or off (None: the rule above).
    """
    params = getattr(model, "parameters", None)  # decoding views (e.g. BoundDecoder) are not modules
    if not callable(params):
        params = getattr(getattr(model, "model", None), "parameters", None)
    param = next(params(), None) if callable(params) else None
    if enabled is None:
        enabled = (input_ids.device.type == "cpu" and param is not None and param.dtype == torch.float32 and batch <= 2)
    if not enabled:
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    try:
        from threadpoolctl import threadpool_limits

        stack.enter_context(threadpool_limits(torch.get_num_threads(), user_api="blas"))
    except ImportError:  # optional: without it NumPy's BLAS uses its own default thread count
        pass
    stack.enter_context(NumpyGemv())
    # PyTorch's OpenMP workers spin-wait between ops and would take the cores from
    # NumPy's BLAS threads (measured: 2.5x slower); the ops left to PyTorch are tiny.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    stack.callback(torch.set_num_threads, threads)
    return stack
