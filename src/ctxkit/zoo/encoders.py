"""One entry point for the encoders behind ``ctxkit finetune``'s task heads.

A fine-tuned run stores its encoder in the Hugging Face layout of its family; the family
registry (:mod:`ctxkit.zoo.families`) says which: ``bert`` (BERT and DistilBERT,
:func:`~ctxkit.models.bert.model.load_bert`) or ``xlnet``
(:class:`~ctxkit.models.xlnet.encoder.XLNetEncoder`).
"""

from __future__ import annotations

import os
from pathlib import Path

from torch import nn

from ..core.errors import UserError
from ..models.bert.model import load_bert
from .families import family_of, find_family

__all__ = ["ENCODER_FAMILIES", "encoder_family", "load_encoder", "save_encoder"]

# Families whose models serve as task encoders (their forward returns a BertOutput).
ENCODER_FAMILIES = ("bert", "xlnet")


def encoder_family(directory: os.PathLike) -> str:
    """``"xlnet"`` or ``"bert"`` (BERT and DistilBERT) for an HF-format folder.

    Raises:
        UserError: the folder holds a model of another family.
    """
    family = find_family(Path(directory))
    if family is None:
        return "bert"  # load_bert then names what is missing (config.json, the weights)
    if family.name not in ENCODER_FAMILIES:
        raise UserError(f"{directory}: a {family.name} model is no task encoder (task encoders: {', '.join(ENCODER_FAMILIES)})")
    return family.name


def load_encoder(directory: os.PathLike, config=None, heads_used: bool = False) -> nn.Module:
    """The encoder of an HF-format folder (``config``: a BERT preset's config to check against;
    ``heads_used``: the caller loads the task-head tensors itself, so they are not reported)."""
    family = encoder_family(directory)
    if family == "bert":
        return load_bert(directory, config=config, heads_used=heads_used)
    return family_of(Path(directory)).load(Path(directory))[0]


def save_encoder(encoder: nn.Module, directory: os.PathLike, tokenizer=None) -> Path:
    """Save any task encoder in its family's HF layout (with the tokenizer's files)."""
    return family_of(encoder).save(encoder, directory, tokenizer)
