"""Training static word vectors: word2vec (CBOW, skip-gram) with negative sampling, optionally
with fastText character n-grams, by batched Hogwild-style SGD in PyTorch.

:func:`train_word2vec` is the loop (epochs, chunks, batches, learning rate, checkpoints,
progress); it returns a :class:`~ctxkit.models.static.vectors.WordVectors`. Its pieces:

* Corpus: :func:`build_vocab` (words over ``min_count``, most frequent first) and the
  encoding of sentences to word ids.
* Sampling: :func:`keep_probabilities` (word2vec's subsampling of frequent words) and
  :class:`UnigramSampler` (negatives drawn from the ``count ** 0.75`` distribution).
* :class:`NegativeSamplingModel`: input bags (a word or context, plus fastText n-gram
  buckets) scored against output words, with an autograd path and a closed-form SGD step.
* Examples: skip-gram pairs and CBOW contexts under word2vec's dynamic window.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import Counter
from contextlib import contextmanager
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..core.callbacks import Callback, CallbackList
from ..core.errors import UserError
from ..core.interrupts import StopSignals, resume_or_start
from ..core.run_state import capture_rng, load_checkpoint, restore_rng, save_checkpoint
from ..models.static.vectors import WordVectors, ngram_buckets
from ..models.static.io import read_corpus

__all__ = ["NegativeSamplingModel", "UnigramSampler", "build_vocab", "keep_probabilities", "train_word2vec"]

PathLike = Union[str, os.PathLike]


# ---------------------------------------------------------------------------- corpus


def build_vocab(sentences: Iterable[Sequence[str]], min_count: int = 5,
                max_vocab: Optional[int] = None) -> Tuple[List[str], np.ndarray]:
    """Words seen at least ``min_count`` times, most frequent first (ties alphabetical), and their counts."""
    counts: Counter = Counter()
    for tokens in sentences:
        counts.update(tokens)
    items = sorted((kv for kv in counts.items() if kv[1] >= min_count), key=lambda kv: (-kv[1], kv[0]))
    items = items[:max_vocab] if max_vocab else items
    return [w for w, _ in items], np.array([c for _, c in items], dtype=np.int64)


def _encode(sentences: Iterable[Sequence[str]], index: Dict[str, int]) -> Tuple[np.ndarray, np.ndarray]:
    """``(ids, sentence_of_token)``, both ``(N,)`` int32; out-of-vocabulary tokens dropped, as word2vec does."""
    ids: List[np.ndarray] = []
    sent: List[np.ndarray] = []
    for s, tokens in enumerate(sentences):
        row = np.fromiter((index.get(t, -1) for t in tokens), dtype=np.int32, count=len(tokens))
        row = row[row >= 0]
        if len(row):
            ids.append(row)
            sent.append(np.full(len(row), s, dtype=np.int32))
    if not ids:
        return np.zeros(0, np.int32), np.zeros(0, np.int32)
    return np.concatenate(ids), np.concatenate(sent)


def keep_probabilities(counts: np.ndarray, sample: float) -> np.ndarray:
    """word2vec's chance of keeping each occurrence of a word: ``(sqrt(f / t) + 1) * t / f``, capped at 1.

    ``f`` is the word's share of the corpus and ``t`` = ``sample``. Frequent words ("the",
    ",") are mostly dropped, which speeds training and widens the effective window.
    """
    if sample <= 0:
        return np.ones(len(counts))
    freq = counts / counts.sum()
    return np.minimum(1.0, (np.sqrt(freq / sample) + 1) * sample / freq)


class UnigramSampler:
    """Draws negative words with probability proportional to ``count ** power`` (word2vec: 0.75).

    Inverse-CDF sampling gives the exact distribution without word2vec's 1e8-entry table.

    Attributes:
        probs: ``(V,)`` float64 sampling probabilities.
    """

    def __init__(self, counts: np.ndarray, power: float = 0.75):
        weights = np.asarray(counts, dtype=np.float64) ** power
        self.probs = weights / weights.sum()
        self._cdf = np.cumsum(self.probs)
        self._cdf[-1] = 1.0

    def sample(self, shape, rng: np.random.Generator) -> np.ndarray:
        """int64 word ids of the given shape."""
        return np.searchsorted(self._cdf, rng.random(shape), side="right").astype(np.int64)


# ---------------------------------------------------------------------------- model


class NegativeSamplingModel(nn.Module):
    """Input bags and output words scored by a dot product, trained with negative sampling.

    Skip-gram: the bag is the centre word (plus its n-gram buckets), the target a context
    word. CBOW: the bag is the context words (plus their n-grams), the target the centre.

    Args:
        num_inputs: Rows of the input matrix: ``V`` words, plus ``buckets`` n-gram rows.
        num_outputs: ``V`` output (context) vectors.
        dim: Vector size.
    """

    def __init__(self, num_inputs: int, num_outputs: int, dim: int):
        super().__init__()
        self.inputs = nn.EmbeddingBag(num_inputs, dim, mode="sum", sparse=True)
        self.outputs = nn.Embedding(num_outputs, dim, sparse=True)
        # word2vec's initialisation: small random inputs, zero outputs; with zero outputs every
        # score starts at 0 and the first updates are not dominated by random dot products.
        nn.init.uniform_(self.inputs.weight, -0.5 / dim, 0.5 / dim)
        nn.init.zeros_(self.outputs.weight)

    def _scores(self, hidden, targets, negatives):
        ids = torch.cat([targets.unsqueeze(1), negatives], dim=1)  # (B, 1 + K)
        out = self.outputs(ids)  # (B, 1 + K, dim)
        # A negative that happens to be the target would push the pair apart; word2vec skips it.
        valid = torch.cat([torch.ones_like(targets, dtype=torch.bool).unsqueeze(1),
                           negatives != targets.unsqueeze(1)], dim=1)
        return ids, out, torch.bmm(out, hidden.unsqueeze(2)).squeeze(2), valid

    @staticmethod
    def _loss(scores, valid):
        per = torch.cat([F.softplus(-scores[:, :1]), F.softplus(scores[:, 1:])], dim=1)  # -log sigmoid(+-s)
        return (per * valid).sum()

    def forward(self, rows, offsets, lengths, targets, negatives) -> torch.Tensor:
        """Summed negative-sampling loss of a batch (autograd path, e.g. for SparseAdam).

        Args:
            rows: ``(R,)`` input-matrix rows of all bags, concatenated.
            offsets: ``(B,)`` start of each bag in ``rows``; None when every bag is one row.
            lengths: ``(B,)`` bag sizes (ignored when ``offsets`` is None).
            targets: ``(B,)`` positive output words.
            negatives: ``(B, K)`` sampled output words.

        Returns:
            Scalar loss, summed over the batch (so an SGD step matches word2vec's per-pair step).
        """
        if offsets is None:
            hidden = self.inputs(rows.unsqueeze(1))
        else:
            summed = self.inputs(rows, offsets)
            mean = summed / lengths.unsqueeze(1).to(summed.dtype)
            # Forward value is the mean, but each bag row receives the full gradient of the
            # hidden vector, as in word2vec and fastText; plain autograd of a mean would
            # divide it by the bag size and starve n-gram rows of updates.
            hidden = summed - (summed - mean).detach()
        _, _, scores, valid = self._scores(hidden, targets, negatives)
        return self._loss(scores, valid)

    @torch.no_grad()
    def sgd_step(self, rows, offsets, lengths, targets, negatives, lr: float) -> torch.Tensor:
        """One SGD step of :meth:`forward`'s loss with closed-form gradients; returns the loss.

        Same update as ``loss.backward()`` and ``p -= lr * p.grad``, but about three times
        faster on CPU: it skips building and coalescing sparse gradient tensors.
        """
        w_in, dim = self.inputs.weight, self.inputs.embedding_dim
        if offsets is None:
            hidden = w_in.index_select(0, rows)
        else:
            hidden = F.embedding_bag(rows, w_in, offsets, mode="mean")
        ids, out, scores, valid = self._scores(hidden, targets, negatives)
        label = torch.zeros_like(scores)
        label[:, 0] = 1.0
        grad = (label - torch.sigmoid(scores)) * valid * lr  # (B, 1 + K): minus dLoss/dscore, times lr
        grad_hidden = torch.bmm(grad.unsqueeze(1), out).squeeze(1)  # uses outputs before their update
        self.outputs.weight.index_add_(0, ids.reshape(-1), (grad.unsqueeze(2) * hidden.unsqueeze(1)).view(-1, dim))
        if offsets is not None:
            grad_hidden = grad_hidden.repeat_interleave(lengths, dim=0)
        w_in.index_add_(0, rows, grad_hidden)
        return self._loss(scores, valid)


def _skipgram_examples(ids, sent, window, rng):
    """All (centre, context) pairs of a chunk under word2vec's dynamic window, ``(P,)`` each."""
    reach = rng.integers(1, window + 1, len(ids))  # each centre samples its window size, so near words count more
    centres, contexts = [], []
    for o in range(1, window + 1):
        ok = (sent[o:] == sent[:-o]) & (reach[:-o] >= o)  # centre i, context i + o
        centres.append(ids[:-o][ok])
        contexts.append(ids[o:][ok])
        ok = (sent[o:] == sent[:-o]) & (reach[o:] >= o)  # centre i + o, context i
        centres.append(ids[o:][ok])
        contexts.append(ids[:-o][ok])
    return np.concatenate(centres), np.concatenate(contexts)


def _cbow_examples(ids, sent, window, rng):
    """``(centres (P,), contexts (P, 2 * window))`` with -1 padding; centres without context dropped."""
    n = len(ids)
    reach = rng.integers(1, window + 1, n)
    ctx = np.full((n, 2 * window), -1, dtype=np.int64)
    for o in range(1, window + 1):
        ok = (sent[o:] == sent[:-o]) & (reach[:-o] >= o)
        ctx[:-o, window + o - 1] = np.where(ok, ids[o:], -1)
        ok = (sent[o:] == sent[:-o]) & (reach[o:] >= o)
        ctx[o:, window - o] = np.where(ok, ids[:-o], -1)
    has = (ctx >= 0).any(axis=1)
    return ids[has].astype(np.int64), ctx[has]


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
