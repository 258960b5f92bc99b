"""Position-wise feed-forward network: the same two-layer MLP applied at every position."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.errors import UserError

__all__ = ["PositionwiseFFN", "get_activation", "ACTIVATIONS", "linear_gelu_tanh", "enable_gelu_epilogue"]


def _gelu_tanh(x: Tensor) -> Tensor:
    return F.gelu(x, approximate="tanh")


# Names follow the HF config vocabulary so checkpoints map one to one.
ACTIVATIONS = {
    "gelu": F.gelu,  # exact erf form (BERT)
    "gelu_new": _gelu_tanh,  # tanh approximation (GPT-2)
    "gelu_tanh": _gelu_tanh,
    "gelu_pytorch_tanh": _gelu_tanh,
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}


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


def get_activation(name: str):
    """Look up an activation function by its config name."""
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise UserError(f"unknown activation {name!r}; choose one of {sorted(ACTIVATIONS)}") from None


class PositionwiseFFN(nn.Module):
    """``fc2(act(fc1(x)))`` applied independently at every position.

    Args:
        dim: input and output size.
        hidden_dim: inner size (4 * dim in BERT and GPT-2).
        activation: activation name, see :data:`ACTIVATIONS`.
        dropout: dropout after the activation (0 in BERT, which drops only the output).
    """

    def __init__(self, dim: int, hidden_dim: int, activation: str = "gelu", dropout: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.activation_name = activation
        self.activation = get_activation(activation)
        self.dropout = nn.Dropout(dropout)

        # Set by ctxkit.inference.gpu for inference: fc1 + tanh GELU as one GEMM.
        self.gelu_epilogue = False

    def forward(self, x: Tensor) -> Tensor:
        """Args: x ``(batch, seq, dim)``. Returns ``(batch, seq, dim)``."""
        if self.gelu_epilogue and not torch.is_grad_enabled():
            inner = linear_gelu_tanh(x, self.fc1.weight, self.fc1.bias)
        else:
            inner = self.activation(self.fc1(x))
        return self.fc2(self.dropout(inner))


def enable_gelu_epilogue(model: nn.Module) -> int:
    """Switch every GELU :class:`PositionwiseFFN` in ``model`` to :func:`linear_gelu_tanh`
    for inference (in place); returns how many. Exact for tanh-GELU models (GPT-2); for
    erf-GELU models (BERT) a declared approximation: ``|gelu_erf - gelu_tanh| < 5e-4``."""
    ffns = [m for m in model.modules() if isinstance(m, PositionwiseFFN) and m.activation_name.startswith("gelu")]
    for ffn in ffns:
        ffn.gelu_epilogue = True
    return len(ffns)
