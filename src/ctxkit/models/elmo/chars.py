"""ELMo's character ids: every token becomes a fixed row of ``max_chars`` (50) ids.

The layout is AllenNLP's ``ELMoCharacterMapper`` (which the released weights expect):

* ids 0-255 are the token's UTF-8 bytes; 256/257 are the begin/end-of-sentence
  "characters", 258/259 begin/end of word, 260 padding inside a token;
* a word is ``[258, byte_1, ..., byte_n, 259, 260, 260, ...]``, with at most
  ``max_chars - 2`` (48) bytes: longer words are cut at the byte level, so a multi-byte
  character can be split, exactly as the pretrained models saw their training data;
* the sentence markers ``<S>`` / ``</S>`` are ``[258, 256, 259, 260, ...]`` and
  ``[258, 257, 259, 260, ...]``;
* finally every id is shifted by one so that 0 can mean "no token here" (a padded
  position of a batch), which is why the character vocabulary has 262 entries.
"""

from __future__ import annotations

from typing import List, Sequence

import torch
from torch import Tensor

from ...core.errors import UserError

__all__ = [
    "BOS_TOKEN",
    "EOS_TOKEN",
    "MAX_CHARS",
    "N_CHARACTERS",
    "word_to_char_ids",
    "batch_to_char_ids",
]

MAX_CHARS = 50
N_CHARACTERS = 262  # 256 bytes + 5 specials + the padding id 0
BOS_TOKEN, EOS_TOKEN = "<S>", "</S>"

_BOS_CHAR, _EOS_CHAR = 256, 257
_BOW, _EOW, _PAD = 258, 259, 260


def _marker(char: int, max_chars: int) -> List[int]:
    ids = [_PAD] * max_chars
    ids[0], ids[1], ids[2] = _BOW, char, _EOW
    return [c + 1 for c in ids]


def word_to_char_ids(word: str, max_chars: int = MAX_CHARS) -> List[int]:
    """Character ids of one token (see the module docstring for the layout).

    Args:
        word: the token; ``"<S>"`` and ``"</S>"`` map to the sentence markers.
        max_chars: ids per token, including the begin/end-of-word ids.

    Returns:
        ``max_chars`` ints in ``[1, 261]``.
    """
    if max_chars < 3:
        raise UserError(f"max_chars must be at least 3 (begin, one byte, end), got {max_chars}")
    if word == BOS_TOKEN:
        return _marker(_BOS_CHAR, max_chars)
    if word == EOS_TOKEN:
        return _marker(_EOS_CHAR, max_chars)
    # Truncated explicitly: the begin and end ids take two of the max_chars slots.
    encoded = word.encode("utf-8", "ignore")[: max_chars - 2]
    ids = [_PAD] * max_chars
    ids[0] = _BOW
    ids[1 : len(encoded) + 1] = list(encoded)
    ids[len(encoded) + 1] = _EOW
    return [c + 1 for c in ids]


def batch_to_char_ids(sentences: Sequence[Sequence[str]], add_boundaries: bool = False, max_chars: int = MAX_CHARS) -> Tensor:
    """Character ids of a batch of tokenised sentences, right-padded with all-zero rows.

    Args:
        sentences: lists of words.
        add_boundaries: wrap each sentence in ``<S>`` ... ``</S>`` (what the biLM was
            trained on; :func:`~ctxkit.models.elmo.model.elmo_embed` does this itself).
        max_chars: ids per token.

    Returns:
        ``(batch, max_tokens, max_chars)`` long tensor; ``max_tokens`` counts the markers
        when ``add_boundaries``. A padded position is all zeros.
    """
    rows = [[BOS_TOKEN, *s, EOS_TOKEN] if add_boundaries else list(s) for s in sentences]
    longest = max((len(r) for r in rows), default=0)
    out = torch.zeros(len(rows), longest, max_chars, dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            out[i, : len(row)] = torch.tensor([word_to_char_ids(w, max_chars) for w in row], dtype=torch.long)
    return out
