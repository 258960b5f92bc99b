"""Logit transforms shared by the plain decoding loop (:mod:`ctxkit.decoding.generate`),
the graph-captured one (:mod:`ctxkit.decoding.static_decode`) and the continuous batcher
(:func:`choose_rows`, many requests' rows at once)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["apply_repetition_penalty", "choose_rows", "filter_logits", "next_tokens"]


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


def _group_key(config) -> tuple:
    """Rows whose configs give the same key are chosen by the same batched ops."""
    if config.do_sample:
        return (True, config.repetition_penalty, config.temperature, config.top_k, config.top_p)
    return (False, config.repetition_penalty)


def choose_rows(logits: Tensor, seen: Sequence[list | None], configs: Sequence, generators: Sequence) -> Tensor:
    """:func:`next_tokens` for rows of different requests at once: row ``i`` of ``logits
    (rows, vocab)`` float gets the token ``next_tokens(logits[i:i+1], seen[i], configs[i],
    generators[i])`` gives, with a handful of batched ops per group of rows that share a
    config instead of ~6 ops per row (the continuous batcher's step: each op is a kernel
    launch, and on a GPU each gives up the GIL to the server's event loop).

    Repetition penalty, temperature, top-k, top-p and the softmax run once per group; greedy
    rows take one batched argmax; each sampled row draws from its own generator (what
    ``multinomial`` draws from it, one op per row: a request's random stream does not depend
    on its neighbours).
    Every batched op here works row by row (elementwise, or a reduction along the
    vocabulary), so on the CPU a row's values are those of the row alone (the tests compare
    them exactly). On a GPU the softmax/top-k/sort kernels are also row-wise, but their
    choice of kernel may depend on the number of rows; a last-bit difference there would
    change a sampled token only at a probability boundary.

    Args:
        logits: ``(rows, vocab)`` float.
        seen: each row's tokens so far (prompt + generated), a list of ids; read only for a
            repetition penalty (None elsewhere).
        configs: each row's :class:`~ctxkit.decoding.GenerationConfig`.
        generators: each row's ``torch.Generator`` (None: the default one).

    Returns:
        ``(rows,)`` token ids, on ``logits``'s device.
    """
    groups: dict = {}
    for i, config in enumerate(configs):
        groups.setdefault(_group_key(config), []).append(i)
    out = None if len(groups) == 1 else torch.empty(logits.size(0), dtype=torch.long, device=logits.device)
    for rows in groups.values():
        config = configs[rows[0]]
        whole = out is None  # one group: every row, in order (no gather, no scatter)
        index = None if whole else torch.tensor(rows, device=logits.device)
        part = logits if whole else logits.index_select(0, index)
        if config.repetition_penalty != 1.0:
            # Padded with each row's own first id: a repeated id gathers, and scatters back, the same value.
            width = max(len(seen[i]) for i in rows)
            ids = torch.tensor([seen[i] + [seen[i][0]] * (width - len(seen[i])) for i in rows], device=logits.device)
            part = apply_repetition_penalty(part, ids, config.repetition_penalty)
        if config.do_sample:
            probs = filter_logits(part / config.temperature, config.top_k, config.top_p).softmax(-1)
            # torch.multinomial(p, 1, generator=g) is ATen's one-sample path: argmax(p / q), q =
            # empty_like(p).exponential_(1, g). Each row's q drawn from its own generator (the
            # same numbers: same shape, dtype, device), then one divide and one argmax for all
            # rows: one op per row instead of multinomial's ~5, and none of its validity checks
            # (read back to the host: device syncs on a GPU). A torch whose multinomial draws
            # otherwise fails the CPU tests (the batched choice against next_tokens).
            noise = torch.empty_like(probs)
            for j, i in enumerate(rows):
                noise[j : j + 1].exponential_(1, generator=generators[i])
            tokens = (probs / noise).argmax(-1)
        else:
            tokens = part.argmax(-1)
        if whole:
            return tokens
        out.index_copy_(0, index, tokens)
    return out
