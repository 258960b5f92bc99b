"""Extractive question answering (SQuAD): contexts cut into windows, logits back to answer text.

A question plus its paragraph is often longer than the model's ``max_seq_len``, so the
context is cut into overlapping windows, each packed as::

    [CLS] question [SEP] context_window [SEP]

Training labels each window with the token positions of the answer, or ``(0, 0)``
(the [CLS] token) when the answer is not fully inside that window. At prediction time
:func:`postprocess` scores candidate spans in every window of an example and maps the
best one back to the exact characters of the context through the tokens' offsets.

**``doc_stride`` is the step, not the overlap.** As in the original BERT ``run_squad.py``,
consecutive windows start ``doc_stride`` context tokens apart, so two neighbours overlap by
``budget - doc_stride`` tokens. (Hugging Face's tokenizer argument ``stride`` means the
overlap instead: BERT's ``doc_stride=128`` with a 384-token window is close to, but not
the same as, HF ``stride=128``.)

Examples are duck-typed: anything with ``qid, question, context, answers, is_impossible``
(each answer with ``text`` and ``start``, a character index into ``context``) works, e.g.
:class:`ctxkit.data.squad.QAExample`.
"""

from __future__ import annotations

import bisect
import logging
import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..core.errors import UserError

__all__ = ["QAFeature", "Prediction", "make_features", "window_starts", "postprocess"]

logger = logging.getLogger("ctxkit")
# Passed as max_length so the tokenizer never cuts: we do all cutting ourselves, visibly.
_NO_LIMIT = 10**9


@dataclass
class QAFeature:
    """One window of one example, ready for the model.

    Attributes:
        example_index: Index of the example in the list given to :func:`make_features`.
        input_ids: ``[CLS] question [SEP] context_window [SEP]`` token ids, unpadded.
        token_type_ids: 0 for ``[CLS] question [SEP]``, 1 for the window and its ``[SEP]``.
        attention_mask: All 1 (features are unpadded; batching pads).
        offsets: Per token, ``(start, end)`` character offsets into the example's
            *context* for context tokens; ``None`` for question and special tokens.
        start_position: Token index (in ``input_ids``) of the answer's first token; 0
            ([CLS]) when the answer is not fully inside this window or the question is
            unanswerable; ``None`` for unlabelled features (``train=False``).
        end_position: Likewise for the answer's last token (inclusive).
        window_index: 0 for the example's first window, 1 for the next, ...
        window_start: Index, among the context's tokens, of this window's first token.
    """

    example_index: int
    input_ids: List[int]
    token_type_ids: List[int]
    attention_mask: List[int]
    offsets: List[Optional[Tuple[int, int]]]
    start_position: Optional[int]
    end_position: Optional[int]
    window_index: int
    window_start: int

    def __len__(self) -> int:
        return len(self.input_ids)

    def as_inputs(self) -> dict:
        """The model inputs and labels as a dict for :func:`ctxkit.data.batching.collate`.

        Positions are ``None`` for unlabelled features, which ``collate`` leaves out.
        """
        return {
            "input_ids": self.input_ids, "token_type_ids": self.token_type_ids,
            "attention_mask": self.attention_mask,
            "start_positions": self.start_position, "end_positions": self.end_position,
        }


@dataclass
class Prediction:
    """The answer chosen for one question.

    Attributes:
        text: Exact characters of the context (``""`` = no answer, SQuAD 2.0).
        score: ``start_logit + end_logit`` of the chosen span, or the null score when
            ``text`` is ``""`` by the null decision; ``-inf`` when no span was valid.
        start_char: Character start of the span in the context; ``None`` for ``""``.
        end_char: Character end (exclusive); ``None`` for ``""``.
        null_score_diff: ``null_score - best_span_score`` (``+inf`` when no span was
            valid). Larger means "more likely unanswerable"; use it as the ``na_prob``
            of the SQuAD 2.0 evaluation to tune ``null_threshold`` on dev.
        nbest: ``[(text, score), ...]``, best first, when asked for (``return_nbest``);
            for SQuAD 2.0 it includes ``("", null_score)``.
    """

    text: str
    score: float
    start_char: Optional[int]
    end_char: Optional[int]
    null_score_diff: float
    nbest: Optional[List[Tuple[str, float]]] = None


