"""One entry point for the encoders behind ``ctxkit finetune``'s task heads.

A fine-tuned run stores its encoder in the Hugging Face layout of its family; the
``model_type`` of ``config.json`` says which: ``bert`` / ``distilbert``
(:func:`~ctxkit.models.bert.load_bert`) or ``xlnet``
(:class:`~ctxkit.models.xlnet_encoder.XLNetEncoder`).
"""

from __future__ import annotations

import os
from pathlib import Path

from torch import nn

from ..core.checkpoint import read_config
from .bert import load_bert, save_bert

__all__ = ["encoder_family", "load_encoder", "save_encoder"]


def encoder_family(directory: os.PathLike) -> str:
    """``"xlnet"`` or ``"bert"`` (BERT and DistilBERT) for an HF-format folder."""
    return "xlnet" if read_config(Path(directory)).get("model_type") == "xlnet" else "bert"


def load_encoder(directory: os.PathLike, config=None) -> nn.Module:
    """The encoder of an HF-format folder (``config``: a BERT preset's config to check against)."""
    if encoder_family(directory) == "xlnet":
        from .xlnet_encoder import XLNetEncoder

        return XLNetEncoder.from_dir(directory)
    return load_bert(directory, config=config)


def save_encoder(encoder: nn.Module, directory: os.PathLike, tokenizer=None) -> Path:
    """Save any task encoder in its family's HF layout (with the tokenizer's files)."""
    from .xlnet_encoder import XLNetEncoder

    if isinstance(encoder, XLNetEncoder):
        return encoder.save(directory, tokenizer)
    return save_bert(encoder, directory, tokenizer)
