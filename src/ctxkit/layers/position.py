"""Positional encodings: fixed sinusoidal (Vaswani et al.) and learned (BERT, GPT-2)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from ..core.errors import UserError

__all__ = ["sinusoidal_table", "SinusoidalPositionalEncoding", "LearnedPositionalEmbedding"]


def sinusoidal_table(max_len: int, dim: int) -> Tensor:
    """The sinusoidal position table.

    ``P[i, 2j] = sin(i / 10000^(2j/d))`` and ``P[i, 2j+1] = cos(i / 10000^(2j/d))``.

    Args:
        max_len: number of positions.
        dim: encoding size ``d`` (odd sizes drop the last cosine column).

    Returns:
        Float tensor ``(max_len, dim)``.
    """
    position = torch.arange(max_len, dtype=torch.float64)[:, None]
    two_j = torch.arange(0, dim, 2, dtype=torch.float64)
    # float64 so that large positions keep their phase exactly; cast once at the end.
    angles = position / torch.pow(10000.0, two_j / dim)
    table = torch.zeros(max_len, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : dim // 2])
    return table.float()


def _check_length(seq_len: int, max_len: int) -> None:
    if seq_len > max_len:
        raise UserError(
            f"sequence length {seq_len} exceeds the {max_len} positions this model has; "
            "truncate or window the input (the tokenizer's max_length, or ctxkit.embed's long_inputs)"
        )


class SinusoidalPositionalEncoding(nn.Module):
    """Fixed sinusoidal encodings, precomputed up to ``max_len`` (not trained, not saved).

    Args:
        dim: encoding size.
        max_len: longest sequence supported.
    """

    def __init__(self, dim: int, max_len: int = 4096):
        super().__init__()
        self.max_len = max_len
        self.register_buffer("table", sinusoidal_table(max_len, dim), persistent=False)

    def forward(self, seq_len: int, offset: int = 0) -> Tensor:
        """Encodings for positions ``offset .. offset+seq_len-1``.

        Returns:
            ``(seq_len, dim)``.
        """
        _check_length(offset + seq_len, self.max_len)
        return self.table[offset : offset + seq_len]


class LearnedPositionalEmbedding(nn.Embedding):
    """One trained vector per absolute position (BERT, GPT-2).

    Args:
        max_len: number of positions.
        dim: vector size.
    """

    def __init__(self, max_len: int, dim: int):
        super().__init__(max_len, dim)
        self.max_len = max_len

    def forward(self, seq_len: int, offset: int = 0, position_ids: Optional[Tensor] = None) -> Tensor:  # type: ignore[override]
        """Vectors for positions ``offset .. offset+seq_len-1`` or for explicit ``position_ids``.

        Returns:
            ``(seq_len, dim)``, or ``position_ids.shape + (dim,)``.
        """
        if position_ids is not None:
            # The range check reads the ids on the host (a sync, a graph break when compiled,
            # an error inside a CUDA graph capture): compiled and graphed callers (the GPU
            # packed path) pass in-range ids by construction.
            capturing = position_ids.is_cuda and torch.cuda.is_current_stream_capturing()
            checkable = not torch.compiler.is_compiling() and not capturing
            if checkable and position_ids.numel() and int(position_ids.max()) >= self.max_len:
                _check_length(int(position_ids.max()) + 1, self.max_len)
            return super().forward(position_ids)
        _check_length(offset + seq_len, self.max_len)
        return self.weight[offset : offset + seq_len]