def window_starts(num_tokens: int, budget: int, doc_stride: int) -> List[int]:
    """Context-token index at which each window begins.

    Windows hold up to ``budget`` tokens and start ``min(doc_stride, budget)`` apart (a
    larger step would skip tokens); the last window ends at the context's end, so it may
    be shorter, exactly as in BERT's ``run_squad.py``. An empty context gets one window.
    """
    step = min(doc_stride, budget)
    starts = [0]
    while starts[-1] + budget < num_tokens:
        starts.append(starts[-1] + step)
    return starts


def _answer_token_span(example, starts: List[int], ends: List[int]) -> Optional[Tuple[int, int]]:
    """First and last context-token index covering the first answer, or None.

    Tokens are chosen by character overlap, so an answer that begins or ends inside a
    word piece still maps to the smallest token span holding it.
    """
    if example.is_impossible or not example.answers:
        return None
    answer = example.answers[0]
    start_char, end_char = answer.start, answer.start + len(answer.text)
    first = bisect.bisect_right(ends, start_char)  # first token ending after the answer starts
    last = bisect.bisect_left(starts, end_char) - 1  # last token starting before it ends
    return (first, last) if first <= last else None


def make_features(tokenizer, examples: Sequence, max_seq_len: int = 384, doc_stride: int = 128,
                  max_query_len: int = 64, train: bool = True) -> List[QAFeature]:
    """Tokenize questions and contexts and cut each example into windows.

    Every question is tokenized once and cut to ``max_query_len`` tokens (how many were
    cut is logged); every distinct context is tokenized once, with offsets. Each window
    gets ``max_seq_len - len(question) - 3`` context tokens (three specials).

    Args:
        tokenizer: A :class:`~ctxkit.tokenizers.WordPieceTokenizer`.
        examples: SQuAD-style examples (see the module docstring).
        max_seq_len: Length of every feature at most, special tokens included.
        doc_stride: Step between window starts, in context tokens (BERT's meaning; the
            overlap is ``budget - doc_stride``).
        max_query_len: Question tokens kept, special tokens not counted.
        train: Label windows with the first answer's token positions; with ``False``
            the positions are ``None``.

    Returns:
        Features in example order, windows in context order.

    Raises:
        ValueError: Bad sizes, e.g. a (cut) question leaving no room for context.
    """
    if doc_stride < 1 or max_query_len < 1:
        raise UserError(f"doc_stride and max_query_len must be >= 1, got {doc_stride} and {max_query_len}")
    if max_seq_len < 4:
        raise UserError(f"max_seq_len={max_seq_len} leaves no room for context tokens")
    examples = list(examples)
    encode = dict(add_special_tokens=False, max_length=_NO_LIMIT, truncation=None, padding=None)
    questions = tokenizer.encode_batch([ex.question for ex in examples], **encode) if examples else []
    # Many questions share one paragraph; each distinct context is tokenized once.
    context_index: Dict[str, int] = {}
    for ex in examples:
        context_index.setdefault(ex.context, len(context_index))
    contexts = tokenizer.encode_batch(list(context_index), **encode) if context_index else []
    bounds = [([o[0] for o in c.offsets], [o[1] for o in c.offsets]) for c in contexts]

    features: List[QAFeature] = []
    n_windows: Counter = Counter()
    cut_questions = misaligned = no_tokens = clamped_step = 0
    for ex_idx, ex in enumerate(examples):
        q_ids = questions[ex_idx].input_ids
        if len(q_ids) > max_query_len:
            q_ids, cut_questions = q_ids[:max_query_len], cut_questions + 1
        budget = max_seq_len - len(q_ids) - 3
        if budget < 1:
            raise UserError(f"example {ex_idx} ({ex.qid}): max_seq_len={max_seq_len} leaves no room for context "
                             f"after a {len(q_ids)}-token question; lower max_query_len")
        clamped_step += doc_stride > budget
        c = context_index[ex.context]
        ctx, (tok_starts, tok_ends) = contexts[c], bounds[c]
        span = None
        if train:
            answer = ex.answers[0] if ex.answers and not ex.is_impossible else None
            if answer is not None and ex.context[answer.start:answer.start + len(answer.text)] != answer.text:
                misaligned += 1
            span = _answer_token_span(ex, tok_starts, tok_ends)
            no_tokens += answer is not None and span is None
        head = len(q_ids) + 2  # [CLS] q [SEP]: where context tokens begin in input_ids
        starts = window_starts(len(ctx.input_ids), budget, doc_stride)
        n_windows[len(starts)] += 1
        for w, ws in enumerate(starts):
            we = min(ws + budget, len(ctx.input_ids))
            if not train:
                s = e = None
            elif span is not None and ws <= span[0] and span[1] < we:
                s, e = span[0] - ws + head, span[1] - ws + head
            else:
                s = e = 0
            n_ctx = we - ws
            features.append(QAFeature(
                example_index=ex_idx,
                input_ids=[tokenizer.cls_id, *q_ids, tokenizer.sep_id, *ctx.input_ids[ws:we], tokenizer.sep_id],
                token_type_ids=[0] * head + [1] * (n_ctx + 1),
                attention_mask=[1] * (head + n_ctx + 1),
                offsets=[None] * head + [tuple(o) for o in ctx.offsets[ws:we]] + [None],
                start_position=s, end_position=e, window_index=w, window_start=ws,
            ))

    if cut_questions:
        logger.warning("make_features: cut %d of %d questions to max_query_len=%d tokens",
                       cut_questions, len(examples), max_query_len)
    if clamped_step:
        logger.warning("make_features: doc_stride=%d exceeds the context room of %d windows; "
                       "those step by their room instead so no token is skipped", doc_stride, clamped_step)
    if misaligned:
        logger.warning("make_features: %d answers do not match context[start:start+len(text)]; "
                       "labelled by character position anyway", misaligned)
    if no_tokens:
        logger.warning("make_features: %d answers cover no token (whitespace only?); labelled as unanswerable", no_tokens)
    if any(n > 1 for n in n_windows):
        logger.info("make_features: %d of %d examples need more than one window (windows -> examples: %s); "
                    "%d features in total", sum(v for k, v in n_windows.items() if k > 1), len(examples),
                    dict(sorted(n_windows.items())), len(features))
    return features


