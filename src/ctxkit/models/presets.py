"""Every family's named architectures, gathered for backward compatibility.

Each family file owns its config class and its presets (``bert.py``: :class:`BertConfig`,
:data:`PRESETS`; ``gpt2.py``: :class:`GPT2Config`, :data:`GPT2_PRESETS`; ...);
:mod:`ctxkit.models.families` lists them with one-line descriptions. BERT-family names
follow the GluonNLP convention ``<family>_<layers>_<hidden>_<heads>``. A preset fixes the
architecture; a checkpoint may still bring its own vocabulary size, number of positions or
segment vocabulary (see :meth:`BertConfig.with_checkpoint`).
"""

from __future__ import annotations

from .bert import PRESETS, BertConfig, get_preset
from .common import Preset
from .gpt2 import GPT2_PRESETS, GPT2Config
from .seq2seq import RNN_SEQ2SEQ_PRESETS, SEQ2SEQ_PRESETS, RNNSeq2SeqConfig, Seq2SeqConfig
from .transformer_xl import TRANSFO_XL_PRESETS, TransformerXLConfig
from .xlnet import XLNET_PRESETS, XLNetConfig

__all__ = ["BertConfig", "Preset", "PRESETS", "get_preset", "GPT2Config", "GPT2_PRESETS", "Seq2SeqConfig", "SEQ2SEQ_PRESETS", "RNNSeq2SeqConfig",
           "RNN_SEQ2SEQ_PRESETS", "TransformerXLConfig", "TRANSFO_XL_PRESETS", "XLNetConfig", "XLNET_PRESETS"]
