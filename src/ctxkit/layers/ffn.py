"""Position-wise feed-forward network: the same two-layer MLP applied at every position.

(:class:`ctxkit.fast.GeluEpilogueFFN` is the inference variant whose first GEMM applies
the bias and GELU in its epilogue.)
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from ..core.errors import UserError

__all__ = ["PositionwiseFFN", "get_activation", "ACTIVATIONS"]


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

    def forward(self, x: Tensor) -> Tensor:
        """Args: x ``(batch, seq, dim)``. Returns ``(batch, seq, dim)``."""
        return self.fc2(self.dropout(self.activation(self.fc1(x))))

