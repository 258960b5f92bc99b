"""Model families. One file per family, each with its config and presets; :mod:`.families` is the
registry of families (:mod:`.presets` re-exports every family's presets)."""

from .bert import (
    BertForPreTraining,
    BertMLMHead,
    BertModel,
    BertNSPHead,
    BertOutput,
    BertPooler,
    load_bert,
    save_bert,
)
from .gpt2 import GPT2_PRESETS, GPT2Config, GPT2LMHeadModel, GPT2Model, load_gpt2, save_gpt2
from .presets import PRESETS, BertConfig, Preset, get_preset

__all__ = [
    "BertConfig",
    "BertForPreTraining",
    "BertMLMHead",
    "BertModel",
    "BertNSPHead",
    "BertOutput",
    "BertPooler",
    "GPT2_PRESETS",
    "GPT2Config",
    "GPT2LMHeadModel",
    "GPT2Model",
    "PRESETS",
    "Preset",
    "get_preset",
    "load_bert",
    "load_gpt2",
    "save_bert",
    "save_gpt2",
]
