"""Context-free word vectors: word2vec (CBOW, skip-gram), fastText sub-words, and a bag-of-embeddings baseline.

These are the baselines ELMo-style contextual representations are measured against:
one vector per word type, whatever its context.

* :class:`WordVectors`: vocabulary plus ``(V, dim)`` float32 matrix, with nearest neighbours,
  3CosAdd analogies and optional fastText n-gram buckets for out-of-vocabulary words. It
  reads and writes GloVe text, word2vec text / binary and fastText ``.vec`` (:mod:`.static_io`).
* :func:`fasttext_hash`, :func:`char_ngrams`, :func:`ngram_buckets`: fastText's sub-word
  hashing, shared by lookups and training.
* :func:`train_word2vec`: CBOW or skip-gram with negative sampling, optionally with
  fastText character n-grams, trained with batched Hogwild-style SGD in PyTorch. This module
  holds the loop (epochs, chunks, batches, learning rate, checkpoints, progress); its pieces
  (vocabulary, subsampling, negative sampler, :class:`NegativeSamplingModel`, skip-gram and
  CBOW examples) live in :mod:`.static_train` and are re-exported here.
* The bag-of-embeddings sentence baseline lives in :mod:`ctxkit.models.bag_of_embeddings`.
"""

from __future__ import annotations

import json
import math
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ctxkit.models.static_io import read_corpus, read_vectors, write_vectors
from ctxkit.models.static_train import (
    NegativeSamplingModel,
    UnigramSampler,
    _cbow_examples,
    _encode,
    _skipgram_examples,
    build_vocab,
    keep_probabilities,
)

from ..core.callbacks import Callback, CallbackList
from ..core.errors import UnknownNameError, UserError
from ..core.interrupts import StopSignals, resume_or_start
from ..core.run_state import capture_rng, load_checkpoint, restore_rng, save_checkpoint

