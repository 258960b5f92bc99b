"""Raw text -> documents -> sentences -> BERT pretraining instances (MLM + NSP pairs).

The instance recipe is the one of Google's ``create_pretraining_data.py``
(``create_instances_from_document``), with two deliberate differences, both documented
on :func:`create_instances`. Masking is not done here: it is dynamic, per epoch
(:mod:`ctxkit.pretraining.masking`).
"""

from __future__ import annotations

import itertools
import lzma
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Union

from ..data.lines import read_lines
from ..core.errors import UserError
from ..data.errors import DataError, check_input

PathLike = Union[str, os.PathLike]
FORMATS = ("auto", "blank", "file", "wikiextractor")

__all__ = ["FORMATS", "Instance", "create_instances", "read_documents", "split_sentences", "truncate_seq_pair", "word_tokenize",
           "write_word_corpus"]


# ---------------------------------------------------------------- documents


def _lines(path: PathLike) -> Iterator[str]:
    yield from read_lines(path)  # one pass, so a FIFO / <(...) works; corrupt .xz is named by line


def read_documents(path: PathLike, format: str = "auto") -> Iterator[List[str]]:
    """Yield the documents of a text file, each as its list of non-empty lines.

    Formats:
        ``"blank"``: one or more blank lines separate documents (BERT's own input
        format; a line may be a sentence or a paragraph).
        ``"file"``: the whole file is one document (e.g. a Gutenberg book).
        ``"wikiextractor"``: ``<doc id=.. url=.. title=..>`` ... ``</doc>`` blocks; the
        first line of a block repeats the title and is dropped, and documents with no
        body (WikiExtractor emits many) are skipped.
        ``"auto"``: ``"wikiextractor"`` if the first line starts with ``<doc ``, else
        ``"blank"``.

    Lines are stripped of surrounding whitespace; empty documents are never yielded.

    Args:
        path: A UTF-8 text file, plain or ``.xz``; read once, so a FIFO or ``<(...)`` works.
        format: One of :data:`FORMATS`.

    Yields:
        Lists of non-empty line strings.

    Raises:
        DataError: (a ``UserError``, a ``ValueError``) invalid UTF-8
            (``"{path}:{line}: invalid UTF-8 ..."``), corrupt ``.xz`` data, or a malformed
            WikiExtractor file (naming ``path:line``; a file ending inside a ``<doc>`` names
            the line that opened it).
        UserError: Unknown format; ``path`` is a directory.
        FileNotFoundError: ``path`` does not exist (``MissingFileError``, also a ``UserError``).
    """
    if format not in FORMATS:
        raise UserError(f"format must be one of {FORMATS}, got {format!r}")
    check_input(path)  # MissingFileError "PATH: no such file"; a FIFO or <(...) is fine
    lines = _lines(path)
    if format == "auto":
        first = next(lines, None)
        if first is None:
            return
        format = "wikiextractor" if first.startswith("<doc ") else "blank"
        lines = itertools.chain([first], lines)
    if format == "wikiextractor":
        yield from _wikiextractor_docs(lines, str(path))
        return
    doc: List[str] = []
    for line in lines:
        line = line.strip()
        if line:
            doc.append(line)
        elif format == "blank" and doc:
            yield doc
            doc = []
    if doc:
        yield doc


def _wikiextractor_docs(lines: Iterator[str], name: str) -> Iterator[List[str]]:
    doc: Optional[List[str]] = None
    title_pending, opened = False, 0
    for line_no, line in enumerate(lines, start=1):
        if line.startswith("<doc ") and line.rstrip().endswith(">"):
            if doc is not None:
                raise DataError(name, line_no, "<doc> opened before the previous </doc>")
            doc, title_pending, opened = [], True, line_no
        elif line.strip() == "</doc>":
            if doc is None:
                raise DataError(name, line_no, "</doc> without an opening <doc ...>")
            if doc:
                yield doc
            doc = None
        elif doc is None:
            if line.strip():
                raise DataError(name, line_no, "text outside a <doc ...> block")
        elif title_pending:
            title_pending = False  # the title line; the body follows
        elif line.strip():
            doc.append(line.strip())
    if doc is not None:
        raise UserError(f"{name}: ends inside a <doc ...> block (no closing </doc> for the one opened at line {opened})")


# ---------------------------------------------------------------- sentences

