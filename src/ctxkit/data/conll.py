"""CoNLL-2003 style token-per-line NER files, and word <-> sub-word label alignment.

Output tags are always BIO (IOB2). The original CoNLL-2003 release uses IOB1, where an
entity may open with ``I-`` and ``B-`` only separates two adjacent entities of one type;
:func:`iob1_to_bio` converts it, and :func:`read_conll` detects it by default.
"""

from __future__ import annotations

import bisect
import logging
import os
import re
from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Union

from .errors import ProblemLog, ReadResult, iter_lines, open_input
from ..core.errors import UserError, quote

__all__ = ["TaggedSentence", "ConllReadResult", "read_conll", "iob1_to_bio", "label_list", "align_labels",
           "word_predictions", "encode_tagged", "SCHEMES"]

PathLike = Union[str, os.PathLike]
SCHEMES = ("auto", "iob1", "bio")
DOCSTART = "-DOCSTART-"
_TAG = re.compile(r"O|[BI]-\S+")
logger = logging.getLogger("ctxkit")


@dataclass
class TaggedSentence:
    """One sentence with a tag per word.

    Attributes:
        words: The tokens as written in the file.
        tags: BIO tags, one per word.
        doc_index: 0-based document number (``-DOCSTART-`` lines separate documents).
        guid: ``"file:line"`` of the sentence's first token line.
    """

    words: List[str]
    tags: List[str]
    doc_index: int
    guid: str


class ConllReadResult(ReadResult):
    """A :class:`ReadResult` of :class:`TaggedSentence`.

    Attributes:
        num_documents: Documents seen (1 for a file without ``-DOCSTART-``).
        source_scheme: ``"iob1"`` if the file's tags were converted, else ``"bio"``.
    """

    num_documents: int = 0
    source_scheme: str = "bio"


def _orphan_inside(tags: Sequence[str]) -> Optional[int]:
    """Position of the first ``I-X`` not preceded by ``B-X``/``I-X`` (IOB1 style), or None."""
    prev = "O"
    for i, tag in enumerate(tags):
        if tag.startswith("I-") and (prev == "O" or prev[2:] != tag[2:]):
            return i
        prev = tag
    return None


def iob1_to_bio(tags: Sequence[str]) -> List[str]:
    """Convert IOB1 tags to BIO: an ``I-X`` that opens an entity becomes ``B-X``.

    ``B-X`` (IOB1's marker between two adjacent ``X`` entities) stays ``B-X``, so BIO input
    comes back unchanged. Example: ``I-PER I-PER B-PER`` -> ``B-PER I-PER B-PER``.
    """
    out: List[str] = []
    prev = "O"
    for tag in tags:
        if tag.startswith("I-") and (prev == "O" or prev[2:] != tag[2:]):
            tag = "B-" + tag[2:]
        out.append(tag)
        prev = tag
    return out


