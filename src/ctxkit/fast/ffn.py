"""GELU-epilogue feed-forward block: ``gelu(fc1(x))`` as one cuBLASLt GEMM (inference).

cuBLASLt can apply a bias and the tanh GELU in a GEMM's epilogue, so the ``(tokens, 4h)``
activation is written once instead of written, read and written again by a separate
elementwise kernel. Its GELU is the tanh form: exact for tanh-GELU models (GPT-2), a
declared approximation for erf-GELU models such as BERT (``|gelu_erf - gelu_tanh| < 5e-4``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..layers.ffn import PositionwiseFFN
from ._swap import swap

__all__ = ["GeluEpilogueFFN", "enable_gelu_epilogue", "linear_gelu_tanh"]


@torch.library.custom_op("ctxkit::linear_gelu_tanh", mutates_args=())
def _linear_gelu_tanh(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    flat = x.reshape(-1, x.shape[-1])
    if x.is_cuda:
        # cuBLASLt applies bias and the tanh GELU in the GEMM's epilogue: the (tokens, 4h)
        # activation is written once instead of written, read and written again.
        out = torch._addmm_activation(bias, flat, weight.t(), use_gelu=True)
    else:  # CPU's _addmm_activation uses the erf GELU: spell the tanh form out
        out = F.gelu(torch.addmm(bias, flat, weight.t()), approximate="tanh")
    return out.view(*x.shape[:-1], weight.shape[0])


@_linear_gelu_tanh.register_fake
def _(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def linear_gelu_tanh(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """``gelu_tanh(x @ weight.T + bias)`` with the bias and GELU in the GEMM (inference only).

    A custom op, so ``torch.compile`` keeps it as one cuBLASLt call instead of splitting it
    into a GEMM and an elementwise kernel. No autograd formula: use under ``torch.no_grad``
    or ``torch.inference_mode``.

    Args:
        x: ``(..., in_features)``.
        weight: ``(out_features, in_features)``; bias: ``(out_features,)``.

    Returns:
        ``(..., out_features)``.
    """
    return _linear_gelu_tanh(x, weight, bias)


class GeluEpilogueFFN(PositionwiseFFN):
    """:class:`~ctxkit.layers.ffn.PositionwiseFFN` whose ``gelu(fc1(x))`` runs as one GEMM
    with the bias and tanh GELU in its epilogue (:func:`linear_gelu_tanh`) when autograd
    is off; with autograd on it is the plain layer (erf or tanh GELU as configured).
    Swap it in with :func:`enable_gelu_epilogue`."""

    def forward(self, x: Tensor) -> Tensor:
        """Args: x ``(batch, seq, dim)``. Returns ``(batch, seq, dim)``."""
        if torch.is_grad_enabled():  # no autograd formula: the plain, differentiable path
            return super().forward(x)
        return self.fc2(self.dropout(linear_gelu_tanh(x, self.fc1.weight, self.fc1.bias)))


def enable_gelu_epilogue(model: nn.Module) -> int:
    """Swap every GELU :class:`~ctxkit.layers.ffn.PositionwiseFFN` in ``model`` (with a plain
    ``Linear`` ``fc1``) to :class:`GeluEpilogueFFN`, in place; idempotent. Returns how many
    are in that form. Exact for tanh-GELU models (GPT-2); for erf-GELU models (BERT) a
    declared approximation: ``|gelu_erf - gelu_tanh| < 5e-4``."""
    ffns = [m for m in model.modules() if isinstance(m, PositionwiseFFN) and m.activation_name.startswith("gelu")
            and type(m.fc1) is nn.Linear]
    for ffn in ffns:
        swap(ffn, GeluEpilogueFFN)
    return len(ffns)
