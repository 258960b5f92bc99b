"""XLNet as an encoder for ctxkit's task heads (``ctxkit finetune`` tasks).

The task heads read a :class:`~ctxkit.models.bert.model.BertOutput` (``last_hidden_state`` for
tagging and span QA, ``pooler_output`` for sentence classification) and the encoder's
``config.hidden_size`` / ``config.dropout``. :class:`XLNetEncoder` gives XLNet that shape.

Layout. ctxkit's featurizers write BERT's layout ``[CLS] A [SEP] B [SEP]`` (types 0 0 0
1 1); XLNet was pretrained (``ctxkit pretrain-xlnet``) on ``A <sep> B <sep> <cls>`` (types
0 0 1 1 2). With ``cls_last`` (the default) the encoder moves each row's first token to
the end of its real tokens and gives it type 2, runs XLNet, and moves the hidden states
back, so outputs stay aligned with the input positions the heads index. Relative
positions make the move meaningful: only distances are encoded.

The content stream (no permutation: at fine-tuning time every token sees every real
token) is ``last_hidden_state``; the sentence vector is XLNet's "sequence summary", the
``<cls>`` state through a dense layer and tanh.

Saving (:meth:`XLNetEncoder.save`) writes the HF ``XLNetLMHeadModel`` layout (the LM bias
of the pretrained model is kept, so the folder still loads as a language model) plus
``summary.safetensors`` for the pooler.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor, nn

from ...core.checkpoint import CheckpointError, load_state_dict_strict, save_weights
from ..bert.model import BertOutput
from .model import XLNetConfig
from .model import XLNetLMHeadModel, XLNetModel, load_xlnet, save_xlnet

SUMMARY_FILE = "summary.safetensors"

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
        body: an :class:`~ctxkit.models.xlnet.model.XLNetModel` (e.g. ``load_xlnet(folder).transformer``).
        cls_last: inputs come in BERT's layout (``[CLS]`` first); move it last, as XLNet was
            pretrained (see the module doc). False: inputs are already in XLNet's layout.
        lm_bias: ``(vocab,)`` the pretrained LM head's bias, kept only to be saved again.
    """

    def __init__(self, body: XLNetModel, cls_last: bool = True, lm_bias: Optional[Tensor] = None):
        super().__init__()
        self.body = body
        self.cls_last = cls_last
        c: XLNetConfig = body.config
        self.config = XLNetEncoderConfig(hidden_size=c.d_model, dropout=c.dropout, vocab_size=c.vocab_size, num_layers=c.n_layers)
        self.pooler = nn.Linear(c.d_model, c.d_model)
        nn.init.normal_(self.pooler.weight, std=0.02)
        nn.init.zeros_(self.pooler.bias)
        bias = lm_bias.detach().clone() if lm_bias is not None else torch.zeros(c.vocab_size)
        self.register_buffer("lm_bias", bias, persistent=False)

    def forward(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None, token_type_ids: Optional[Tensor] = None,
                **_) -> BertOutput:
        """Encode ``(batch, seq)`` ids (right padding, ``attention_mask`` 1 on real tokens).

        Returns:
            ``BertOutput(last_hidden_state (batch, seq, d), pooler_output (batch, d))``, both
            in the input's positions.
        """
        batch, seq = input_ids.shape
        lengths = (attention_mask.long().sum(1) if attention_mask is not None
                   else torch.full((batch,), seq, device=input_ids.device)).clamp(min=1)
        last = (lengths - 1)[:, None]
        rows = torch.arange(batch, device=input_ids.device)
        if not self.cls_last:
            hidden = self.body(input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask).content
            return BertOutput(hidden, torch.tanh(self.pooler(hidden[rows, last[:, 0]])), None, None)
        pos = torch.arange(seq, device=input_ids.device)[None]
        # XLNet position j holds input position src[j]: 1..L-1, then the [CLS] (input 0), then padding.
        src = torch.where(pos < last, pos + 1, torch.where(pos == last, torch.zeros_like(pos), pos))
        ids = input_ids.gather(1, src)
        types = (token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids)).gather(1, src)
        types = torch.where(pos == last, torch.full_like(types, 2), types)
        content = self.body(ids, token_type_ids=types, attention_mask=attention_mask).content
        # Back to the input's positions: input 0 sits at L-1, input i (0 < i < L) at i-1.
        dst = torch.where(pos == 0, last, torch.where(pos < lengths[:, None], pos - 1, pos))
        hidden = content.gather(1, dst[..., None].expand(-1, -1, content.size(-1)))
        return BertOutput(hidden, torch.tanh(self.pooler(content[rows, last[:, 0]])), None, None)

    def save(self, directory: os.PathLike, tokenizer=None) -> Path:
        """HF ``XLNetLMHeadModel`` folder (+ ``summary.safetensors``, + the tokenizer's files)."""
        directory = Path(directory)
        lm = XLNetLMHeadModel(self.body.config, transformer=self.body)
        with torch.no_grad():
            lm.lm_bias.copy_(self.lm_bias)
        save_xlnet(lm, directory)
        save_weights({k: v.detach().contiguous() for k, v in self.pooler.state_dict().items()}, directory / SUMMARY_FILE)
        if tokenizer is not None:
            tokenizer.save(directory)
        return directory

    @classmethod
    def from_dir(cls, directory: os.PathLike, cls_last: bool = True) -> "XLNetEncoder":
        """Load an HF-format XLNet folder; the pooler comes from ``summary.safetensors`` when
        present (a fine-tuned run), else it starts fresh (a pretrained model)."""
        from safetensors.torch import load_file

        directory = Path(directory)
        lm = load_xlnet(directory)
        encoder = cls(lm.transformer, cls_last=cls_last, lm_bias=lm.lm_bias)
        summary = directory / SUMMARY_FILE
        if summary.is_file():
            try:
                state = load_file(str(summary))
            except Exception as err:
                raise CheckpointError(f"{summary}: could not read weights ({type(err).__name__}: {err})") from None
            load_state_dict_strict(encoder.pooler, state, source=str(summary))
        return encoder.eval()