__all__ = [
    "NegativeSamplingModel", "UnigramSampler",
    "WordVectors", "build_vocab", "char_ngrams", "fasttext_hash", "keep_probabilities", "ngram_buckets",
    "read_corpus", "train_word2vec",
]

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
        """Writes the vectors (see :func:`ctxkit.models.static_io.write_vectors` for formats).

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


# ---------------------------------------------------------------------------- training


def _expand_bags(words: np.ndarray, sub_ptr: np.ndarray, sub_rows: np.ndarray):
    """Replaces each word by its input rows (itself + n-gram buckets): ``(rows, rows per word)``."""
    starts, lens = sub_ptr[words], sub_ptr[words + 1] - sub_ptr[words]
    ends = np.cumsum(lens)
    # Output position p of word j maps to sub_rows[starts[j] + p - (ends[j] - lens[j])].
    src = np.arange(ends[-1]) + np.repeat(starts - ends + lens, lens)
    return sub_rows[src], lens


@contextmanager
def _torch_threads(n: Optional[int]):
    previous = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _bag_batch(inputs, sel, cbow, sub_ptr, sub_rows):
    """Input rows of the selected examples: ``(rows, offsets, lengths)``; offsets None for one row each."""
    words, per_example = inputs[sel].astype(np.int64), None
    if cbow:
        mask = words >= 0
        words, per_example = words[mask], mask.sum(axis=1)
    if sub_ptr is not None:
        words, lens = _expand_bags(words, sub_ptr, sub_rows)
        # rows per example = rows of all its words (reduceat is safe: no CBOW example is empty)
        per_example = lens if per_example is None else np.add.reduceat(lens, np.cumsum(per_example) - per_example)
    if per_example is None:
        return words, None, None
    return words, np.cumsum(per_example) - per_example, per_example.astype(np.int64)


def train_word2vec(corpus, model: str = "skipgram", dim: int = 100, window: int = 5, negative: int = 5,
                   min_count: int = 5, epochs: int = 5, subsample: float = 1e-3, subwords: bool = False,
                   minn: int = 3, maxn: int = 6, buckets: int = 2_000_000, lr: Optional[float] = None,
                   batch_size: int = 1024, optimizer: str = "sgd", lowercase: bool = False,
                   max_vocab: Optional[int] = None, seed: int = 0, device: Union[str, torch.device] = "cpu",
                   progress: bool = True, chunk_tokens: int = 1 << 18, num_threads: Optional[int] = 1,
                   callbacks: Optional[Sequence["Callback"]] = None, checkpoint: Optional[PathLike] = None,
                   save_every: int = 10, resume: bool = False) -> WordVectors:
    """Trains word2vec CBOW / skip-gram with negative sampling, or fastText-style sub-word vectors.

    Per epoch, frequent words are subsampled (:func:`keep_probabilities`), each kept token
    draws a window size in ``1..window``, and the examples of each chunk of ``chunk_tokens``
    tokens are shuffled and fed in batches of ``batch_size``, with ``negative`` words per
    example from :class:`UnigramSampler`. The learning rate decays linearly to ``lr * 1e-4``.

    Args:
        corpus: A path or paths of whitespace-tokenised text (one sentence per line; ``.xz``
            and ``.gz`` read transparently), or an iterable of token lists.
        model: ``"skipgram"`` or ``"cbow"``.
        dim, window, negative: Vector size, largest context distance, negatives per example.
        min_count: Words seen fewer times are dropped before training.
        epochs: Passes over the corpus.
        subsample: word2vec's ``-sample`` threshold ``t``; 0 keeps every token.
        subwords: Add fastText character n-grams (``minn``..``maxn``, hashed into ``buckets`` rows).
        lr: Start learning rate; default 0.025 (skip-gram) / 0.05 (CBOW) for SGD, 1e-2 for SparseAdam.
        batch_size: Examples per update. Larger batches sum more updates of frequent words into one step.
        optimizer: ``"sgd"`` (closed-form updates) or ``"sparse_adam"`` (autograd + SparseAdam).
        lowercase: Lowercase the corpus (path input only).
        max_vocab: Keep at most this many words.
        seed: Seeds initialisation, subsampling, windows, shuffling and negatives.
        device: Torch device of the model.
        progress: Show a tqdm bar with loss, learning rate and words/s.
        chunk_tokens: Tokens whose examples are built and shuffled together.
        num_threads: Torch CPU threads while training (restored afterwards); None leaves the
            setting alone. The per-batch kernels are small: extra threads gain little, and on
            a busy machine waiting for them made epochs 10x slower.
        callbacks: Receive a record after each chunk (:mod:`ctxkit.core.callbacks`): the
            step is the corpus tokens read so far (all epochs), ``loss`` the epoch's mean loss
            so far (so an epoch's last record has its ``epoch_losses`` entry), ``lr``,
            ``words_per_s``. Closed when training returns or fails.
        checkpoint: A folder for a resumable checkpoint (:func:`ctxkit.core.run_state.save_checkpoint`:
            both matrices, the optimiser, the random generator and the position), written
            every ``save_every`` chunks, at each epoch's end and when a signal stops the run.
        resume: Continue from ``checkpoint`` exactly: the vectors equal an uninterrupted run's.
            With no complete checkpoint there (a run that crashed before its first), start
            from the beginning with a one-line note.

    SIGTERM or SIGUSR1 stop the run after the current batch, with the checkpoint written (when
    there is a ``checkpoint`` folder): ``meta["stopped"]`` then says where, and the vectors
    are those of an unfinished run. A second signal stops at once.

    Returns:
        :class:`WordVectors` of the input vectors (with sub-words: each word's mean of its own
        and its n-gram rows, plus the n-gram rows for OOV words). ``meta`` holds the settings,
        per-epoch losses, ``seconds`` and ``words_per_sec`` (corpus tokens, before subsampling).
    """
    if model not in ("skipgram", "cbow"):
        raise UserError(f"model must be 'skipgram' or 'cbow', not {model!r}")
    if optimizer not in ("sgd", "sparse_adam"):
        raise UserError(f"optimizer must be 'sgd' or 'sparse_adam', not {optimizer!r}")
    if epochs < 1 or dim < 1 or window < 1 or negative < 1 or batch_size < 1:
        raise UserError("epochs, dim, window, negative and batch_size must be at least 1")
    if resume and checkpoint is None:
        raise UserError("resume needs the checkpoint folder to resume from")
    corpus = [corpus] if isinstance(corpus, (str, os.PathLike)) else list(corpus)
    is_paths = bool(corpus) and all(isinstance(c, (str, os.PathLike)) for c in corpus)

    def sentences():
        return read_corpus(corpus, lowercase) if is_paths else corpus

    words, counts = build_vocab(sentences(), min_count, max_vocab)
    if not words:
        raise UserError(f"no word occurs at least min_count={min_count} times in the corpus")
    ids, sent = _encode(sentences(), {w: i for i, w in enumerate(words)})
    vocab_size, total = len(words), len(ids)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    device = torch.device(device)
    sub_ptr = sub_rows = None
    if subwords:
        bags = [[i] + [vocab_size + b for b in ngram_buckets(w, minn, maxn, buckets)] for i, w in enumerate(words)]
        sub_ptr = np.concatenate([[0], np.cumsum([len(b) for b in bags])]).astype(np.int64)
        sub_rows = np.fromiter((r for b in bags for r in b), dtype=np.int64, count=int(sub_ptr[-1]))
    net = NegativeSamplingModel(vocab_size + (buckets if subwords else 0), vocab_size, dim).to(device)
    if lr is None:
        lr = 1e-2 if optimizer == "sparse_adam" else (0.025 if model == "skipgram" else 0.05)
    opt = torch.optim.SparseAdam(list(net.parameters()), lr=lr) if optimizer == "sparse_adam" else None
    keep, sampler = keep_probabilities(counts, subsample), UnigramSampler(counts)
    sent_starts = np.flatnonzero(np.r_[True, sent[1:] != sent[:-1]])
    cut = np.searchsorted(sent_starts, np.arange(chunk_tokens, total, chunk_tokens))
    bounds = np.unique(np.r_[0, sent_starts[cut[cut < len(sent_starts)]], total]).astype(np.int64)

    def to_dev(a):
        return None if a is None else torch.from_numpy(np.ascontiguousarray(a)).to(device)

    settings = dict(model=model, dim=dim, window=window, negative=negative, min_count=min_count, epochs=epochs,
                    subsample=subsample, subwords=subwords, minn=minn, maxn=maxn, buckets=buckets if subwords else None,
                    lr=lr, batch_size=batch_size, optimizer=optimizer, lowercase=lowercase, seed=seed)
    examples, step_lr, epoch_losses = 0, lr, []
    position = {"epoch": 0, "chunk": 0, "loss_sum": 0.0, "loss_n": 0}
    if resume:  # a run that crashed before its first checkpoint starts again
        resume = resume_or_start(checkpoint)
    if resume:
        ckpt = load_checkpoint(checkpoint)
        saved = ckpt.trainer_state
        if saved["settings"] != json.loads(json.dumps(settings)) or saved["train_tokens"] != total:
            raise UserError(f"{ckpt.folder}: cannot resume with other settings or another corpus")
        net.load_state_dict(ckpt.model_state)
        if opt is not None:
            opt.load_state_dict(ckpt.optimizer_state)
        restore_rng(ckpt.rng, {"word2vec": rng})
        examples, epoch_losses, position = saved["examples"], saved["epoch_losses"], saved["position"]

    def save(epoch: int, chunk: int, loss_sum: float, loss_n: int, **mid_chunk) -> None:
        """``mid_chunk``: ``batch`` (the next one) and ``chunk_rng`` (the generator's state when the
        chunk began, which draws its examples again on resume), for a stop inside a chunk."""
        state = {"settings": settings, "train_tokens": total, "examples": examples, "epoch_losses": epoch_losses,
                 "position": {"epoch": epoch, "chunk": chunk, "loss_sum": loss_sum, "loss_n": loss_n, **mid_chunk}}
        opt_state = None if opt is None else opt.state_dict()
        for group in opt_state["param_groups"] if opt_state else ():
            group["lr"] = float(group["lr"])  # a NumPy scalar here; weights_only loading takes plain floats
        save_checkpoint(checkpoint, model_state=net.state_dict(), optimizer_state=opt_state, trainer_state=state,
                        extra={"rng": capture_rng({"word2vec": rng})})

    done_before = position["epoch"] * total + int(bounds[position["chunk"]])  # corpus tokens of earlier calls
    start = time.perf_counter()
    bar = tqdm(total=epochs * total, unit="word", unit_scale=True, desc=model + ("+subwords" if subwords else ""),
               disable=not progress, mininterval=1.0)
    stopped = None  # where a signal stopped the run
    with _torch_threads(num_threads), bar, CallbackList(callbacks or ()) as run_log, StopSignals("batch") as signals:
        run_log.on_train_begin({"config": settings, "vocab_size": vocab_size, "train_tokens": total})
        for epoch in range(position["epoch"], epochs):
            first = position["chunk"] if epoch == position["epoch"] else 0
            loss_sum, loss_n = (position["loss_sum"], position["loss_n"]) if epoch == position["epoch"] else (0.0, 0)
            for c in range(first, len(bounds) - 1):
                lo, hi = bounds[c], bounds[c + 1]
                base = epoch * total + lo  # corpus tokens seen before this chunk, all epochs
                skip = position.get("batch", 0) if (epoch, c) == (position["epoch"], position["chunk"]) else 0
                if skip:  # resumed inside this chunk: its examples again, from the generator state it began with
                    now, rng.bit_generator.state = rng.bit_generator.state, position["chunk_rng"]
                chunk_rng = rng.bit_generator.state
                kept = rng.random(hi - lo) < keep[ids[lo:hi]]
                if model == "skipgram":
                    inputs, targets = _skipgram_examples(ids[lo:hi][kept], sent[lo:hi][kept], window, rng)
                else:
                    targets, inputs = _cbow_examples(ids[lo:hi][kept], sent[lo:hi][kept], window, rng)
                order = rng.permutation(len(targets))
                if skip:  # ... then on with the negatives where the stopped run left off
                    rng.bit_generator.state = now
                n_batches = max(1, math.ceil(len(order) / batch_size))
                for b in range(skip, n_batches):
                    # SIGTERM/SIGUSR1: stop between two batches; not before the chunk's first, whose
                    # generator state (after drawing the examples) the checkpoint does not keep.
                    if signals.received and b > skip:
                        stopped = {"reason": "signal", "epoch": epoch, "chunk": c, "batch": b,
                                   "at": f"epoch {epoch + 1}, chunk {c + 1} of {len(bounds) - 1}, batch {b + 1}"}
                        if checkpoint is not None:
                            save(epoch, c, loss_sum, loss_n, batch=b, chunk_rng=chunk_rng)
                        break
                    sel = order[b * batch_size:(b + 1) * batch_size]
                    if len(sel):  # a chunk can lose all examples, e.g. only one-word sentences left
                        rows, offsets, lengths = _bag_batch(inputs, sel, model == "cbow", sub_ptr, sub_rows)
                        batch = (to_dev(rows), to_dev(offsets), to_dev(lengths), to_dev(targets[sel].astype(np.int64)),
                                 to_dev(sampler.sample((len(sel), negative), rng)))
                        step_lr = lr * max(1e-4, 1.0 - (base + (hi - lo) * b / n_batches) / (epochs * total))
                        if opt is None:
                            loss = net.sgd_step(*batch, lr=step_lr)
                        else:
                            for group in opt.param_groups:
                                group["lr"] = step_lr
                            opt.zero_grad()
                            loss = net(*batch)
                            loss.backward()
                            opt.step()
                        loss_sum, loss_n = loss_sum + float(loss.detach()), loss_n + len(sel)
                    bar.update(base + (hi - lo) * (b + 1) // n_batches - bar.n)
                if stopped:  # inside the chunk: the rest of it is the resumed run's
                    break
                examples += len(targets)
                words_per_s = (base + hi - lo - done_before) / max(time.perf_counter() - start, 1e-9)  # bar.n stays 0 when it is off
                bar.set_postfix(loss=f"{loss_sum / max(1, loss_n):.3f}", lr=f"{step_lr:.2e}", refresh=False,
                                **{"words/s": f"{words_per_s:,.0f}"})
                run_log.on_log(int(base + hi - lo), {"epoch": epoch, "loss": loss_sum / max(1, loss_n), "lr": step_lr,
                                                     "words_per_s": round(words_per_s, 1)})
                if signals.received:  # it came during the chunk's last batch: stop at the chunk's end
                    stopped = {"reason": "signal", "epoch": epoch, "chunk": c + 1, "batch": 0,
                               "at": f"epoch {epoch + 1}, end of chunk {c + 1} of {len(bounds) - 1}"}
                if checkpoint is not None and (stopped or (c + 1) % max(1, save_every) == 0 or c + 2 == len(bounds)):
                    save(epoch, c + 1, loss_sum, loss_n)
                if stopped:
                    break
            if stopped:  # the epoch's loss is for the resumed run to finish
                break
            epoch_losses.append(round(loss_sum / max(1, loss_n), 4))
        run_log.on_train_end({"epoch_losses": epoch_losses, "seconds": round(time.perf_counter() - start, 2)})
    seconds = time.perf_counter() - start
    w_in = net.inputs.weight.detach()
    vectors, ngram_vectors = w_in, None
    if subwords:
        vectors = F.embedding_bag(to_dev(sub_rows), w_in, to_dev(sub_ptr[:-1]), mode="mean")
        ngram_vectors = w_in[vocab_size:]
    meta = dict(**settings, train_tokens=total, examples=examples, epoch_losses=epoch_losses,
                final_loss=epoch_losses[-1] if epoch_losses else None, seconds=round(seconds, 2),
                words_per_sec=round((epochs * total - done_before) / max(seconds, 1e-9), 1))
    if stopped:
        meta["stopped"] = {**stopped, "saved": checkpoint is not None}
    return WordVectors(words, vectors, counts=counts, ngram_vectors=ngram_vectors, minn=minn, maxn=maxn, meta=meta)
