"""The bag-of-embeddings ("CBOW") sentence classifier: the context-free baseline row.

A sentence is the mean of its words' static vectors (:class:`~ctxkit.models.static.vectors.WordVectors`),
fed to a linear layer or a one-hidden-layer MLP; the lectures' GLUE table lists this
baseline (CBOW 58.6) under ELMo and BERT. Training it:
:func:`ctxkit.tasks.bag_classifier.train_bag_classifier`.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
import torch.nn as nn

__all__ = ["BagOfEmbeddingsClassifier"]


class BagOfEmbeddingsClassifier(nn.Module):
    """Mean of a sentence's word vectors, then dropout and a linear layer (or a one-hidden-layer MLP).

    Args:
        embeddings: ``(N, dim)`` table whose row 0 is padding (unknown words map there too,
            so they are left out of the mean rather than averaged in as zeros).
        num_classes: Output classes.
        freeze: Keep the word vectors fixed (the classic baseline) or fine-tune them.
        dropout: Dropout on the pooled vector.
        hidden: Width of a ReLU hidden layer; None for a linear classifier.
    """

    def __init__(self, embeddings, num_classes: int = 2, freeze: bool = True, dropout: float = 0.1,
                 hidden: Optional[int] = None):
        super().__init__()
        table = torch.as_tensor(np.asarray(embeddings), dtype=torch.float32)
        self.embedding = nn.Embedding.from_pretrained(table, freeze=freeze, padding_idx=0)
        self.dropout = nn.Dropout(dropout)
        dim = table.shape[1]
        self.head = nn.Linear(dim, num_classes) if not hidden else nn.Sequential(
            nn.Linear(dim, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, num_classes))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Class logits ``(B, num_classes)`` of token ids ``(B, T)`` (0 = padding or unknown)."""
        mask = (ids != 0).unsqueeze(-1).to(self.embedding.weight.dtype)  # (B, T, 1)
        summed = (self.embedding(ids) * mask).sum(dim=1)  # (B, dim)
        pooled = summed / mask.sum(dim=1).clamp(min=1.0)  # a sentence of unknown words pools to zeros
        return self.head(self.dropout(pooled))
