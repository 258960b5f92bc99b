"""BERT and DistilBERT with the masked-LM head alone: transformers' ``*ForMaskedLM``.

A ``BertForMaskedLM`` or ``DistilBertForMaskedLM`` checkpoint has no NSP head (and BERT's has
no pooler), so it cannot load as :class:`~ctxkit.models.bert.model.BertForPreTraining`.
:func:`load_bert_with_heads` loads a folder with the heads it has: MLM + NSP as
``BertForPreTraining``, MLM alone as :class:`BertForMaskedLM`. Both answer
``(mlm_logits, nsp_logits)``, the NSP logits None here, so a caller reads either alike.

The head is :class:`~ctxkit.models.bert.model.BertMLMHead` (dense, activation, LayerNorm, then the
tied word embedding with its own bias); only the checkpoint names differ per family.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional, Set, Tuple

from torch import Tensor, nn

from ...core.checkpoint import (
    CheckpointError,
    KeyMap,
    WEIGHT_FILES,
    load_state_dict_strict,
    read_config,
    read_weights,
    save_weights,
    write_json,
)
from ...core.meta_build import meta_device
from .model import HF_KEYS, BertConfig, BertMLMHead, BertModel, config_from_hf, config_to_hf, load_bert
from ..common import PretrainedHabits

__all__ = ["BertForMaskedLM", "load_bert_masked_lm", "load_bert_with_heads", "save_bert_masked_lm"]

# The MLM head's names in each family's *ForMaskedLM checkpoint (the decoder weight is the
# tied word embedding, so only its bias is stored).
_HEAD_KEYS = {
    "bert": KeyMap([("mlm.transform.{p}", "cls.predictions.transform.dense.{p}"),
                    ("mlm.norm.{p}", "cls.predictions.transform.LayerNorm.{p}"),
                    ("mlm.bias", "cls.predictions.bias")]),
    "distilbert": KeyMap([("mlm.transform.{p}", "vocab_transform.{p}"),
                          ("mlm.norm.{p}", "vocab_layer_norm.{p}"),
                          ("mlm.bias", "vocab_projector.bias")]),
}
_HEAD_NAMES = {"bert": "cls.predictions.*", "distilbert": "vocab_transform.*, vocab_layer_norm.*, vocab_projector.bias"}
_ARCHITECTURES = {"bert": "BertForMaskedLM", "distilbert": "DistilBertForMaskedLM"}
_NSP_WEIGHT = "cls.seq_relationship.weight"


class BertForMaskedLM(PretrainedHabits, nn.Module):
    """Encoder plus the masked-LM head (no NSP head, no pooler needed).

    Args:
        config: the architecture (BERT or DistilBERT).
    """

    @classmethod
    def _load_folder(cls, folder):
        return load_bert_masked_lm(folder)

    def _save_folder(self, folder, tokenizer):
        return save_bert_masked_lm(self, folder, tokenizer)

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.mlm = BertMLMHead(config)

    def forward(self, input_ids: Tensor, attention_mask=None, token_type_ids=None) -> Tuple[Tensor, None]:
        """``(mlm_logits (batch, seq, vocab), None)``: BertForPreTraining's pair, without NSP.

        Args:
            input_ids: ``(batch, seq)`` token ids.
            attention_mask: ``(batch, seq)``, 1 for real tokens.
            token_type_ids: ``(batch, seq)`` segment ids (ignored by DistilBERT).
        """
        hidden = self.bert(input_ids, attention_mask, token_type_ids=token_type_ids).last_hidden_state
        return self.mlm(hidden, self.bert.embeddings.word_embeddings.weight), None


def _weight_names(directory: Path) -> Set[str]:
    """The tensor names of a checkpoint folder, reading safetensors headers only where it can."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            return set(json.loads(index.read_text(encoding="utf-8"))["weight_map"])
        except (ValueError, KeyError, TypeError):
            pass  # read_weights below names what is wrong with the index
    elif (directory / WEIGHT_FILES[0]).is_file():
        from safetensors import safe_open

        try:
            with safe_open(str(directory / WEIGHT_FILES[0]), "pt") as f:
                return set(f.keys())
        except Exception:  # safetensors raises several types for bad bytes; read_weights names them
            pass
    return set(read_weights(directory))


def load_bert_with_heads(directory: os.PathLike, config: Optional[BertConfig] = None) -> nn.Module:
    """A checkpoint with its pretraining heads: :class:`~ctxkit.models.bert.model.BertForPreTraining`
    when it has the NSP head, else :class:`BertForMaskedLM` (a ``*ForMaskedLM`` checkpoint)."""
    if _NSP_WEIGHT in _weight_names(Path(directory)):
        return load_bert(directory, config=config, with_heads=True)
    return load_bert_masked_lm(directory, config=config)


def load_bert_masked_lm(directory: os.PathLike, config: Optional[BertConfig] = None) -> BertForMaskedLM:
    """Load an HF ``BertForMaskedLM`` / ``DistilBertForMaskedLM`` folder, in eval mode.

    Args:
        directory: folder with ``config.json`` and the weights.
        config: a preset's architecture the checkpoint must match (default: its own).

    Raises:
        CheckpointError: no MLM head in the weights, an untied decoder, or (as
            :class:`~ctxkit.core.checkpoint.CheckpointMismatchError`) head tensors missing or misshaped.
    """
    directory = Path(directory)
    hf_config = read_config(directory)
    if hf_config.get("tie_word_embeddings") is False:
        raise CheckpointError(f"{directory / 'config.json'}: tie_word_embeddings is false; ctxkit's MLM head decodes with "
                              "the word embedding itself")
    family = config_from_hf(hf_config).family
    head = {}
    for key, value in read_weights(directory).items():
        ours = _HEAD_KEYS[family].to_ours(key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias"))
        if ours is not None:
            head[ours[len("mlm."):]] = value
    if not head:
        raise CheckpointError(f"{directory}: no masked-LM head in the weights ({_HEAD_NAMES[family]}): an encoder "
                              "without pretraining heads")
    encoder = load_bert(directory, config=config, heads_used=True)  # the head tensors are read above
    with meta_device():  # no memory and no random initialisation for what is replaced at once
        model = BertForMaskedLM(encoder.config)
    model.bert = encoder
    load_state_dict_strict(model.mlm, head, source=str(directory), assign=True)
    return model.eval()


def save_bert_masked_lm(model: BertForMaskedLM, directory: os.PathLike, tokenizer=None) -> Path:
    """Write ``model`` as transformers' ``BertForMaskedLM`` / ``DistilBertForMaskedLM`` folder
    (``config.json``, ``model.safetensors``, the tokenizer's files when given)."""
    directory = Path(directory)
    family = model.config.family
    prefix = "bert." if family == "bert" else "distilbert."
    hf_state = {prefix + HF_KEYS[family].to_theirs(k): v for k, v in model.bert.state_dict().items()}
    hf_state.update({_HEAD_KEYS[family].to_theirs(k): v for k, v in model.state_dict().items() if k.startswith("mlm.")})
    write_json(config_to_hf(model.config, _ARCHITECTURES[family]), directory / "config.json")
    save_weights(hf_state, directory / "model.safetensors")
    if tokenizer is not None:
        tokenizer.save(directory)
    return directory
