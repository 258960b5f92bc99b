"""Character and byte tokenizers for character-level language models.

A character LM needs no learned vocabulary: its symbols are the characters of the corpus
(27 for a text8-style corpus: ``a``-``z`` and the space) or the 256 byte values of UTF-8
text. :class:`CharTokenizer` covers both; it is saved as ``vocab.json`` beside the model
so a run folder carries everything needed to score new text.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, List, Sequence, Union

import torch
from torch import Tensor

from ..core.errors import UserError

__all__ = ["CharTokenizer", "TEXT8_ALPHABET"]

#: The symbols of a text8-style corpus (Mahoney's ``wikifil.pl`` output), space first.
TEXT8_ALPHABET = " abcdefghijklmnopqrstuvwxyz"


class CharTokenizer:
    """Maps characters (or bytes) to ids and back.

    Args:
        alphabet: the symbols in id order (a string of distinct characters), or ``None`` for
            byte mode: ids are the 256 byte values of the UTF-8 encoding.

    Text with a character outside the alphabet is refused with the character and its
    position: a character LM has no ``<unk>`` to hide it behind, and silently dropping it
    would change the bits-per-character being measured.
    """

    def __init__(self, alphabet: Union[str, None] = TEXT8_ALPHABET):
        if alphabet is not None:
            if len(set(alphabet)) != len(alphabet) or not alphabet:
                raise UserError("a character alphabet must be a non-empty string of distinct characters")
            if len(alphabet) > 256:  # ids are stored as uint8
                raise UserError(f"a character alphabet holds at most 256 symbols, got {len(alphabet)}")
            self._ids: Dict[str, int] = {c: i for i, c in enumerate(alphabet)}
        self.alphabet = alphabet

    @property
    def byte_level(self) -> bool:
        """True in byte mode (256 symbols)."""
        return self.alphabet is None

    @property
    def vocab_size(self) -> int:
        """Number of symbols (27 for text8, 256 for bytes)."""
        return 256 if self.alphabet is None else len(self.alphabet)

    def encode(self, text: str) -> List[int]:
        """Ids of ``text`` (one per character, or per UTF-8 byte in byte mode)."""
        return self.encode_tensor(text).tolist()

    def encode_tensor(self, text: str) -> Tensor:
        """``(len,)`` uint8 ids of ``text``: a compact stream for corpora of 10^8 symbols.

        Raises:
            UserError: a character outside the alphabet (names it and its offset).
        """
        if not text:
            return torch.empty(0, dtype=torch.uint8)
        if self.alphabet is None:
            return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).clone()
        unknown = set(text).difference(self._ids)
        if unknown:
            pos = min(text.index(c) for c in unknown)
            raise UserError(f"character {text[pos]!r} at offset {pos} is not in the alphabet {self.alphabet!r}")
        # Translate through a table, then read the code points as bytes: str.translate and
        # str.encode run in C, ~50x a Python loop over 10^8 characters.
        raw = text.translate({ord(c): i for c, i in self._ids.items()}).encode("latin-1")
        out = torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone()
        return out

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` (bytes that are not valid UTF-8 become U+FFFD in byte mode)."""
        ids = [int(i) for i in ids]
        if self.alphabet is None:
            return bytes(ids).decode("utf-8", errors="replace")
        return "".join(self.alphabet[i] for i in ids)

    def save(self, directory: os.PathLike) -> Path:
        """Write ``vocab.json`` (``{"type": "char", "alphabet": ...}``) into ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        spec = {"type": "bytes"} if self.alphabet is None else {"type": "char", "alphabet": self.alphabet}
        tmp = directory / ".vocab.json.tmp"
        tmp.write_text(json.dumps(spec) + "\n", encoding="utf-8")
        os.replace(tmp, directory / "vocab.json")
        return directory

    @classmethod
    def from_dir(cls, directory: os.PathLike) -> "CharTokenizer":
        """Read what :meth:`save` wrote."""
        path = Path(directory) / "vocab.json"
        try:
            spec = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise UserError(f"{path}: not a character vocabulary ({e})") from None
        if not isinstance(spec, dict) or spec.get("type") not in ("char", "bytes"):
            raise UserError(f"{path}: not a character vocabulary (expected {{\"type\": \"char\" | \"bytes\"}})")
        return cls(None if spec["type"] == "bytes" else spec["alphabet"])

    def __repr__(self) -> str:
        return "CharTokenizer(bytes)" if self.alphabet is None else f"CharTokenizer({self.alphabet!r})"