def read_conll(path: PathLike, tag_column: int = -1, scheme: str = "auto", on_error: str = "raise") -> ConllReadResult:
    """Read a CoNLL-style file: one ``word ... tag`` line per token, blank lines between sentences.

    ``-DOCSTART-`` lines end a document (they are not sentences); a last sentence without
    a final blank line is kept. Every token line must have as many columns as the file's
    first token line.

    Args:
        path: The file.
        tag_column: Column of the tag (``-1`` = last, the NER column of CoNLL-2003).
        scheme: ``"bio"`` (``I-X`` may not open an entity), ``"iob1"`` (convert), or
            ``"auto"`` (convert when any ``I-X`` opens an entity). Output is always BIO.
        on_error: ``"raise"`` or ``"skip"``; skipping drops the whole sentence.

    Returns:
        :class:`ConllReadResult` of :class:`TaggedSentence`.

    Raises:
        DataError: Wrong column count, a tag other than ``O``/``B-X``/``I-X``, or with
            ``scheme="bio"`` an entity opened by ``I-``; the message names the line.
    """
    if scheme not in SCHEMES:
        raise UserError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    problems = ProblemLog(path, on_error)
    name = os.path.basename(os.fspath(path))
    sentences: List[TaggedSentence] = []
    starts: List[int] = []  # first line of each sentence, for messages after reading
    words: List[str] = []
    tags: List[str] = []
    start = 0
    bad = False  # the current sentence had a problem and will be dropped
    doc, started = 0, False
    layout = None  # (column count, line) of the first token line

    def flush():
        nonlocal words, tags, bad
        if words and not bad:
            sentences.append(TaggedSentence(words, tags, doc, f"{name}:{start}"))
            starts.append(start)
        words, tags, bad = [], [], False

    with open_input(path) as fh:
        for line_no, line in iter_lines(fh, problems):
            if line is None:  # undecodable, already reported
                bad = True
                continue
            fields = line.split()
            if not fields:
                flush()
                continue
            if fields[0] == DOCSTART:
                flush()
                doc += started
                started = True
                continue
            if not words and not bad:
                start = line_no
            started = True
            if layout is None:
                layout = (len(fields), line_no)
                if not -len(fields) <= tag_column < len(fields):
                    raise problems.fatal(line_no, "no tag column", f"tag_column={tag_column} but {len(fields)} columns")
            if bad:
                continue
            if len(fields) != layout[0]:
                problems.report(line_no, "wrong column count",
                                f"expected {layout[0]} columns like line {layout[1]}, found {len(fields)}")
                bad = True
                continue
            tag = fields[tag_column]
            if not _TAG.fullmatch(tag):
                problems.report(line_no, "bad tag", f"{quote(tag, 100)}; tags must be O, B-TYPE or I-TYPE")
                bad = True
                continue
            words.append(fields[0])
            tags.append(tag)
    flush()

    iob1 = scheme == "iob1" or (scheme == "auto" and any(_orphan_inside(s.tags) is not None for s in sentences))
    kept = []
    for sent, first in zip(sentences, starts):
        if iob1:
            sent.tags = iob1_to_bio(sent.tags)
        elif scheme == "bio" and (i := _orphan_inside(sent.tags)) is not None:
            problems.report(first + i, "entity opened by I-",
                            f"{quote(sent.tags[i], 100)} follows {quote(sent.tags[i - 1], 100) if i else 'the sentence start'}; "
                            f"IOB1 data? pass scheme='iob1' or 'auto'")
            continue
        kept.append(sent)
    if iob1:
        logger.info("%s: IOB1 tags converted to BIO", path)
    result = ConllReadResult(kept)
    result.num_documents = doc + 1 if started else 0
    result.source_scheme = "iob1" if iob1 else "bio"
    return problems.finish(result, what="sentences")


def label_list(sentences: Iterable[TaggedSentence]) -> List[str]:
    """BIO label list: ``"O"`` then ``B-X, I-X`` for each entity type in sorted order.

    Both tags of every type are listed even if ``I-X`` never occurs (single-word
    entities only), so a tagger can always predict a well-formed sequence.
    """
    types = {tag[2:] for s in sentences for tag in s.tags if tag != "O"}
    return ["O"] + [f"{prefix}-{t}" for t in sorted(types) for prefix in "BI"]


def align_labels(word_ids: Sequence[Optional[int]], word_labels: Sequence[int], ignore_index: int = -100) -> List[int]:
    """Spread word labels over sub-word tokens.

    A word's label goes on its first sub-word; its other sub-words and special tokens
    (``None`` word id) get ``ignore_index``, so the loss counts each word once.

    Args:
        word_ids: Per-token word index ``(seq,)``; ``None`` for special tokens.
        word_labels: One label id per word.
        ignore_index: Label for positions the loss skips.

    Returns:
        Per-token labels ``(seq,)``.
    """
    seen = set()
    out = []
    for w in word_ids:
        if w is None or w in seen:
            out.append(ignore_index)
        else:
            seen.add(w)
            out.append(word_labels[w])
    return out