# Tokens that end in "." but rarely end a sentence (compared lowercased, dot included).
ABBREVIATIONS = frozenset("""
mr. mrs. ms. dr. prof. sr. jr. st. mt. ft. gen. col. lt. capt. sgt. rev. hon. gov. sen. rep. pres.
e.g. i.e. etc. vs. cf. al. approx. ca. c. no. nos. vol. vols. pp. p. fig. figs. ed. eds. op.
jan. feb. mar. apr. jun. jul. aug. sep. sept. oct. nov. dec. inc. ltd. co. corp. dept. univ. est.
""".split())
# A candidate boundary: terminal punctuation, optional closing quotes/brackets, whitespace,
# then something that can start a sentence (an uppercase letter or digit, perhaps quoted).
_BOUNDARY = re.compile(r"""[.!?]+["'”’)\]]*(\s+)(?=["'“‘(\[]*[A-Z0-9À-Ý])""")
_INITIALS = re.compile(r"(?:[A-Za-z]\.)+$")  # "J." "U.S." "U.S.A."


def split_sentences(text: str) -> List[str]:
    """Split text into sentences with a small rule set (no model, no extra dependency).

    A sentence ends at ``.``, ``!`` or ``?`` (plus any closing quotes or brackets)
    followed by whitespace and an uppercase letter, a digit or an opening quote. A
    period does not end a sentence when the word before it is in
    :data:`ABBREVIATIONS` (``Mr.``, ``e.g.``, ``No.``) or is made of single-letter
    initials (``J.``, ``U.S.``). Decimals (``3.14``) never split since no space follows
    the dot. Known misses: a sentence that really ends with ``U.S.`` or an
    abbreviation stays joined to the next one; one starting lowercase is not split off.

    Args:
        text: One line or paragraph.

    Returns:
        The sentences, stripped, in order; ``[]`` for blank text.
    """
    sentences, start = [], 0
    for m in _BOUNDARY.finditer(text):
        end = m.start(1)  # sentence ends before the whitespace
        word = text[start:end].rsplit(None, 1)[-1] if text[start:end].strip() else ""
        bare = word.rstrip("\"'”’)]").lstrip("\"'“‘([")
        if bare.endswith(".") and (bare.lower() in ABBREVIATIONS or _INITIALS.match(bare)):
            continue
        sentences.append(text[start:end].strip())
        start = m.end(1)
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return [s for s in sentences if s]


# A word is letters/digits, possibly joined by inner hyphens, apostrophes, periods or commas
# ("well-known", "don't", "U.S", "3.14", "1,000"); every other non-space character stands alone.
_WORD = re.compile(r"\w+(?:[-'’.,]\w+)*|[^\w\s]")


def word_tokenize(sentence: str, lower: bool = False) -> List[str]:
    """Whitespace- and punctuation-split words of one sentence (for word-level LMs).

    >>> word_tokenize("Its river-side branch (1,000 m away) isn't open.")
    ['Its', 'river-side', 'branch', '(', '1,000', 'm', 'away', ')', "isn't", 'open', '.']
    """
    return _WORD.findall(sentence.lower() if lower else sentence)


def write_word_corpus(paths: Sequence[PathLike], out: PathLike, format: str = "auto", lower: bool = False,
                      show_progress: bool = True) -> dict:
    """Documents -> one whitespace-tokenised sentence per line, a blank line between documents.

    The output feeds the word-level trainers (``ctxkit pretrain-elmo``,
    ``ctxkit train-transformer-xl``, ``ctxkit word2vec-train``). A name ending in ``.xz`` is
    compressed. The file is written to a temporary name and renamed when complete.

    Returns:
        ``{"documents", "sentences", "words", "out"}``.
    """
    from tqdm.auto import tqdm

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    stats = {"documents": 0, "sentences": 0, "words": 0}
    opener = lzma.open if out.name.endswith(".xz") else open
    try:
        with opener(tmp, "wt", encoding="utf-8") as fh:
            for path in tqdm(paths, desc="lm-corpus", unit="file", disable=not show_progress):
                for doc in read_documents(path, format):
                    if stats["documents"]:
                        fh.write("\n")
                    stats["documents"] += 1
                    for line in doc:
                        for sentence in split_sentences(line):
                            words = word_tokenize(sentence, lower)
                            if words:
                                fh.write(" ".join(words) + "\n")
                                stats["sentences"] += 1
                                stats["words"] += len(words)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    return {**stats, "out": str(out)}


# ---------------------------------------------------------------- instances


@dataclass
class Instance:
    """One NSP sentence pair, before special tokens and masking.

    Attributes:
        tokens_a: Token ids of segment A.
        tokens_b: Token ids of segment B.
        is_random_next: True when B comes from another document (NSP label 1).
    """

    tokens_a: List[int]
    tokens_b: List[int]
    is_random_next: bool


