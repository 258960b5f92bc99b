"""Span prediction for extractive QA, as in the lectures' "BERT for SQuAD" slide.

Learn a start vector ``s`` and an end vector ``e`` (both ``(hidden,)``). For the final
hidden vector ``v_i`` of token ``i``::

    start_logit_i = <s, v_i> + b_s        end_logit_i = <e, v_i> + b_e

and ``P(start = i) = softmax_i(start_logit_i)`` over the sequence (likewise for the end).
Stacking ``s`` and ``e`` as the rows of a ``(2, hidden)`` matrix makes both dot products
one ``nn.Linear(hidden, 2)``: output column 0 is the start logit, column 1 the end logit.
That is exactly Hugging Face's ``BertForQuestionAnswering.qa_outputs`` (weight ``(2,
hidden)``, bias ``(2,)``, start = row/column 0), so our Linear carries the same name and
:func:`span_head_from_hf` only has to select its two tensors.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.checkpoint import CheckpointError
from ..core.errors import UserError

__all__ = ["SpanHead", "SpanQAModel", "span_loss", "span_head_from_hf"]


def span_loss(start_logits: Tensor, end_logits: Tensor, start_positions: Tensor, end_positions: Tensor) -> Tensor:
    """Mean of the start and end cross-entropies (BERT's SQuAD loss).

    Positions outside ``[0, seq)`` are clamped to ``seq`` and ignored, as in BERT / HF, so a
    label pointing past a truncated sequence contributes nothing instead of crashing. If
    every label of a side is ignored, that side's loss is NaN (mean over nothing).

    Args:
        start_logits, end_logits: ``(batch, seq)``.
        start_positions, end_positions: ``(batch,)`` token indices.

    Returns:
        Scalar loss (float32).
    """
    ignored = start_logits.size(1)
    start_positions = start_positions.clamp(0, ignored)
    end_positions = end_positions.clamp(0, ignored)
    start = F.cross_entropy(start_logits.float(), start_positions, ignore_index=ignored)
    end = F.cross_entropy(end_logits.float(), end_positions, ignore_index=ignored)
    return (start + end) / 2


class SpanHead(nn.Module):
    """Start/end logits from a learned start vector and end vector (see the module docstring).

    Args:
        hidden_size: encoder width.
    """

    def __init__(self, hidden_size: int):
        super().__init__()
        # Row 0 is the start vector s, row 1 the end vector e (HF's qa_outputs layout).
        self.qa_outputs = nn.Linear(hidden_size, 2)
        nn.init.normal_(self.qa_outputs.weight, std=0.02)
        nn.init.zeros_(self.qa_outputs.bias)

    @property
    def start_vector(self) -> Tensor:
        """``s``, ``(hidden,)``."""
        return self.qa_outputs.weight[0]

    @property
    def end_vector(self) -> Tensor:
        """``e``, ``(hidden,)``."""
        return self.qa_outputs.weight[1]

    def forward(self, hidden: Tensor, attention_mask: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        """Score every position as answer start and end.

        Args:
            hidden: ``(batch, seq, hidden)`` final hidden states.
            attention_mask: ``(batch, seq)``, 1/True for real tokens. Padding positions get
                ``finfo.min / 2``: never the argmax, zero probability, and still finite
                when a start and an end logit are added.

        Returns:
            ``(start_logits, end_logits)``, each ``(batch, seq)``.
        """
        start, end = self.qa_outputs(hidden).unbind(-1)
        if attention_mask is not None:
            pad = ~attention_mask.bool()
            very_negative = torch.finfo(start.dtype).min / 2
            start, end = start.masked_fill(pad, very_negative), end.masked_fill(pad, very_negative)
        return start.contiguous(), end.contiguous()

    @staticmethod
    def loss(start_logits: Tensor, end_logits: Tensor, start_positions: Tensor, end_positions: Tensor) -> Tensor:
        """See :func:`span_loss`."""
        return span_loss(start_logits, end_logits, start_positions, end_positions)


class SpanQAModel(nn.Module):
    """An encoder plus a :class:`SpanHead`: our ``BertForQuestionAnswering``.

    Like HF's, there is no dropout between the encoder and the span head.

    Args:
        encoder: a :class:`~ctxkit.models.bert.model.BertModel` (returns ``last_hidden_state``).
        hidden_size: encoder width; defaults to ``encoder.config.hidden_size``.
    """

    def __init__(self, encoder: nn.Module, hidden_size: Optional[int] = None):
        super().__init__()
        self.encoder = encoder
        self.head = SpanHead(encoder.config.hidden_size if hidden_size is None else hidden_size)

    def forward(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None, token_type_ids: Optional[Tensor] = None, *,
                start_positions: Optional[Tensor] = None, end_positions: Optional[Tensor] = None, **_) -> Dict[str, object]:
        """Encode and score spans.

        Args:
            input_ids, attention_mask, token_type_ids: ``(batch, seq)`` (transformers' order).
            start_positions, end_positions: optional ``(batch,)`` labels (give both or neither).

        Returns:
            ``start_logits`` and ``end_logits`` ``(batch, seq)``; ``logits``, the pair as a
            tuple (what the trainer's ``predict`` collects); ``loss`` when labels are given.
        """
        if (start_positions is None) != (end_positions is None):
            raise UserError("give both start_positions and end_positions, or neither")
        hidden = self.encoder(input_ids, attention_mask, token_type_ids=token_type_ids).last_hidden_state
        start, end = self.head(hidden, attention_mask)
        out: Dict[str, object] = {"start_logits": start, "end_logits": end, "logits": (start, end)}
        if start_positions is not None:
            out["loss"] = span_loss(start, end, start_positions, end_positions)
        return out


def span_head_from_hf(state: Mapping[str, Tensor], prefix: str = "qa_outputs.") -> Dict[str, Tensor]:
    """Select a :class:`SpanHead` state dict from an HF ``*ForQuestionAnswering`` state dict.

    HF's BERT and DistilBERT QA models both store the head as ``qa_outputs.weight``
    ``(2, hidden)`` and ``qa_outputs.bias`` ``(2,)``, start first, which is our layout.

    Returns:
        ``{"qa_outputs.weight": ..., "qa_outputs.bias": ...}`` for ``SpanHead.load_state_dict``.

    Raises:
        CheckpointError: the tensors are missing or are not a 2-output head.
    """
    missing = [prefix + p for p in ("weight", "bias") if prefix + p not in state]
    if missing:
        raise CheckpointError(f"no span head in the state dict: missing {', '.join(missing)}")
    weight, bias = state[prefix + "weight"], state[prefix + "bias"]
    if weight.dim() != 2 or weight.size(0) != 2 or tuple(bias.shape) != (2,):
        raise CheckpointError(f"{prefix}weight/bias have shapes {tuple(weight.shape)}/{tuple(bias.shape)}; "
                              "a span head needs (2, hidden)/(2,)")
    return {"qa_outputs.weight": weight, "qa_outputs.bias": bias}
