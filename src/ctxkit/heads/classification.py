"""Classification heads from the lectures' "BERT for fine-tuning" slides.

* Single sentences and pairs: the [CLS] vector (through BERT's pooler when the model has
  one, as in the original recipe) feeds a dense layer; one output means regression.
* NER: every token vector feeds a dense layer; only first sub-words carry labels.
"""

from __future__ import annotations

from typing import Dict, Optional

import torch.nn.functional as F
from torch import Tensor, nn

from ..core.capabilities import ComputesAtPositions, declares
from ..layers.attention import PackedSequences

__all__ = ["SequenceClassificationHead", "TokenClassificationHead", "EncoderWithHead", "IGNORE_INDEX"]

IGNORE_INDEX = -100


class _DenseHead(nn.Module):
    """Dropout and a dense layer initialised as BERT's task heads (normal(0.02), zero bias)."""

    def __init__(self, hidden_size: int, num_labels: int, dropout: float = 0.1):
        super().__init__()
        self.num_labels = num_labels
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden_size, num_labels)
        nn.init.normal_(self.classifier.weight, std=0.02)
        nn.init.zeros_(self.classifier.bias)


class SequenceClassificationHead(_DenseHead):
    """Dropout + dense over the sentence vector.

    Args:
        hidden_size: encoder width.
        num_labels: classes; 1 means regression (MSE loss).
        dropout: dropout before the dense layer.
        pre_classifier: first a dense ``hidden -> hidden`` layer and a ReLU over the [CLS]
            vector (DistilBERT's ``*ForSequenceClassification`` head, which has no pooler).
    """

    def __init__(self, hidden_size: int, num_labels: int, dropout: float = 0.1, pre_classifier: bool = False):
        super().__init__(hidden_size, num_labels, dropout)
        self.pre_classifier = nn.Linear(hidden_size, hidden_size) if pre_classifier else None

    def forward(self, encoder_output, attention_mask: Optional[Tensor] = None) -> Tensor:
        """Logits ``(batch, num_labels)`` (``(batch,)`` for regression).

        Args:
            encoder_output: a :class:`~ctxkit.models.bert.model.BertOutput`; its pooler output is
                used when present, else the [CLS] hidden state.
        """
        pooled = encoder_output.pooler_output
        if pooled is None:
            pooled = encoder_output.last_hidden_state[:, 0]
        if self.pre_classifier is not None:
            pooled = F.relu(self.pre_classifier(pooled))
        logits = self.classifier(self.dropout(pooled))
        return logits.squeeze(-1) if self.num_labels == 1 else logits

    def loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        """Cross-entropy, or MSE for regression."""
        if self.num_labels == 1:
            return F.mse_loss(logits.float(), labels.float())
        return F.cross_entropy(logits.float(), labels)


class TokenClassificationHead(_DenseHead):
    """Dropout + dense over every token vector (NER tagging).

    Args:
        hidden_size: encoder width.
        num_labels: tag set size.
        dropout: dropout before the dense layer.
    """

    def forward(self, encoder_output, attention_mask: Optional[Tensor] = None) -> Tensor:
        """Logits ``(batch, seq, num_labels)``."""
        return self.classifier(self.dropout(encoder_output.last_hidden_state))

    def loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        """Cross-entropy over labelled tokens (``labels == -100`` are ignored)."""
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)


class EncoderWithHead(nn.Module):
    """An encoder and a task head, with one ``forward`` used by the trainer.

    Args:
        encoder: a :class:`~ctxkit.models.bert.model.BertModel` (or another encoder returning a
            :class:`~ctxkit.models.bert.model.BertOutput`).
        head: a head with ``forward(encoder_output, attention_mask)`` and ``loss(logits, labels)``.
        cls_only: the head reads the [CLS] position only (sentence tasks): a BertModel then
            runs its last layer at [CLS] alone (keys and values still from every token), an
            exact rewrite that skips ~7 % of a 12-layer encoder's work in training and
            inference alike.
    """

    def __init__(self, encoder: nn.Module, head: nn.Module, cls_only: bool = False):
        super().__init__()
        self.encoder = encoder
        self.head = head
        self.cls_only = cls_only
        # Asked once here: a protocol check is not for a compiled forward.
        self._at_positions = declares(encoder, ComputesAtPositions)

    def forward(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None, token_type_ids: Optional[Tensor] = None, *,
                labels: Optional[Tensor] = None, **_) -> Dict[str, Tensor]:
        """Returns ``{"logits": ..., "loss": ...}`` (loss only when labels are given)."""
        extra = {}
        if self.cls_only and self._at_positions and not isinstance(attention_mask, PackedSequences):
            extra["output_positions"] = input_ids.new_zeros(input_ids.size(0), 1)
        out = self.encoder(input_ids, attention_mask, token_type_ids=token_type_ids, **extra)
        logits = self.head(out, attention_mask)
        result = {"logits": logits}
        if labels is not None:
            result["loss"] = self.head.loss(logits, labels)
        return result
