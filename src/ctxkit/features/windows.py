"""Long texts as overlapping windows of ``max_length`` tokens: the layout, the forward passes
(one batch at a time, as a generator, so a caller can stop or interleave between them), and
pooled vectors kept per window as the windows come out of the model.

:func:`ctxkit.features.embed.embed` is built on these; the server (``ctxkit serve``'s
``/embed``) lays out a request's windows first (:func:`plan_text`), to refuse one over its
work budget before any compute, then runs them one forward pass at a time on its model
thread, so that one request's windows never hold the thread for long.
"""

from __future__ import annotations

import logging
import math
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from tqdm.auto import tqdm

from ..core.errors import UserError

logger = logging.getLogger("ctxkit")

__all__ = ["Plan", "WindowPooled", "assign_windows", "combine_layers", "plan_text", "token_features", "window_batches",
           "window_starts"]


@dataclass
class Plan:
    """Tokenization and window layout of one text."""

    ids: List[int]
    word_ids: List[Optional[int]]
    offsets: List[Tuple[int, int]]
    windows: List[Tuple[int, int]]  # token ranges [start, end) fed to the model
    n_keep: int  # tokens kept (less than len(ids) only when truncating)
    truncated_words: int = 0
    features: List[Optional[np.ndarray]] = field(default_factory=list)