def word_predictions(word_ids: Sequence[Optional[int]], token_predictions: Sequence, num_words: Optional[int] = None,
                     fill=None) -> list:
    """Collapse per-token predictions to one per word, taken from the word's first sub-word.

    The inverse of :func:`align_labels`: ``word_predictions(ids, align_labels(ids, y)) == y``
    for every word that has a token.

    Args:
        word_ids: Per-token word index ``(seq,)``; ``None`` for special/padding tokens.
        token_predictions: Per-token predictions ``(seq,)`` (list, tensor or array),
            at least as long as ``word_ids``'s non-padding part.
        num_words: Number of words in the sentence; defaults to the highest word id + 1.
            Words without a token (cut by truncation) get ``fill``.
        fill: Value for words without a token.

    Returns:
        One prediction per word.
    """
    if hasattr(token_predictions, "tolist"):
        token_predictions = token_predictions.tolist()
    if len(token_predictions) < len(word_ids):
        raise ValueError(f"{len(word_ids)} word ids but only {len(token_predictions)} predictions")
    if num_words is None:
        num_words = max((w for w in word_ids if w is not None), default=-1) + 1
    out = [fill] * num_words
    seen = set()
    for w, pred in zip(word_ids, token_predictions):
        if w is None or w in seen:
            continue
        if w >= num_words:
            raise ValueError(f"word id {w} out of range for num_words={num_words}")
        seen.add(w)
        out[w] = pred
    return out


def encode_tagged(tokenizer, sentence: TaggedSentence, label_to_id: Optional[Mapping[str, int]],
                  max_length: Optional[int] = None, ignore_index: int = -100) -> Dict[str, object]:
    """Tokenize a pre-split sentence and align its tags to the sub-words.

    The words are joined with single spaces and tokens are mapped back to the original
    word through their character offsets. The tokenizer's own ``word_ids`` cannot be
    used: they count pre-tokens, and BERT's pre-tokenizer splits punctuation, so
    ``"U.S."`` is four of them.

    Args:
        tokenizer: A :class:`ctxkit.tokenizers.WordPieceTokenizer` (anything whose
            ``encode(text, max_length=, truncation=)`` returns ids, offsets and word ids).
        sentence: The words and tags (tags may be empty when ``label_to_id`` is None).
        label_to_id: Tag -> id; ``None`` for unlabelled input (all labels ignored).
        max_length: Token limit, special tokens included; tokenizer default if None.
        ignore_index: Label of non-first sub-words and special tokens.

    Returns:
        Dict with ``input_ids``, ``token_type_ids``, ``attention_mask``, ``labels``
        (aligned, ``(seq,)``), ``word_index`` (original word per token, ``None`` for
        special tokens), ``num_truncated_words`` (words whose first sub-word fell past
        ``max_length``) and ``num_untokenized_words`` (words that gave no token at all,
        e.g. only control characters). Words in neither count are fully represented.

    Raises:
        ValueError: A tag missing from ``label_to_id``.
    """
    words = sentence.words
    starts, pos = [], 0
    for word in words:
        starts.append(pos)
        pos += len(word) + 1
    enc = tokenizer.encode(" ".join(words), max_length=max_length, truncation="longest_first")
    word_index: List[Optional[int]] = [
        None if wid is None else bisect.bisect_right(starts, s) - 1 for wid, (s, _) in zip(enc.word_ids, enc.offsets)
    ]
    if label_to_id is None:
        labels = [ignore_index] * len(word_index)
    else:
        unknown = sorted({t for t in sentence.tags if t not in label_to_id})
        if unknown:
            raise UserError(f"{sentence.guid}: tags {unknown} not in label_to_id")
        labels = align_labels(word_index, [label_to_id[t] for t in sentence.tags], ignore_index)
    covered = {w for w in word_index if w is not None}
    last = max(covered, default=-1)
    missing = [w for w in range(len(words)) if w not in covered]
    truncated = sum(1 for w in missing if enc.num_truncated and w > last)
    return {
        "input_ids": list(enc.input_ids), "token_type_ids": list(enc.token_type_ids),
        "attention_mask": list(enc.attention_mask), "labels": labels, "word_index": word_index,
        "num_truncated_words": truncated, "num_untokenized_words": len(missing) - truncated,
    }
