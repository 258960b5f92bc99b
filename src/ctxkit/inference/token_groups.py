"""The token-classification pipeline's ``aggregation_strategy``, as transformers'
``TokenClassificationPipeline`` computes it from per-token label probabilities.

* ``none``: one entity per token (``entity``, ``score``, ``index``, ``word``, ``start``, ``end``).
* ``simple``: consecutive tokens of one entity type become one group (a ``B-`` tag starts a
  new one); the group's score is the mean of its tokens' scores.
* ``first``, ``average``, ``max``: first every word (a token and the ``##`` pieces after it)
  gets one label, from its first token's probabilities, from the mean of its tokens'
  probabilities, or from its most confident token; then the words are grouped as in ``simple``.

A group is ``{"entity_group", "score", "word", "start", "end"}``; ``word`` is its tokens or
words joined by the tokenizer's decoder (``##`` pieces glued, words spaced).
"""

from __future__ import annotations

from typing import Callable, List, Sequence

import numpy as np

__all__ = ["STRATEGIES", "token_entities", "aggregate"]

STRATEGIES = ("none", "simple", "first", "average", "max")


def token_entities(text: str, enc, probs: np.ndarray, tokenizer) -> List[dict]:
    """The text's tokens ([CLS], [SEP] left out) with what aggregation needs.

    Args:
        text: the input text.
        enc: its :class:`~ctxkit.tokenizers.batch.Encoding`.
        probs: ``(len(enc), labels)`` label probabilities per token.
        tokenizer: the WordPiece tokenizer that made ``enc``.

    Returns:
        ``{"word", "scores" (labels,), "start", "end", "index", "is_subword"}`` per token.
    """
    word_aware = getattr(tokenizer.backend.model, "continuing_subword_prefix", None) is not None
    out = []
    for i, (token, (start, end), seq) in enumerate(zip(enc.tokens, enc.offsets, enc.sequence_ids)):
        if seq is None:
            continue  # [CLS], [SEP]
        piece = text[start:end]
        if token == tokenizer.unk_token:
            # transformers shows the text an unknown token stands for, and starts a word with it
            token, is_subword = piece, False
        elif word_aware:
            is_subword = len(token) != len(piece)  # "##ing" covers 3 characters, not 5
        else:  # transformers' fallback: a token glued to the character before it continues a word
            is_subword = start > 0 and " " not in text[start - 1:start + 1]
        out.append({"word": token, "scores": probs[i], "start": start, "end": end, "index": i, "is_subword": is_subword})
    return out


def aggregate(tokens: List[dict], strategy: str, labels: Sequence[str], decode: Callable[[List[str]], str]) -> List[dict]:
    """Entities (``none``) or entity groups of :func:`token_entities`' output.

    Args:
        tokens: :func:`token_entities` of one text.
        strategy: one of :data:`STRATEGIES`.
        labels: label names by id.
        decode: joins token strings into text (the tokenizer's decoder).
    """
    if strategy in ("none", "simple"):
        entities = []
        for t in tokens:
            best = int(t["scores"].argmax())
            entities.append({"entity": labels[best], "score": float(t["scores"][best]), "index": t["index"],
                             "word": t["word"], "start": t["start"], "end": t["end"]})
    else:
        words: List[List[dict]] = []
        for t in tokens:
            if words and t["is_subword"]:
                words[-1].append(t)
            else:
                words.append([t])
        entities = [_word_entity(word, strategy, labels, decode) for word in words]
    return entities if strategy == "none" else _group(entities, decode)


def _word_entity(word: List[dict], strategy: str, labels: Sequence[str], decode) -> dict:
    """One word's label and score under ``first``, ``average`` or ``max``."""
    if strategy == "first":
        scores = word[0]["scores"]
    elif strategy == "max":
        scores = max(word, key=lambda t: t["scores"].max())["scores"]  # the first of equals, as transformers
    else:
        scores = np.nanmean(np.stack([t["scores"] for t in word]), axis=0)
    best = int(scores.argmax())
    return {"entity": labels[best], "score": float(scores[best]), "word": decode([t["word"] for t in word]),
            "start": word[0]["start"], "end": word[-1]["end"]}


def _tag(entity: str):
    """``("B" or "I", type)``; a tag without ``B-``/``I-`` continues like an ``I-``."""
    return (entity[0], entity[2:]) if entity[:2] in ("B-", "I-") else ("I", entity)


def _group(entities: List[dict], decode) -> List[dict]:
    """Adjacent entities of one type as one group (a ``B-`` starts a new group)."""
    groups: List[List[dict]] = []
    for e in entities:
        bi, kind = _tag(e["entity"])
        if groups and bi != "B" and kind == _tag(groups[-1][-1]["entity"])[1]:
            groups[-1].append(e)
        else:
            groups.append([e])
    return [{"entity_group": g[0]["entity"].split("-", 1)[-1], "score": float(np.nanmean([e["score"] for e in g])),
             "word": decode([e["word"] for e in g]), "start": g[0]["start"], "end": g[-1]["end"]} for g in groups]
