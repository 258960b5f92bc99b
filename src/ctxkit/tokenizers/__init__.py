"""Tokenizers for ctxkit models."""

from .batch import BatchEncoding, Encoding
from .bpe import END_OF_TEXT, ByteLevelBPETokenizer
from .wordpiece import WordPieceTokenizer, read_lines

__all__ = ["WordPieceTokenizer", "ByteLevelBPETokenizer", "END_OF_TEXT", "Encoding", "BatchEncoding", "read_lines"]
