"""Context-free word vectors: word2vec (CBOW, skip-gram), fastText sub-words, and a bag-of-embeddings baseline.

These are the baselines ELMo-style contextual representations are measured against:
one vector per word type, whatever its context.

* :class:`WordVectors`: vocabulary plus ``(V, dim)`` float32 matrix, with nearest neighbours,
  3CosAdd analogies and optional fastText n-gram buckets for out-of-vocabulary words. It
  reads and writes GloVe text, word2vec text / binary and fastText ``.vec`` (:mod:`.static_io`).
* :func:`fasttext_hash`, :func:`char_ngrams`, :func:`ngram_buckets`: fastText's sub-word
  hashing, shared by lookups and training.
* Training them (word2vec CBOW / skip-gram, fastText sub-words) is
  :func:`ctxkit.pretraining.word2vec.train_word2vec`; the bag-of-embeddings sentence
  baseline is :mod:`ctxkit.models.static.bag`, trained by
  :func:`ctxkit.tasks.bag_classifier.train_bag_classifier`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ctxkit.models.static.io import read_vectors, write_vectors

from ...core.errors import UnknownNameError, UserError

__all__ = ["WordVectors", "char_ngrams", "fasttext_hash", "ngram_buckets"]

PathLike = Union[str, os.PathLike]

# ---------------------------------------------------------------------------- sub-words

_FNV_OFFSET, _FNV_PRIME = 2166136261, 16777619


def fasttext_hash(text: str) -> int:
    """32-bit FNV-1a of the UTF-8 bytes, exactly as fastText's ``Dictionary::hash``.

    fastText xors each byte after a cast to ``int8_t``, so bytes >= 0x80 are sign-extended
    (0xC3 acts as 0xFFFFFFC3). Plain FNV-1a does not; copying the quirk keeps bucket ids of
    non-ASCII n-grams the same as fastText's.
    """
    h = _FNV_OFFSET
    for byte in text.encode("utf-8"):
        h ^= byte if byte < 0x80 else byte | 0xFFFFFF00
        h = (h * _FNV_PRIME) & 0xFFFFFFFF
    return h


def char_ngrams(word: str, minn: int = 3, maxn: int = 6) -> List[str]:
    """Character n-grams of ``<word>`` with ``minn <= n <= maxn``, in fastText's order.

    The boundary markers let prefixes and suffixes ("<un", "ing>") differ from the same
    letters inside a word. Like fastText, lone markers are never n-grams.
    """
    token = f"<{word}>"
    grams = []
    for i in range(len(token)):
        for n in range(minn, min(maxn, len(token) - i) + 1):
            if not (n == 1 and (i == 0 or i + n == len(token))):
                grams.append(token[i:i + n])
    return grams


def ngram_buckets(word: str, minn: int = 3, maxn: int = 6, buckets: int = 2_000_000) -> List[int]:
    """Bucket ids (``fasttext_hash(gram) % buckets``) of the n-grams of ``word``; repeats kept, as fastText."""
    return [fasttext_hash(g) % buckets for g in char_ngrams(word, minn, maxn)]


# ---------------------------------------------------------------------------- vectors


class WordVectors:
    """A vocabulary with one float32 vector per word, and optional fastText n-gram buckets.

    Args:
        words: ``V`` distinct words, usually most frequent first.
        vectors: ``(V, dim)`` matrix (numpy or torch), stored as float32 numpy.
        counts: Optional ``(V,)`` corpus counts.
        ngram_vectors: Optional ``(buckets, dim)`` n-gram vectors. With them, a word outside
            the vocabulary gets the mean of its n-grams' bucket vectors (fastText).
        minn, maxn: n-gram lengths used for ``ngram_vectors``.
        meta: Free-form information, e.g. training settings and throughput.
    """

    def __init__(self, words: Sequence[str], vectors, counts=None, ngram_vectors=None,
                 minn: int = 3, maxn: int = 6, meta: Optional[dict] = None):
        if isinstance(vectors, torch.Tensor):
            vectors = vectors.detach().cpu().numpy()
        self.words = list(words)
        self.vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if self.vectors.ndim != 2 or self.vectors.shape[0] != len(self.words):
            raise UserError(f"vectors of shape {self.vectors.shape} do not match {len(self.words)} words")
        self.index: Dict[str, int] = {w: i for i, w in enumerate(self.words)}
        if len(self.index) != len(self.words):
            raise UserError("duplicate words in the vocabulary")
        self.counts = None if counts is None else np.asarray(counts, dtype=np.int64)
        if isinstance(ngram_vectors, torch.Tensor):
            ngram_vectors = ngram_vectors.detach().cpu().numpy()
        self.ngram_vectors = None if ngram_vectors is None else np.ascontiguousarray(ngram_vectors, np.float32)
        self.minn, self.maxn = int(minn), int(maxn)
        self.meta = dict(meta or {})
        self._unit: Optional[np.ndarray] = None

    @property
    def dim(self) -> int:
        return self.vectors.shape[1]

    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, word: str) -> bool:
        """Vocabulary membership; OOV words may still have a sub-word vector (:meth:`has_vector`)."""
        return word in self.index

    def __repr__(self) -> str:
        sub = f", ngram buckets={len(self.ngram_vectors)}" if self.ngram_vectors is not None else ""
        return f"WordVectors(words={len(self)}, dim={self.dim}{sub})"

    def has_vector(self, word: str) -> bool:
        return word in self.index or (self.ngram_vectors is not None and bool(char_ngrams(word, self.minn, self.maxn)))

    def subword_vector(self, word: str) -> np.ndarray:
        """Mean of the bucket vectors of ``word``'s n-grams, shape ``(dim,)``."""
        if self.ngram_vectors is None:
            raise UnknownNameError(f"{word!r} is not in the vocabulary (and these vectors have no sub-words)")
        ids = ngram_buckets(word, self.minn, self.maxn, len(self.ngram_vectors))
        if not ids:
            raise UnknownNameError(f"{word!r} has no character n-grams of length {self.minn}-{self.maxn}")
        return self.ngram_vectors[ids].mean(axis=0)

    def __getitem__(self, word: str) -> np.ndarray:
        """The ``(dim,)`` vector of ``word``: its row, or for OOV words the sub-word mean."""
        i = self.index.get(word)
        if i is not None:
            return self.vectors[i]
        if self.ngram_vectors is None:
            raise UnknownNameError(f"{word!r} is not in the vocabulary")
        return self.subword_vector(word)

    def get(self, word: str, default=None):
        try:
            return self[word]
        except KeyError:
            return default

    @property
    def unit_vectors(self) -> np.ndarray:
        """``(V, dim)`` rows scaled to length 1 (zero rows stay zero), cached."""
        if self._unit is None:
            norms = np.linalg.norm(self.vectors, axis=1, keepdims=True)
            self._unit = self.vectors / np.maximum(norms, 1e-12)
        return self._unit

    def _unit_query(self, query) -> np.ndarray:
        vec = np.asarray(self[query] if isinstance(query, str) else query, dtype=np.float32)
        if vec.shape != (self.dim,):
            raise UserError(f"query vector has shape {vec.shape}, expected ({self.dim},)")
        return vec / max(float(np.linalg.norm(vec)), 1e-12)

    def _top(self, unit_query: np.ndarray, k: int, exclude: Iterable[str], restrict: Optional[int]):
        matrix = self.unit_vectors if restrict is None else self.unit_vectors[:restrict]
        scores = matrix @ unit_query
        for word in exclude:
            i = self.index.get(word)
            if i is not None and i < len(scores):
                scores[i] = -np.inf
        k = min(k, int(np.isfinite(scores).sum()))
        if k <= 0:
            return []
        top = np.argpartition(-scores, k - 1)[:k]
        top = top[np.argsort(-scores[top], kind="stable")]
        return [(self.words[i], float(scores[i])) for i in top]

    def most_similar(self, query: Union[str, np.ndarray], k: int = 10, exclude: Iterable[str] = (),
                     restrict: Optional[int] = None) -> List[Tuple[str, float]]:
        """The ``k`` words of highest cosine similarity to a word or a ``(dim,)`` vector.

        Args:
            query: A word (left out of the answers) or a vector.
            k: How many neighbours.
            exclude: More words to leave out.
            restrict: Rank only the first ``restrict`` words (the most frequent ones).

        Returns:
            ``(word, cosine)`` pairs, best first.
        """
        exclude = list(exclude) + ([query] if isinstance(query, str) else [])
        return self._top(self._unit_query(query), k, exclude, restrict)

    def similarity(self, w1: str, w2: str) -> float:
        """Cosine similarity of two words."""
        return float(self._unit_query(w1) @ self._unit_query(w2))

    def analogy(self, a: str, b: str, c: str, k: int = 5, restrict: Optional[int] = None) -> List[Tuple[str, float]]:
        """Answers "a is to b as c is to ?" with 3CosAdd (word2vec's ``word-analogy``).

        The query is ``unit(b) - unit(a) + unit(c)``; candidates are ranked by cosine to it,
        with ``a``, ``b`` and ``c`` themselves excluded. E.g. ``analogy("man", "king",
        "woman")`` should rank "queen" first.

        Returns:
            ``(word, cosine)`` pairs, best first.
        """
        query = self._unit_query(b) - self._unit_query(a) + self._unit_query(c)
        return self._top(query / max(float(np.linalg.norm(query)), 1e-12), k, (a, b, c), restrict)

    def save(self, path: PathLike, format: Optional[str] = None, decimals: Optional[int] = None,
             progress: bool = True) -> Path:
        """Writes the vectors (see :func:`ctxkit.models.static.io.write_vectors` for formats).

        Only ``npz`` keeps counts, n-gram buckets and ``meta``; the text and binary formats hold
        the ``V`` word vectors (for sub-word models, the composed vectors, like fastText's ``.vec``).
        """
        extras = {"minn": np.int64(self.minn), "maxn": np.int64(self.maxn),
                  "meta_json": np.asarray(json.dumps(self.meta, default=str))}
        if self.counts is not None:
            extras["counts"] = self.counts
        if self.ngram_vectors is not None:
            extras["ngram_vectors"] = self.ngram_vectors
        return write_vectors(path, self.words, self.vectors, format, decimals=decimals, progress=progress,
                             extras=extras)

    @classmethod
    def load(cls, path: PathLike, format: Optional[str] = None, progress: bool = True,
             max_words: Optional[int] = None) -> "WordVectors":
        """Reads GloVe, word2vec text / binary, fastText ``.vec`` or ``npz`` (guessed when ``format`` is None).

        Raises:
            ValueError: naming the file and line of the first malformed entry.
        """
        words, matrix, extras = read_vectors(path, format, progress=progress, max_words=max_words)
        meta = json.loads(str(extras["meta_json"])) if "meta_json" in extras else {"source": str(path)}
        counts = extras.get("counts")
        return cls(words, matrix, counts=None if counts is None else counts[:len(words)],
                   ngram_vectors=extras.get("ngram_vectors"), minn=int(extras.get("minn", 3)),
                   maxn=int(extras.get("maxn", 6)), meta=meta)
