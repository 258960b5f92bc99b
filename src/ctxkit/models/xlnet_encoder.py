"""XLNet as an encoder for ctxkit's task heads (``ctxkit finetune`` tasks).

The task heads read a :class:`~ctxkit.models.bert.BertOutput` (``last_hidden_state`` for
tagging and span QA, ``pooler_output`` for sentence classification) and the encoder's
``config.hidden_size`` / ``config.dropout``. :class:`XLNetEncoder` gives XLNet that shape:
the content stream (no permutation: at fine-tuning time every token sees every real
token) is ``last_hidden_state``, and the sentence vector is XLNet's "sequence summary" --
the state of the *last* real token (XLNet puts its ``<cls>`` at the end) through a dense
layer and tanh.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from .bert import BertOutput
from .presets import XLNetConfig
from .xlnet import XLNetModel

__all__ = ["XLNetEncoder", "XLNetEncoderConfig"]


@dataclass(frozen=True)
class XLNetEncoderConfig:
    """The fields task heads read, mapped from an :class:`XLNetConfig`."""

    hidden_size: int
    dropout: float
    vocab_size: int
    num_layers: int
    max_position: int = 1_000_000  # relative positions: no table to run out of


class XLNetEncoder(nn.Module):
    """An XLNet body with a sequence-summary pooler.

    Args:
        body: an :class:`~ctxkit.models.xlnet.XLNetModel` (e.g. ``XLNetLMHeadModel(...).transformer``
            of a pretrained model).
    """

    def __init__(self, body: XLNetModel):
        super().__init__()
        self.body = body
        c: XLNetConfig = body.config
        self.config = XLNetEncoderConfig(hidden_size=c.d_model, dropout=c.dropout, vocab_size=c.vocab_size, num_layers=c.n_layers)
        self.pooler = nn.Linear(c.d_model, c.d_model)
        nn.init.normal_(self.pooler.weight, std=0.02)
        nn.init.zeros_(self.pooler.bias)

    def forward(self, input_ids: Tensor, token_type_ids: Optional[Tensor] = None, attention_mask: Optional[Tensor] = None,
                **_) -> BertOutput:
        """Encode ``(batch, seq)`` ids (right padding, ``attention_mask`` 1 on real tokens).

        Returns:
            ``BertOutput(last_hidden_state (batch, seq, d), pooler_output (batch, d))``.
        """
        out = self.body(input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
        hidden = out.content
        if attention_mask is None:
            last = torch.full((hidden.size(0),), hidden.size(1) - 1, device=hidden.device)
        else:
            last = attention_mask.long().sum(1).clamp(min=1) - 1
        summary = hidden[torch.arange(hidden.size(0), device=hidden.device), last]
        return BertOutput(hidden, torch.tanh(self.pooler(summary)), None, None)
