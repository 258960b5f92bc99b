"""Every family's named architectures, in one place: what commands offer as ``--preset``.

Each family file owns its config class and its presets (``bert.py``: :class:`BertConfig`,
:data:`PRESETS`; ``gpt2.py``: :class:`GPT2Config`, :data:`GPT2_PRESETS`; ...);
:mod:`ctxkit.zoo.families` lists them with one-line descriptions. BERT-family names
follow the GluonNLP convention ``<family>_<layers>_<hidden>_<heads>``. A preset fixes the
architecture; a checkpoint may still bring its own vocabulary size, number of positions or
segment vocabulary (see :meth:`BertConfig.with_checkpoint`).
"""

from __future__ import annotations

from ..models.bert.model import PRESETS, BertConfig, get_preset
from ..models.char_lm.model import CHAR_PRESETS
from ..models.elmo.model import ELMO_PRESETS, ElmoConfig
from ..models.common import Preset
from ..models.gpt2.model import GPT2_PRESETS, GPT2Config
from ..models.seq2seq.model import RNN_SEQ2SEQ_PRESETS, SEQ2SEQ_PRESETS, RNNSeq2SeqConfig, Seq2SeqConfig
from ..models.transformer_xl.model import TRANSFO_XL_PRESETS, TransformerXLConfig
from ..models.xlnet.model import XLNET_PRESETS, XLNetConfig

__all__ = ["BertConfig", "Preset", "PRESETS", "get_preset", "CHAR_PRESETS", "ELMO_PRESETS", "ElmoConfig", "GPT2Config", "GPT2_PRESETS", "Seq2SeqConfig", "SEQ2SEQ_PRESETS", "RNNSeq2SeqConfig",
           "RNN_SEQ2SEQ_PRESETS", "TransformerXLConfig", "TRANSFO_XL_PRESETS", "XLNetConfig", "XLNET_PRESETS"]
