"""Tokenizing many single texts for inference: only the text that can survive truncation.

``ctxkit predict`` on a GPU host is bound by tokenizing (docs/notes/gpu-serving.md): a line of
~190 tokens cut to 128 costs the tokenizer its whole length. For BERT's pipeline (BertNormalizer,
BertPreTokenizer, WordPiece) the tokens of a text cut at a space are a prefix of the whole text's
tokens: every character-level step (cleaning, accents, lower case, Chinese characters) leaves a
space a split point, and each word is tokenized on its own. So a long text is tokenized from a
prefix of about the characters its first ``max_length`` tokens need; when that prefix turns out
too short (fewer tokens than the cap), the whole text is tokenized again. The ids are exactly
the whole text's, truncated (``tests/test_token_blocks.py`` checks it on real and on generated
texts with accents, Greek final sigma, Chinese characters and control characters).
"""

from __future__ import annotations

import math
from typing import Callable, List, Sequence

from tokenizers import Tokenizer, normalizers, pre_tokenizers

__all__ = ["PrefixBudget", "capped_ids", "cuts_at_spaces"]


def cuts_at_spaces(backend: Tokenizer) -> bool:
    """Whether ``backend``'s tokens of a text cut at a space are a prefix of the whole text's:
    BERT's normalizer and pre-tokenizer, and no added token with a space inside (an added token
    is matched in the raw text, so a cut could split it)."""
    if not isinstance(backend.normalizer, normalizers.BertNormalizer):
        return False
    if not isinstance(backend.pre_tokenizer, pre_tokenizers.BertPreTokenizer):
        return False
    return not any(any(c.isspace() for c in t.content) for t in backend.get_added_tokens_decoder().values())


class PrefixBudget:
    """How many characters a text's first ``n`` tokens are taken to need: ``n`` times a
    characters-per-token factor that follows the data. A call whose prefixes fell short (and
    were tokenized again whole) more than 5 % of the time raises it by 10 %; one under 2 %
    lowers it by 3 %. Only the speed depends on it, never the ids."""

    def __init__(self, chars_per_token: float = 5.0):
        self.chars_per_token = chars_per_token

    def chars(self, tokens: int) -> int:
        return int(math.ceil(tokens * self.chars_per_token))

    def update(self, cut: int, short: int) -> None:
        if cut < 32:  # too few cut texts to say anything
            return
        rate = short / cut
        if rate > 0.05:
            self.chars_per_token = min(self.chars_per_token * 1.1, 16.0)
        elif rate < 0.02:
            self.chars_per_token = max(self.chars_per_token * 0.97, 2.0)


def capped_ids(encode: Callable[[List[str]], list], texts: Sequence[str], cap: int, content: int,
               budget: "PrefixBudget | None") -> List[List[int]]:
    """Each text's ids truncated (from the right) to ``cap`` tokens, special tokens included.

    Args:
        encode: the backend's batch encoder with truncation to ``cap`` already set; returns
            encodings (with ``.ids``).
        texts: single texts.
        cap: the truncation length the encoder applies.
        content: how many of those are the text's own tokens (``cap`` less the special ones).
        budget: the prefix sizing (None: every text tokenized whole, for tokenizers whose
            tokens of a prefix are not a prefix of the tokens, see :func:`cuts_at_spaces`).
    """
    inputs, cut = list(texts), []
    if budget is not None:
        limit = budget.chars(content)
        for i, text in enumerate(texts):
            if len(text) > limit:
                at = text.rfind(" ", 0, limit)
                if at > 0:
                    inputs[i] = text[:at]
                    cut.append(i)
    rows = [e.ids for e in encode(inputs)]
    # A prefix that filled the cap holds the whole text's first tokens; one that did not
    # may have lost tokens to the cut, so that text is tokenized whole.
    short = [i for i in cut if len(rows[i]) < cap]
    if short:
        for i, enc in zip(short, encode([texts[i] for i in short])):
            rows[i] = enc.ids
    if budget is not None:
        budget.update(len(cut), len(short))
    return rows

