"""Quaternion linear layers (Parcollet et al. 2019; the Quaternion Transformer of Tay et al. 2019).

A quaternion ``q = a + b i + c j + d k`` multiplies another one by the Hamilton product
(``i^2 = j^2 = k^2 = ijk = -1``)::

    q (x) x = (a a' - b b' - c c' - d d')
            + (a b' + b a' + c d' - d c') i
            + (a c' - b d' + c a' + d b') j
            + (a d' + b c' - c b' + d a') k

A :class:`QuaternionLinear` reads its ``in_features`` inputs as ``in/4`` quaternions and
writes ``out/4`` quaternions, each output the sum over the inputs of ``W[o, g] (x) x[g]``:
the weight quaternion on the *left*. The features are laid out component by component,
``x = [x_r | x_i | x_j | x_k]`` (four contiguous blocks of ``in/4``), as in Parcollet's
implementation, so quaternion ``g`` is ``(x_r[g], x_i[g], x_j[g], x_k[g])``.

Left multiplication by a weight quaternion ``(r, i, j, k)`` (real part ``r``, imaginary
parts ``i, j, k``) is a real 4x4 matrix, and the whole layer is one real ``(out, in)``
matrix made of the four component matrices ``r, i, j, k`` (each ``(out/4, in/4)``)::

    [[r, -i, -j, -k],     rows: real part of the output
     [i,  r, -k,  j],           i part
     [j,  k,  r, -i],           j part
     [k, -j,  i,  r]]           k part

(reading row 2: ``out_i = i a' + r b' - k c' + j d'``, the ``i`` line above with the
weight's components ``(r, i, j, k)`` as ``(a, b, c, d)``). The forward pass builds that
matrix and makes one GEMM of it: ``F.linear`` on the real matrix is both the fastest and
the plainest way to compute the sum of Hamilton products. Every weight is used four times,
so the layer holds a quarter of the weights of an ``nn.Linear`` of the same shape; the bias
stays real and full size (``out`` values), as in Parcollet's reference code.

:func:`quaternionize` swaps such layers in for the ``nn.Linear`` projections of a built
model (attention's ``q_proj`` ... ``out_proj``, the FFN's ``fc1`` / ``fc2``), leaving the
shared Transformer layers themselves as they are.
"""

from __future__ import annotations

import math
from typing import List, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.errors import UserError

__all__ = ["QuaternionLinear", "quaternionize", "hamilton_product", "QUATERNION_TARGETS"]

# The projections of ctxkit's MultiHeadAttention and PositionwiseFFN.
QUATERNION_TARGETS: Tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2")
_CRITERIA = ("glorot", "he")


def hamilton_product(q: Tensor, x: Tensor) -> Tensor:
    """The Hamilton product ``q (x) x`` of quaternions stored as ``(..., 4)`` = (a, b, c, d).

    Written out component by component (the definition, not the block matrix), for checks
    and teaching; broadcasts over the leading axes.

    Args:
        q, x: ``(..., 4)``.

    Returns:
        ``(..., 4)``.
    """
    a, b, c, d = q.unbind(-1)
    e, f, g, h = x.unbind(-1)
    return torch.stack([a * e - b * f - c * g - d * h,
                        a * f + b * e + c * h - d * g,
                        a * g - b * h + c * e + d * f,
                        a * h + b * g - c * f + d * e], dim=-1)


