"""Tokenizers for ctxkit models."""

from .wordpiece import Encoding, WordPieceTokenizer, read_lines

__all__ = ["WordPieceTokenizer", "Encoding", "read_lines"]
