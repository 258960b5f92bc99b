"""Model families. One file per family, each with its config and presets. The registry of
families, the presets of all of them and the checkpoint names are the zoo's
(:mod:`ctxkit.zoo.families`, :mod:`ctxkit.zoo.presets`): name, build and load models there."""

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
from .bert import PRESETS, BertConfig, get_preset
from .common import Preset

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
