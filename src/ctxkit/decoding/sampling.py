"""Logit transforms shared by the plain decoding loop (:mod:`ctxkit.decoding.generate`)
and the graph-captured one (:mod:`ctxkit.decoding.static_decode`)."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["apply_repetition_penalty", "filter_logits", "next_tokens"]


def apply_repetition_penalty(logits: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """CTRL's repetition penalty on ``logits (batch, vocab)`` for the ids in ``seen (batch, n)``."""
    if penalty == 1.0:
        return logits
    picked = logits.gather(1, seen)
    picked = torch.where(picked > 0, picked / penalty, picked * penalty)
    return logits.scatter(1, seen, picked)


def filter_logits(logits: Tensor, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Set the logits of tokens outside the top-k / nucleus to -inf (``(batch, vocab)``).

    The most likely token always survives, so a row never becomes empty; tokens tied
    with the k-th logit survive top-k too.
    """
    if top_k > 0:
        kth = logits.topk(min(top_k, logits.size(-1)), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        # Drop a token when the tokens before it already reach top_p.
        drop_sorted = (cumulative - sorted_logits.softmax(-1)) >= top_p
        drop_sorted[:, 0] = False
        logits = logits.masked_fill(drop_sorted.scatter(1, order, drop_sorted), float("-inf"))
    return logits


def next_tokens(logits: Tensor, seen: Tensor, config, generator=None) -> Tensor:
    """The next token of each row: ``logits (batch, vocab)`` float, ``seen (batch, n)`` the
    tokens so far (for the repetition penalty), ``config`` a
    :class:`~ctxkit.decoding.GenerationConfig`; greedy or sampled with ``generator``.

    The plain decoding loop and the continuous batcher both choose with this, so a request
    served alone or beside others draws exactly what ``generate`` draws for it.
    """
    if config.repetition_penalty != 1.0:
        logits = apply_repetition_penalty(logits, seen, config.repetition_penalty)
    if config.do_sample:
        scores = filter_logits(logits / config.temperature, config.top_k, config.top_p)
        return torch.multinomial(scores.softmax(-1), 1, generator=generator).squeeze(1)
    return logits.argmax(-1)