def _rows(logits) -> List[np.ndarray]:
    """Per-feature float64 vectors from a ``(num_features, seq)`` array/tensor or a ragged list."""
    if hasattr(logits, "detach"):  # torch, without importing it here
        logits = logits.detach().float().cpu().numpy()
    if isinstance(logits, np.ndarray):
        if logits.ndim != 2:
            raise ValueError(f"logits must be (num_features, seq), got shape {logits.shape}")
        return list(logits.astype(np.float64))
    return [np.asarray(r.detach().float().cpu().numpy() if hasattr(r, "detach") else r, dtype=np.float64) for r in logits]


def postprocess(examples: Sequence, features: Sequence[QAFeature], start_logits, end_logits=None,
                n_best: int = 20, max_answer_len: int = 30, null_threshold: Optional[float] = None,
                version_2: bool = False, return_nbest: bool = False) -> Dict[str, Prediction]:
    """Turn per-window start/end logits into one answer per question.

    For every window the ``n_best`` highest start and end logits among its context tokens
    are paired; pairs with ``start <= end`` and at most ``max_answer_len`` tokens are
    scored ``start_logit + end_logit`` and the best over all windows of the example wins.
    Drawing the candidates from context tokens only (the BERT recipe ranks all positions,
    then drops non-context ones) keeps question tokens from crowding out valid spans: the
    candidate set is a superset of the recipe's, so the chosen span never scores lower.

    SQuAD 2.0 (``version_2``): the null score is the *minimum* over windows of
    ``start_logit[CLS] + end_logit[CLS]`` (BERT's recipe: the window that best sees an
    answer decides), and ``""`` is predicted when ``null_score - best_span_score >
    null_threshold``.

    Args:
        examples: The examples given to :func:`make_features` (same list, same order).
        features: Its features.
        start_logits: ``(num_features, seq)`` numpy array or torch tensor, ``seq`` at least
            each feature's length (padding beyond it is ignored), or a list of per-feature
            vectors. With ``end_logits=None``, a list of ``(start, end)`` vector pairs (what
            :func:`ctxkit.training.trainer.predict` returns for :class:`~ctxkit.heads.span.SpanQAModel`).
        end_logits: Same shape as ``start_logits``.
        n_best: Candidates per window on each side, and length of the returned n-best lists.
        max_answer_len: Longest answer in tokens.
        null_threshold: Margin the null score must exceed to answer ``""``; default 0.0.
        version_2: Allow ``""`` answers.
        return_nbest: Fill :attr:`Prediction.nbest`.

    Returns:
        ``{qid: Prediction}``. ``{q: p.null_score_diff}`` is the ``na_probs`` input of the
        SQuAD 2.0 metric.

    Raises:
        ValueError: Logit count or lengths that do not match the features, or an example
            without features.
    """
    if end_logits is None:
        start_logits, end_logits = [p[0] for p in start_logits], [p[1] for p in start_logits]
    starts, ends = _rows(start_logits), _rows(end_logits)
    if not len(starts) == len(ends) == len(features):
        raise ValueError(f"got {len(starts)} start and {len(ends)} end logit rows for {len(features)} features")
    threshold = 0.0 if null_threshold is None else float(null_threshold)
    by_example: Dict[int, List[int]] = defaultdict(list)
    for i, f in enumerate(features):
        if not 0 <= f.example_index < len(examples):
            raise ValueError(f"feature {i} refers to example {f.example_index}; only {len(examples)} examples given")
        by_example[f.example_index].append(i)

    predictions: Dict[str, Prediction] = {}
    for ex_idx, ex in enumerate(examples):
        if ex_idx not in by_example:
            raise ValueError(f"example {ex_idx} ({ex.qid}) has no features; pass the examples given to make_features")
        null_score = math.inf
        spans: Dict[Tuple[int, int], float] = {}  # the same characters may come from several windows
        for fi in by_example[ex_idx]:
            f = features[fi]
            n = len(f.input_ids)
            s, e = starts[fi], ends[fi]
            if len(s) < n or len(e) < n:
                raise ValueError(f"feature {fi} has {n} tokens but {min(len(s), len(e))} logits")
            null_score = min(null_score, s[0] + e[0])
            ctx = np.flatnonzero([o is not None for o in f.offsets])
            top_s = ctx[np.argsort(-s[ctx], kind="stable")[:n_best]]
            top_e = ctx[np.argsort(-e[ctx], kind="stable")[:n_best]]
            i, j = np.meshgrid(top_s, top_e, indexing="ij")
            # Context tokens are contiguous, so start <= end keeps the whole span inside it.
            ok = (j >= i) & (j - i < max_answer_len)
            for a, b in zip(i[ok].tolist(), j[ok].tolist()):
                chars, score = (f.offsets[a][0], f.offsets[b][1]), float(s[a] + e[b])
                if spans.get(chars, -math.inf) < score:
                    spans[chars] = score
        ranked = sorted(spans.items(), key=lambda kv: -kv[1])
        best_score = ranked[0][1] if ranked else -math.inf
        diff = float(null_score - best_score)
        if ranked and not (version_2 and diff > threshold):
            (a, b), score = ranked[0]
            pred = Prediction(ex.context[a:b], score, a, b, diff)
        else:
            pred = Prediction("", float(null_score) if version_2 else -math.inf, None, None, diff)
        if return_nbest:
            nbest = [(ex.context[a:b], score) for (a, b), score in ranked[:n_best]]
            if version_2:
                nbest = sorted(nbest + [("", float(null_score))], key=lambda t: -t[1])[:n_best]
            pred.nbest = nbest
        predictions[ex.qid] = pred
    return predictions