def truncate_seq_pair(tokens_a: List[int], tokens_b: List[int], max_num_tokens: int, rng: random.Random) -> None:
    """Trim the pair in place to ``max_num_tokens``, as in BERT.

    One token at a time comes off the longer side (B on ties), from its front or its
    back with equal probability, which adds noise compared with always cutting the end.
    The rng draws are the same as BERT's loop; the cut is done once at the end so a
    thousand-token sentence costs O(n), not O(n^2).
    """
    a0, a1, b0, b1 = 0, len(tokens_a), 0, len(tokens_b)
    while (a1 - a0) + (b1 - b0) > max_num_tokens:
        front = rng.random() < 0.5
        if a1 - a0 > b1 - b0:
            a0, a1 = (a0 + 1, a1) if front else (a0, a1 - 1)
        else:
            b0, b1 = (b0 + 1, b1) if front else (b0, b1 - 1)
    tokens_a[:] = tokens_a[a0:a1]
    tokens_b[:] = tokens_b[b0:b1]


def create_instances(documents: Sequence[Sequence[Sequence[int]]], max_seq_len: int = 128,
                     short_seq_prob: float = 0.1, nsp_prob: float = 0.5,
                     rng: Optional[random.Random] = None) -> List[Instance]:
    """Build NSP sentence pairs from tokenized documents (BERT's recipe).

    Per document, sentences are accumulated into a chunk until it reaches the target
    length (``max_seq_len - 3``, leaving room for ``[CLS] A [SEP] B [SEP]``; with
    probability ``short_seq_prob`` a random target in ``[2, max_seq_len - 3]``). Segment
    A is the first ``randint(1, len(chunk) - 1)`` sentences of the chunk. Segment B is
    the rest of the chunk (label 0), or, with probability ``nsp_prob`` and always for a
    one-sentence chunk, sentences from a random start in another document until the
    target is met (label 1); the chunk sentences not used are then put back for the
    next chunk. Finally :func:`truncate_seq_pair` trims the pair to fit.

    Differences from Google's script: (1) the short target is drawn anew for every
    instance, not once per document, so ``short_seq_prob`` is the share of short
    instances as its comment intends, independent of document length; (2) the random
    document is always a different non-empty document (BERT tries 10 draws and may
    keep the same one). With a single document, random-next pairs are impossible, so
    one-sentence chunks are skipped and every label is 0. Instances are returned in
    document order; shuffle them yourself (:func:`~ctxkit.pretraining.build_shards`
    does).

    Args:
        documents: ``documents[d][s]`` is the token id list of sentence ``s`` of
            document ``d``. Empty sentences and documents are ignored.
        max_seq_len: Final length limit including the 3 special tokens (>= 5).
        short_seq_prob: Probability of a shorter random target length.
        nsp_prob: Probability that B is a random next (for chunks of >= 2 sentences).
        rng: Source of randomness; the output is a function of its state.

    Returns:
        Instances with ``1 <= len(tokens_a)``, ``1 <= len(tokens_b)`` and
        ``len(tokens_a) + len(tokens_b) <= max_seq_len - 3``.
    """
    if max_seq_len < 5:
        raise UserError(f"max_seq_len must be >= 5 ([CLS] a [SEP] b [SEP]), got {max_seq_len}")
    for name, p in (("short_seq_prob", short_seq_prob), ("nsp_prob", nsp_prob)):
        if not 0.0 <= p <= 1.0:
            raise UserError(f"{name} must be in [0, 1], got {p}")
    rng = rng if rng is not None else random.Random(0)
    docs = [[list(s) for s in doc if len(s)] for doc in documents]
    docs = [d for d in docs if d]
    max_num_tokens = max_seq_len - 3
    instances: List[Instance] = []

    def new_target() -> int:
        return rng.randint(2, max_num_tokens) if rng.random() < short_seq_prob else max_num_tokens

    for doc_index, document in enumerate(docs):
        target = new_target()
        chunk: List[List[int]] = []
        length, i = 0, 0
        while i < len(document):
            chunk.append(document[i])
            length += len(document[i])
            if i == len(document) - 1 or length >= target:
                a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
                tokens_a = [t for s in chunk[:a_end] for t in s]
                tokens_b: List[int] = []
                if len(chunk) == 1 or rng.random() < nsp_prob:
                    if len(docs) < 2:
                        if len(chunk) == 1:  # no true continuation and no other document
                            chunk, length = [], 0
                            i += 1
                            continue
                        tokens_b = [t for s in chunk[a_end:] for t in s]
                        is_random = False
                    else:
                        is_random = True
                        other = rng.randrange(len(docs) - 1)
                        other += other >= doc_index  # any document but this one
                        random_doc = docs[other]
                        target_b = target - len(tokens_a)
                        for sentence in random_doc[rng.randrange(len(random_doc)):]:
                            tokens_b.extend(sentence)
                            if len(tokens_b) >= target_b:
                                break
                        i -= len(chunk) - a_end  # the unused sentences start the next chunk
                else:
                    is_random = False
                    tokens_b = [t for s in chunk[a_end:] for t in s]
                truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
                instances.append(Instance(tokens_a, tokens_b, is_random))
                chunk, length = [], 0
                target = new_target()
            i += 1
    return instances
