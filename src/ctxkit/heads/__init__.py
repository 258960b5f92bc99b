"""Task heads that sit on top of an encoder: sentence and token classification, spans."""

from .classification import (
    IGNORE_INDEX,
    EncoderWithHead,
    SequenceClassificationHead,
    TokenClassificationHead,
)
from .span import SpanHead, SpanQAModel, span_head_from_hf, span_loss

__all__ = [
    "IGNORE_INDEX",
    "EncoderWithHead",
    "SequenceClassificationHead",
    "TokenClassificationHead",
    "SpanHead",
    "SpanQAModel",
    "span_head_from_hf",
    "span_loss",
]