class QuaternionLinear(nn.Module):
    """``y = W (x) x + b``: a linear map between quaternion vectors, with a quarter of the weights.

    Args:
        in_features: input size; a multiple of 4 (``in/4`` quaternions).
        out_features: output size; a multiple of 4.
        bias: add a real bias of ``out_features`` values (not a quaternion-structured one).
        criterion: initialisation scale, ``"glorot"`` (default; per-component variance
            ``2 / (in + out)``, the real Glorot variance) or ``"he"`` (``2 / in``).
        device, dtype: where and in what the parameters live.

    Attributes:
        r_weight, i_weight, j_weight, k_weight: the weight quaternions' components, each
            ``(out/4, in/4)`` (Parcollet's names).
        bias: ``(out_features,)`` or None.

    ``weight()`` is a *method* (as for torch's dynamically quantised ``Linear``): it builds
    the ``(out, in)`` real matrix. Code that fuses projections by concatenating their
    ``.weight`` tensors (:class:`ctxkit.fast.FusedQKVAttention`) sees no tensor and calls
    each projection instead.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, criterion: str = "glorot", device=None, dtype=None):
        super().__init__()
        if in_features % 4 or out_features % 4 or in_features <= 0 or out_features <= 0:
            raise UserError(f"QuaternionLinear needs positive sizes divisible by 4, got in_features={in_features}, "
                            f"out_features={out_features}")
        if criterion not in _CRITERIA:
            raise UserError(f"unknown quaternion init criterion {criterion!r}; choose one of {list(_CRITERIA)}")
        self.in_features, self.out_features, self.criterion = in_features, out_features, criterion
        kw = dict(device=device, dtype=dtype)
        shape = (out_features // 4, in_features // 4)
        self.r_weight = nn.Parameter(torch.empty(shape, **kw))
        self.i_weight = nn.Parameter(torch.empty(shape, **kw))
        self.j_weight = nn.Parameter(torch.empty(shape, **kw))
        self.k_weight = nn.Parameter(torch.empty(shape, **kw))
        self.bias = nn.Parameter(torch.empty(out_features, **kw)) if bias else None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Quaternion Glorot/He initialisation (Parcollet et al. 2019, "Quaternion recurrent neural networks").

        Each weight is ``w = phi (cos theta + u sin theta)``: a modulus ``phi`` drawn from
        a chi distribution with 4 degrees of freedom scaled by ``sigma`` (the norm of a 4-d
        Gaussian with standard deviation ``sigma``), a phase ``theta ~ U(-pi, pi)`` and a
        unit pure quaternion ``u`` uniform on the sphere (a normalised 3-d Gaussian;
        Parcollet's code normalises a uniform cube draw instead). ``E|w|^2 = 4 sigma^2``, so
        the mean variance per component is ``sigma^2``; every output sums all four
        components of ``in/4`` weights, hence an output variance of ``in * sigma^2`` times
        the input's, as for a real matrix with variance ``sigma^2``. With
        ``sigma^2 = 1 / (2 (n_in + n_out))`` over quaternion counts ``n = features / 4``,
        that is ``2 / (in + out)``: the real Glorot variance. Biases start at zero (as in
        Parcollet's code).
        """
        if self.r_weight.is_meta:  # no values to draw (a model built to adopt loaded tensors)
            return
        n_in, n_out = self.in_features // 4, self.out_features // 4
        sigma = 1.0 / math.sqrt(2 * (n_in + n_out)) if self.criterion == "glorot" else 1.0 / math.sqrt(2 * n_in)
        ref = self.r_weight
        shape = ref.shape
        modulus = sigma * torch.randn((4,) + tuple(shape), device=ref.device, dtype=ref.dtype).norm(dim=0)  # chi, 4 DoF
        phase = torch.empty(shape, device=ref.device, dtype=ref.dtype).uniform_(-math.pi, math.pi)
        axis = torch.randn((3,) + tuple(shape), device=ref.device, dtype=ref.dtype)
        axis = axis / axis.norm(dim=0).clamp_min(torch.finfo(ref.dtype).tiny)  # unit pure quaternion
        self.r_weight.copy_(modulus * phase.cos())
        for param, component in zip((self.i_weight, self.j_weight, self.k_weight), axis):
            param.copy_(modulus * component * phase.sin())
        if self.bias is not None:
            self.bias.zero_()

    def weight(self) -> Tensor:
        """The real ``(out_features, in_features)`` matrix of ``x -> W (x) x`` (module docstring)."""
        r, i, j, k = self.r_weight, self.i_weight, self.j_weight, self.k_weight
        return torch.cat([torch.cat([r, -i, -j, -k], dim=1),
                          torch.cat([i, r, -k, j], dim=1),
                          torch.cat([j, k, r, -i], dim=1),
                          torch.cat([k, -j, i, r], dim=1)], dim=0)

    def forward(self, x: Tensor) -> Tensor:
        """Args: x ``(..., in_features)``, components in blocks ``[r | i | j | k]``.
        Returns ``(..., out_features)``, laid out the same way."""
        return F.linear(x, self.weight(), self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"criterion={self.criterion!r}")


def quaternionize(module: nn.Module, names: Sequence[str] = QUATERNION_TARGETS, criterion: str = "glorot") -> Tuple[nn.Module, int]:
    """Replace the ``nn.Linear`` children called one of ``names`` by fresh :class:`QuaternionLinear`.

    Searches the whole module tree: in ctxkit's layers that is every attention's
    ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` and every FFN's ``fc1``, ``fc2``. Each
    replacement has the same shape, bias or not, device and dtype as the layer it replaces,
    and is freshly initialised (the real weights are *not* converted: there is no quaternion
    matrix equal to a general real one). Children that are already quaternion, or not
    ``nn.Linear``, are left alone, so calling it twice replaces nothing the second time.
    Every shape is checked before anything is replaced.

    Args:
        module: changed in place.
        names: attribute names of the children to replace.
        criterion: :class:`QuaternionLinear`'s initialisation.

    Returns:
        ``(module, number of layers replaced)``.

    Raises:
        UserError: a matching layer's sizes are not divisible by 4 (named, with its shape).
    """
    wanted = set(names)
    found: List[Tuple[nn.Module, str, str, nn.Linear]] = []
    for parent_name, parent in module.named_modules():
        for name, child in parent.named_children():
            if name in wanted and isinstance(child, nn.Linear):
                found.append((parent, name, f"{parent_name}.{name}" if parent_name else name, child))
    bad = [f"{path} ({child.in_features} -> {child.out_features})" for _, _, path, child in found
           if child.in_features % 4 or child.out_features % 4]
    if bad:
        raise UserError(f"quaternion layers need sizes divisible by 4; not divisible: {', '.join(bad)}")
    for parent, name, _, child in found:
        w = child.weight
        setattr(parent, name, QuaternionLinear(child.in_features, child.out_features, bias=child.bias is not None,
                                               criterion=criterion, device=w.device, dtype=w.dtype))
    return module, len(found)
