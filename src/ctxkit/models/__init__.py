"""Model families. One file per family; named architectures live in :mod:`.presets`."""

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
from .presets import PRESETS, BertConfig, Preset, get_preset

__all__ = [
    "BertConfig",
    "BertForPreTraining",
    "BertMLMHead",
    "BertModel",
    "BertNSPHead",
    "BertOutput",
    "BertPooler",
    "PRESETS",
    "Preset",
    "get_preset",
    "load_bert",
    "save_bert",
]