def window_starts(n_tokens: int, window: int, stride: int) -> List[int]:
    """Start offsets of overlapping windows covering ``n_tokens`` sub-words.

    Args:
        n_tokens: Sub-words in the text (without [CLS]/[SEP]).
        window: Sub-words per window.
        stride: Overlap between consecutive windows, capped at ``window // 2`` so
            each window moves forward by at least half its length.

    Returns:
        Increasing starts; the last window ends exactly at ``n_tokens``.
    """
    if n_tokens <= window:
        return [0]
    overlap = max(0, min(stride, window // 2))
    step = window - overlap
    starts = list(range(0, n_tokens - window, step))
    starts.append(n_tokens - window)
    return starts


def assign_windows(n_tokens: int, windows: Sequence[Tuple[int, int]]) -> np.ndarray:
    """Picks, for each token, the window where it sits farthest from an edge.

    A window edge that is also the text's own start or end is not an edge (the token
    has all the context there is on that side). Ties go to the earlier window.

    Returns:
        int array ``(n_tokens,)`` of window indices.
    """
    best = np.full(n_tokens, -1.0)
    owner = np.zeros(n_tokens, dtype=np.int64)
    for w, (s, e) in enumerate(windows):
        pos = np.arange(s, e)
        left = (pos - s).astype(float) if s > 0 else np.full(len(pos), math.inf)
        right = (e - 1 - pos).astype(float) if e < n_tokens else np.full(len(pos), math.inf)
        score = np.minimum(left, right)
        better = score > best[s:e]
        best[s:e][better] = score[better]
        owner[s:e][better] = w
    return owner


def plan_text(index: int, text: str, tokenizer: Any, window: int, stride: int, long_inputs: str) -> Plan:
    """Tokenize ``text`` and lay out its windows (``long_inputs``: ``window``, ``truncate`` or ``error``)."""
    # Every sub-word covers at least one character, so len(text) bounds the count:
    # this asks the tokenizer for the whole text, never a silently truncated one.
    try:
        enc = tokenizer.encode(text, max_length=len(text) + 2, truncation="error", add_special_tokens=False)
    except ValueError as exc:
        raise UserError(f"text {index}: {exc}") from None
    ids, word_ids, offsets = list(enc.input_ids), list(enc.word_ids), [tuple(o) for o in enc.offsets]
    n = len(ids)
    if n <= window:
        return Plan(ids, word_ids, offsets, [(0, n)], n)
    if long_inputs == "error":
        raise UserError(
            f"text {index} has {n} sub-word tokens, more than the limit of {window} "
            f"(max_length {window + 2} minus [CLS] and [SEP]); use long_inputs='window' or 'truncate'"
        )
    if long_inputs == "truncate":
        # A word split by the cut is dropped whole: half a word's sub-words would give
        # a vector unlike any the model makes for the full word.
        cut_word = word_ids[window]
        n_keep = window
        while n_keep > 0 and word_ids[n_keep - 1] == cut_word:
            n_keep -= 1
        dropped = len({w for w in word_ids[n_keep:] if w is not None})
        logger.warning(
            "text %d: %d sub-word tokens exceed the limit of %d; truncated, dropping %d words",
            index, n, window, dropped,
        )
        return Plan(ids, word_ids, offsets, [(0, window)], n_keep, dropped)
    starts = window_starts(n, window, stride)
    logger.warning(
        "text %d: %d sub-word tokens exceed the limit of %d; split into %d overlapping windows",
        index, n, window, len(starts),
    )
    return Plan(ids, word_ids, offsets, [(s, s + window) for s in starts], n)


def combine_layers(hidden_states: Sequence[torch.Tensor], indices: List[int], mode: str) -> torch.Tensor:
    """``(batch, seq, hidden)`` states -> ``(batch, seq, dim)`` features."""
    picked = [hidden_states[i] for i in indices]
    if len(picked) == 1:
        return picked[0]
    if mode == "sum":
        return torch.stack(picked, dim=0).sum(dim=0)
    return torch.cat(picked, dim=-1)


def window_batches(net: torch.nn.Module, tokenizer: Any, plans: List[Plan], indices: List[int], mode: str, batch_size: int,
                   keep: Callable[[int, int, np.ndarray], None], progress: bool = False) -> Iterator[int]:
    """Run every window of ``plans`` through ``net``, ``batch_size`` windows per forward pass,
    handing each window's features to ``keep(plan, window, features)``; yields after each pass
    (how many windows it ran), so the caller decides what happens between passes.

    Each feature array is ``(window_len + 2, dim)`` float32, row 0 = [CLS], last row = [SEP].
    """
    jobs = [(p, w) for p, plan in enumerate(plans) for w in range(len(plan.windows))]
    # Longest first, so each batch pads to a similar length and memory peaks early.
    jobs.sort(key=lambda j: plans[j[0]].windows[j[1]][1] - plans[j[0]].windows[j[1]][0], reverse=True)
    try:
        dev = next(net.parameters()).device
    except StopIteration:
        dev = torch.device("cpu")
    cls_id, sep_id, pad_id = tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id
    batches = [jobs[i : i + batch_size] for i in range(0, len(jobs), batch_size)]
    bar = tqdm(batches, desc="embed", unit="batch", disable=not progress, file=sys.stderr)
    for batch in bar:
        seqs = []
        for p, w in batch:
            s, e = plans[p].windows[w]
            seqs.append([cls_id] + plans[p].ids[s:e] + [sep_id])
        width = max(len(q) for q in seqs)
        input_ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for r, q in enumerate(seqs):
            input_ids[r, : len(q)] = torch.tensor(q, dtype=torch.long)
            mask[r, : len(q)] = 1
        with torch.inference_mode():  # per pass: a generator's caller runs other code between them
            out = net(
                input_ids.to(dev),
                token_type_ids=torch.zeros_like(input_ids).to(dev),
                attention_mask=mask.to(dev),
                output_hidden_states=True,
            )
            feats = combine_layers(out.hidden_states, indices, mode).float().cpu().numpy()
        del out  # every layer's states of the batch: not kept past the pass
        for r, (p, w) in enumerate(batch):
            keep(p, w, np.ascontiguousarray(feats[r, : len(seqs[r])]))
        yield len(batch)


def token_features(plan: Plan) -> np.ndarray:
    """Stitches window features into one ``(n_keep, dim)`` array of content tokens."""
    if len(plan.windows) == 1:
        return plan.features[0][1 : 1 + plan.n_keep]
    n = len(plan.ids)
    owner = assign_windows(n, plan.windows)
    dim = plan.features[0].shape[1]
    out = np.empty((n, dim), dtype=np.float32)
    for w, (s, _e) in enumerate(plan.windows):
        rows = np.nonzero(owner == w)[0]
        out[rows] = plan.features[w][1 + rows - s]
    return out


class WindowPooled:
    """One vector per text, pooled from each window's features as the window comes out of
    the model: a long text's windows are never all held at once (a 10,000-token text has 26
    windows of 512 x hidden floats, where its vector is one).

    ``"cls"``: the mean of the windows' [CLS] vectors. ``"mean"``: the mean over the text's
    tokens, each token taken once, from the window where it sits farthest from an edge
    (:func:`assign_windows`); a text without tokens gets the mean of its [CLS] and [SEP] vectors.

    Args:
        plans: the texts' layouts.
        pooling: ``"cls"`` or ``"mean"``.
    """

    def __init__(self, plans: List[Plan], pooling: str):
        self.plans, self.pooling = plans, pooling
        # Per text, per window (in window order, whatever order they are run in): a [CLS]
        # vector, a text's whole mean, or a float64 sum over the tokens the window owns.
        self.parts: List[List[Optional[np.ndarray]]] = [[None] * len(p.windows) for p in plans]
        self._owner: dict = {}

    def keep(self, p: int, w: int, feats: np.ndarray) -> None:
        """``feats``: window ``w`` of text ``p`` (a :func:`window_batches` ``keep``)."""
        plan = self.plans[p]
        if self.pooling == "cls":
            self.parts[p][w] = feats[0].copy()
        elif plan.n_keep == 0:  # no real tokens: the documented fallback, [CLS] and [SEP]
            self.parts[p][w] = feats.mean(axis=0)
        elif len(plan.windows) == 1:
            self.parts[p][w] = feats[1 : 1 + plan.n_keep].mean(axis=0)
        else:
            owner = self._owner.get(p)
            if owner is None:
                owner = self._owner[p] = assign_windows(len(plan.ids), plan.windows)
            rows = np.nonzero(owner == w)[0]
            self.parts[p][w] = feats[1 + rows - plan.windows[w][0]].sum(axis=0, dtype=np.float64)
            if all(part is not None for part in self.parts[p]):
                del self._owner[p]

    def result(self) -> np.ndarray:
        """``(n_texts, dim)`` float32, once every window has been kept."""
        rows = []
        for plan, parts in zip(self.plans, self.parts):
            if self.pooling == "cls" or len(parts) == 1:
                rows.append(np.mean(parts, axis=0).astype(np.float32) if len(parts) > 1 else parts[0].astype(np.float32))
            else:
                rows.append((np.sum(parts, axis=0) / len(plan.ids)).astype(np.float32))
        return np.stack(rows) if rows else np.zeros((0, 0), np.float32)
