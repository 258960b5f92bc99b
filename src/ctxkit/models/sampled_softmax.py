"""Sampled softmax for large output vocabularies, as TensorFlow's ``sampled_softmax_loss``
with its default log-uniform, unique candidate sampler (Jean et al. 2015).

Used to train :class:`~ctxkit.models.elmo.model.ElmoLanguageModel`; evaluation uses the full softmax.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["sampled_softmax_nll"]


@functools.lru_cache(maxsize=16)
def _sampler_tries(vocab: int, num_samples: int) -> int:
    """Draws from the log-uniform law whose expected number of distinct ids is ``num_samples``."""
    q = torch.log1p(1.0 / (torch.arange(vocab, dtype=torch.float64) + 1.0)) / math.log(vocab + 1)
    lo, hi = float(num_samples), float(num_samples)
    while float((-torch.expm1(hi * torch.log1p(-q))).sum()) < num_samples:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if float((-torch.expm1(mid * torch.log1p(-q))).sum()) < num_samples else (lo, mid)
    return max(1, round(hi))


def sampled_softmax_nll(hidden: Tensor, targets: Tensor, weight: Tensor, bias: Tensor, num_samples: int) -> Tensor:
    """Sampled-softmax loss as TF's ``sampled_softmax_loss`` computes it (Jean et al. 2015).

    Negative candidates are the distinct ids among ``n`` draws from the log-uniform
    (Zipfian) law ``Q(k) = log((k + 2) / (k + 1)) / log(V + 1)``, which suits ids sorted
    by descending frequency; ``n`` is chosen so that about ``num_samples`` ids are
    distinct (TF draws until it has exactly that many). Every logit, the target's
    included, is corrected by ``log P(k is a candidate) = log(1 - (1 - Q(k))^n)``, and
    candidates equal to a row's target are removed. Frequent words are then almost
    always candidates with almost no correction, i.e. treated exactly. The value is a
    training loss, lower than the full-softmax NLL; evaluate with the full softmax.

    Args:
        hidden: ``(n_rows, dim)``.
        targets: ``(n_rows,)`` ids.
        weight: ``(vocab, dim)`` output embeddings; bias ``(vocab,)``.
        num_samples: expected distinct negatives per batch (shared by all rows).

    Returns:
        ``(n_rows,)`` float32.
    """
    vocab = weight.shape[0]
    tries = _sampler_tries(vocab, num_samples)
    log_range = math.log(vocab + 1)
    draws = (torch.exp(torch.rand(tries, device=hidden.device) * log_range).floor().long() - 1).clamp_(0, vocab - 1)
    sampled = torch.unique(draws)

    def log_inclusion(ids: Tensor) -> Tensor:
        q = torch.log1p(1.0 / (ids.float() + 1.0)) / log_range
        return torch.log(-torch.expm1(tries * torch.log1p(-q)))

    true_logits = (hidden * weight[targets]).sum(-1).float() + bias[targets].float() - log_inclusion(targets)
    sampled_logits = F.linear(hidden, weight[sampled], bias[sampled]).float() - log_inclusion(sampled)
    sampled_logits = sampled_logits.masked_fill(sampled[None, :] == targets[:, None], float("-inf"))
    logits = torch.cat([true_logits[:, None], sampled_logits], dim=1)
    return torch.logsumexp(logits, dim=1) - true_logits
