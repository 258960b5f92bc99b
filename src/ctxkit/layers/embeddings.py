"""Input embeddings: token + (segment) + position, then optional LayerNorm and dropout."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from .position import LearnedPositionalEmbedding

__all__ = ["TransformerEmbeddings"]


class TransformerEmbeddings(nn.Module):
    """Sum of token, segment and learned position embeddings (BERT's input layer).

    Args:
        vocab_size: token vocabulary size.
        dim: embedding size.
        max_len: number of learned positions.
        num_segments: segment (token type) vocabulary; 0 disables segments (DistilBERT, GPT-2).
        layer_norm: apply LayerNorm to the sum (BERT) or not (GPT-2).
        eps: LayerNorm epsilon.
        dropout: dropout on the result.
        pad_id: padding token id (its row gets no gradient).
    """

    def __init__(
        self,
        vocab_size: int,
        dim: int,
        max_len: int,
        num_segments: int = 2,
        layer_norm: bool = True,
        eps: float = 1e-12,
        dropout: float = 0.1,
        pad_id: Optional[int] = 0,
    ):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, dim, padding_idx=pad_id)
        self.position_embeddings = LearnedPositionalEmbedding(max_len, dim)
        self.token_type_embeddings = nn.Embedding(num_segments, dim) if num_segments > 0 else None
        self.norm = nn.LayerNorm(dim, eps=eps) if layer_norm else None
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        input_ids: Tensor,
        token_type_ids: Optional[Tensor] = None,
        position_ids: Optional[Tensor] = None,
    ) -> Tensor:
        """Embed.

        Args:
            input_ids: ``(batch, seq)``.
            token_type_ids: ``(batch, seq)`` segment ids; zeros when None.
            position_ids: ``(batch, seq)`` or ``(seq,)``; ``0..seq-1`` when None.

        Returns:
            ``(batch, seq, dim)``.
        """
        return self.dropout(self._embed(input_ids, token_type_ids, position_ids))

    def _embed(self, input_ids: Tensor, token_type_ids: Optional[Tensor], position_ids: Optional[Tensor]) -> Tensor:
        """The normalised sum of the three embeddings, before dropout."""
        seq_len = input_ids.size(1)
        x = self.word_embeddings(input_ids) + self.position_embeddings(seq_len, position_ids=position_ids)
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            x = x + self.token_type_embeddings(token_type_ids)
        if self.norm is not None:
            x = self.norm(x)
        return x
