"""Dropout whose mask is drawn outside compiled graphs, cheaply, as packed bits.

Under ``torch.compile`` a dropout is fused into its neighbours (BERT: the sub-layer
output's dropout, the residual add and the LayerNorm become one kernel), and Inductor draws
its random numbers inside that kernel with one Philox-4x32-10 evaluation *per element*,
keeping one of the four 32-bit words it makes. At BERT-base pretraining's 32768 x 768
activations that is ~25 M Philox evaluations per dropout: the fused norm kernel becomes
compute-bound (an H100 profile: 152 us per call against 79 us without the random numbers,
21 calls per step).

:class:`MaskDropout` computes ``x * keep / (1 - p)`` with ``keep ~ Bernoulli(1 - p)`` per
element, but draws ``keep`` behind an opaque custom op (``ctxkit::dropout_keep_bits``)
that returns the mask packed 8 elements per byte: on CUDA (and Triton's interpreter) the
kernel of :mod:`ctxkit.fast.dropout_kernels`, which makes 8 16-bit uniforms of each
Philox evaluation (1/8 of Inductor's Philox work, 1/2 of PyTorch's Bernoulli kernel's, and
a 3 MB mask instead of 25 MB); elsewhere PyTorch's Bernoulli kernel, then packed. Unpacking
(``(bits[i // 8] >> i % 8) & 1``) is index arithmetic that ``torch.compile`` fuses into the
kernels that read the mask, forward and backward.

What differs from ``nn.Dropout``, declared: ``p`` is rounded to a multiple of 2^-16 (0.1
becomes 6554 / 65536 = 0.100006; the scale is ``1 / (1 - p)`` of the rounded ``p``, so
the expectation stays ``x``), and the random stream is another one (seeded from the
default generator: reproducible with itself, not bit-identical to a run without it).

Swap it in with :func:`fast_dropout` (``TrainConfig(fast_dropout=True)`` does it for the
trainer). In eval mode, or with ``p == 0``, it is the identity, like ``nn.Dropout``.
"""

from __future__ import annotations

import torch
import torch.utils.checkpoint
from torch import Tensor, nn

from ._swap import swap, unswap
from .kernels import cached_answer, supported

__all__ = ["MaskDropout", "dropout_keep_mask", "fast_dropout", "unfast_dropout"]


_P_STEPS = 1 << 16  # p is rounded to a multiple of 1 / _P_STEPS


def _custom_op(name: str):
    """``torch.library.custom_op`` tagged nondeterministic_seeded where torch takes tags, so
    that compilers neither merge two calls nor recompute one in the backward (torch >= 2.4
    without tags: AOTAutograd already never recomputes an opaque op)."""
    try:
        return torch.library.custom_op(name, mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,))
    except TypeError:  # pragma: no cover - torch without the tags argument
        return torch.library.custom_op(name, mutates_args=())


@cached_answer
def _kernel_runs(device_type: str) -> bool:
    return supported("dropout_bits", torch.device(device_type)) is None


def _threshold(p: float) -> int:
    """Drop an element when its 16-bit uniform is below this (p rounded to 2^-16)."""
    return min(_P_STEPS, max(0, round(p * _P_STEPS)))


@_custom_op("ctxkit::dropout_keep_bits")
def _keep_bits(x: Tensor, threshold: int, token: Tensor) -> Tensor:
    n = x.numel()
    if _kernel_runs(x.device.type):
        from . import dropout_kernels  # lazy: imports triton (the gpu extra)

        return dropout_kernels.keep_bits(n, threshold, x.device)
    n_bytes = (n + 7) // 8
    keep = torch.empty(n_bytes, 8, dtype=torch.uint8, device=x.device).bernoulli_(1.0 - threshold / _P_STEPS)
    return (keep << torch.arange(8, dtype=torch.uint8, device=x.device)).sum(-1, dtype=torch.uint8)


@_keep_bits.register_fake
def _(x: Tensor, threshold: int, token: Tensor) -> Tensor:
    return x.new_empty((x.numel() + 7) // 8, dtype=torch.uint8)


def dropout_keep_mask(x: Tensor, p: float) -> Tensor:
    """A uint8 0/1 tensor shaped like ``x``, each element 1 with probability ``1 - p``
    (``p`` rounded to a multiple of 2^-16), independently, from a seed the default
    generator of ``x``'s device draws.

    The mask is drawn packed (``ctxkit::dropout_keep_bits``, 8 elements a byte) and unpacked
    here with index arithmetic that ``torch.compile`` fuses into the mask's readers. Every
    call draws anew, also inside a compiled graph: AOTAutograd's common-subexpression pass
    would otherwise merge two calls on the same ``x`` into one mask (it spares only the
    random ops it lists, not tagged custom ops), so each call passes a fresh empty
    ``token`` tensor, which that pass never merges; it costs no kernel.
    """
    return _unpack(_keep_bits(x, _threshold(p), torch.empty(0, device=x.device)), x)


def _unpack(bits: Tensor, like: Tensor) -> Tensor:
    """The 0/1 uint8 mask shaped like ``like`` from its packed bits (least significant first)."""
    shifts = torch.arange(8, dtype=torch.uint8, device=bits.device)
    return ((bits.view(-1, 1) >> shifts) & 1).view(-1)[: like.numel()].view(like.shape)


def _apply_mask(x: Tensor, bits: Tensor, scale: float) -> Tensor:
    return x * _unpack(bits, x) * scale


def _masked(x: Tensor, bits: Tensor, scale: float) -> Tensor:
    """``x * keep * scale``. Under autograd the multiply runs as a checkpointed region, so the
    backward unpacks the saved bits again (an eighth of a byte per element) instead of
    keeping the unpacked mask (a byte per element), which AOTAutograd's partitioner
    otherwise saves for some of a layer's dropouts."""
    if not torch.is_grad_enabled() or not x.requires_grad:
        return _apply_mask(x, bits, scale)
    return torch.utils.checkpoint.checkpoint(_apply_mask, x, bits, scale, use_reentrant=False)


class MaskDropout(nn.Dropout):
    """:class:`torch.nn.Dropout` with the keep-mask drawn as packed bits outside the compiled
    graph (:func:`dropout_keep_mask`) and applied as ``x * keep / (1 - p)`` (``p`` rounded
    to a multiple of 2^-16).

    Shapes: any ``x`` -> the same shape and dtype.
    """

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        threshold = _threshold(float(self.p))
        if threshold >= _P_STEPS:  # p = 1 (after rounding): nn.Dropout zeroes everything
            return x * 0.0
        bits = _keep_bits(x, threshold, torch.empty(0, device=x.device))  # (see dropout_keep_mask)
        return _masked(x, bits, _P_STEPS / (_P_STEPS - threshold))


def fast_dropout(model: nn.Module) -> int:
    """Swap every :class:`torch.nn.Dropout` module of ``model`` (in place) to
    :class:`MaskDropout`; returns how many. Attention-probability dropout passed to
    ``scaled_dot_product_attention`` as ``dropout_p`` stays inside the attention kernel.
    ``inplace=True`` modules are left alone."""
    count = 0
    for module in model.modules():
        if type(module) is nn.Dropout and not module.inplace:
            swap(module, MaskDropout)
            count += 1
    return count


def unfast_dropout(model: nn.Module) -> int:
    """Swap every :class:`MaskDropout` of ``model`` back to :class:`torch.nn.Dropout`; returns how many."""
    found = [m for m in model.modules() if isinstance(m, MaskDropout)]
    for module in found:
        unswap(module, MaskDropout)
    return len(found)
