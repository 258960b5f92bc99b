"""Tokenizers for ctxkit models."""

from .bpe import END_OF_TEXT, ByteLevelBPETokenizer
from .wordpiece import Encoding, WordPieceTokenizer, read_lines

__all__ = ["WordPieceTokenizer", "ByteLevelBPETokenizer", "END_OF_TEXT", "Encoding", "read_lines"]
