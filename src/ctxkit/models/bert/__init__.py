"""BERT and DistilBERT: the config and presets, the encoder and its pretraining heads (``model``) with the HF
checkpoint layout, and the masked-LM head alone (``mlm``, transformers' ``*ForMaskedLM``).
"""

from .model import (
    BertConfig, PRESETS, get_preset, BertOutput, BertPooler, BertModel, BertMLMHead, BertNSPHead,
    BertForPreTraining, config_from_hf, config_to_hf, load_bert, save_bert,
)
from .mlm import (
    BertForMaskedLM, load_bert_masked_lm, load_bert_with_heads, save_bert_masked_lm,
)

__all__ = [
    'BertConfig', 'PRESETS', 'get_preset', 'BertOutput', 'BertPooler', 'BertModel', 'BertMLMHead',
    'BertNSPHead', 'BertForPreTraining', 'config_from_hf', 'config_to_hf', 'load_bert', 'save_bert',
    'BertForMaskedLM', 'load_bert_masked_lm', 'load_bert_with_heads', 'save_bert_masked_lm',
]
