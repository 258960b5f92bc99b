"""The pieces of word2vec / fastText training that :func:`ctxkit.models.static.train_word2vec` puts together.

* Corpus: :func:`build_vocab` (words over ``min_count``, most frequent first) and the
  encoding of sentences to word ids.
* Sampling: :func:`keep_probabilities` (word2vec's subsampling of frequent words) and
  :class:`UnigramSampler` (negatives drawn from the ``count ** 0.75`` distribution).
* :class:`NegativeSamplingModel`: input bags (a word or context, plus fastText n-gram
  buckets) scored against output words, with an autograd path and a closed-form SGD step.
* Examples: skip-gram pairs and CBOW contexts under word2vec's dynamic window.

The training loop itself, and :class:`~ctxkit.models.static.WordVectors` that it returns,
live in :mod:`ctxkit.models.static`, which re-exports the public names here.
"""

from __future__ import annotations

from collections import Counter
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["NegativeSamplingModel", "UnigramSampler", "build_vocab", "keep_probabilities"]


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
