"""Evaluation metrics with the benchmarks' official semantics.

Every score is a plain Python ``float`` in **percent (0-100)**, the scale the GLUE, CoNLL
and SQuAD leaderboards print; counts (``total``, ``missing``, ...) are ``int``.

* Classification and regression (GLUE): :func:`accuracy`, :func:`f1_binary`,
  :func:`matthews_corr`, :func:`pearson_spearman`, and :func:`glue_metrics`, which picks
  them by name (:data:`GLUE_MAIN_METRIC` lists each task's official metrics).
* NER (CoNLL-2003): :func:`ner_f1`, entity-level micro P/R/F1 from ``seqeval`` in its
  default, conlleval-compatible mode.
* SQuAD v1.1: :func:`squad_v1` and the functions of the official ``evaluate-v1.1.py``
  (:func:`normalize_answer`, :func:`exact_match_score`, :func:`f1_score`,
  :func:`metric_max_over_ground_truths`), which return fractions (0-1) per answer as the
  official script does; only the aggregate is in percent.
* SQuAD v2.0: :func:`squad_v2` and the functions of the official ``evaluate-v2.0.py``
  (:func:`get_tokens`, :func:`compute_exact`, :func:`compute_f1`,
  :func:`find_best_thresh`).

SQuAD datasets may be given as the official JSON (``{"data": [...]}`` or its ``"data"``
list) or as a sequence of example objects with ``.qid`` and ``.answers`` (each answer a
string, a dict with ``"text"`` or an object with ``.text``; v2 examples may also carry
``.is_impossible``).
"""

from __future__ import annotations

import collections
import re
import string
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import numpy as np

from ..core.deps import require
from ..core.errors import UnknownNameError, UserError

__all__ = [
    "GLUE_MAIN_METRIC",
    "accuracy",
    "f1_binary",
    "matthews_corr",
    "pearson_spearman",
    "glue_metrics",
    "ner_f1",
    "normalize_answer",
    "exact_match_score",
    "f1_score",
    "metric_max_over_ground_truths",
    "squad_v1",
    "get_tokens",
    "compute_exact",
    "compute_f1",
    "find_best_thresh",
    "squad_v2",
]

# ----------------------------------------------------------------------------- GLUE

#: Official metrics of each GLUE task, in the order the leaderboard prints them.
GLUE_MAIN_METRIC: Mapping[str, Tuple[str, ...]] = {
    "CoLA": ("mcc",),
    "SST-2": ("accuracy",),
    "MRPC": ("f1", "accuracy"),
    "STS-B": ("pearson", "spearman"),
    "QQP": ("f1", "accuracy"),
    "MNLI": ("accuracy",),
    "QNLI": ("accuracy",),
    "RTE": ("accuracy",),
    "WNLI": ("accuracy",),
}


def _pair(preds: Any, labels: Any) -> Tuple[np.ndarray, np.ndarray]:
    """Both inputs as 1-D arrays of equal, non-zero length."""
    p, y = np.asarray(preds).reshape(-1), np.asarray(labels).reshape(-1)
    if p.shape != y.shape:
        raise UserError(f"preds and labels differ in length: {p.size} vs {y.size}")
    if p.size == 0:
        raise UserError("cannot score an empty set of predictions")
    return p, y


def accuracy(preds: Any, labels: Any) -> Dict[str, float]:
    """Share of predictions equal to their label.

    Args:
        preds: array-like of predicted class ids, shape ``(n,)``.
        labels: array-like of gold class ids, shape ``(n,)``.

    Returns:
        ``{"accuracy": percent}``.
    """
    p, y = _pair(preds, labels)
    return {"accuracy": 100.0 * float(np.mean(p == y))}


def f1_binary(preds: Any, labels: Any, positive: Any = 1) -> Dict[str, float]:
    """F1 of the ``positive`` class (MRPC and QQP report this).

    Args:
        preds: array-like of predicted labels, shape ``(n,)``.
        labels: array-like of gold labels, shape ``(n,)``; at most two distinct values.
        positive: the label counted as positive.

    Returns:
        ``{"f1": percent}``; 0.0 when there is no true positive (no division warning).
    """
    p, y = _pair(preds, labels)
    f1 = require("sklearn.metrics", "the F1 score").f1_score(y, p, pos_label=positive, average="binary", zero_division=0)
    return {"f1": 100.0 * float(f1)}


def matthews_corr(preds: Any, labels: Any) -> Dict[str, float]:
    """Matthews correlation coefficient (CoLA), via scikit-learn.

    Args:
        preds: array-like of predicted labels, shape ``(n,)``.
        labels: array-like of gold labels, shape ``(n,)``.

    Returns:
        ``{"mcc": percent}`` in [-100, 100]; a constant predictor scores 0.0, as in
        scikit-learn.
    """
    p, y = _pair(preds, labels)
    return {"mcc": 100.0 * float(require("sklearn.metrics", "the Matthews correlation").matthews_corrcoef(y, p))}


def pearson_spearman(preds: Any, labels: Any) -> Dict[str, float]:
    """Pearson and Spearman correlation (STS-B), via SciPy.

    A correlation with a constant series is undefined (SciPy returns NaN and warns); this
    function returns 0.0 instead, so a collapsed regressor scores like an uninformative one
    and never propagates NaN into model selection.

    Args:
        preds: array-like of predicted scores, shape ``(n,)``.
        labels: array-like of gold scores, shape ``(n,)``.

    Returns:
        ``{"pearson", "spearman", "corr"}`` in percent, ``corr`` being their mean.

    Raises:
        ValueError: on lengths that differ, empty input, or non-finite values.
    """
    p, y = _pair(preds, labels)
    p, y = p.astype(np.float64), y.astype(np.float64)
    if not (np.isfinite(p).all() and np.isfinite(y).all()):
        raise UserError("pearson_spearman got NaN or infinite values")
    if np.ptp(p) == 0 or np.ptp(y) == 0:
        pearson = spearman = 0.0
    else:
        stats = require("scipy.stats", "Pearson/Spearman correlation")
        pearson = float(stats.pearsonr(p, y)[0])
        spearman = float(stats.spearmanr(p, y)[0])
    pearson, spearman = 100.0 * pearson, 100.0 * spearman
    return {"pearson": pearson, "spearman": spearman, "corr": (pearson + spearman) / 2}


_GLUE_FUNCS: Mapping[str, Callable[[Any, Any], Dict[str, float]]] = {
    "accuracy": accuracy,
    "f1": f1_binary,
    "mcc": matthews_corr,
}


def glue_metrics(task_metric_names: Union[str, Sequence[str]], preds: Any, labels: Any) -> Dict[str, float]:
    """Score predictions with the named metrics.

    Args:
        task_metric_names: metric names among ``"accuracy"``, ``"f1"``, ``"mcc"``,
            ``"pearson"``, ``"spearman"``; or a GLUE task name (a key of
            :data:`GLUE_MAIN_METRIC`), which stands for that task's metrics.
        preds: array-like predictions, shape ``(n,)`` (class ids, or scores for STS-B).
        labels: array-like gold labels, shape ``(n,)``.

    Returns:
        One key per requested name, in percent; when both ``"pearson"`` and
        ``"spearman"`` are asked for, ``"corr"`` (their mean) is added as well.

    Raises:
        KeyError: for an unknown metric name.
    """
    if isinstance(task_metric_names, str):
        names = GLUE_MAIN_METRIC.get(task_metric_names, (task_metric_names,))
    else:
        names = tuple(task_metric_names)
    unknown = [n for n in names if n not in _GLUE_FUNCS and n not in ("pearson", "spearman")]
    if unknown:
        raise UnknownNameError(f"unknown GLUE metric(s) {unknown}; known: accuracy, f1, mcc, pearson, spearman")
    out: Dict[str, float] = {}
    for name in names:
        if name in _GLUE_FUNCS:
            out.update(_GLUE_FUNCS[name](preds, labels))
    corr_names = [n for n in names if n in ("pearson", "spearman")]
    if corr_names:
        corr = pearson_spearman(preds, labels)
        out.update({n: corr[n] for n in corr_names})
        if len(set(corr_names)) == 2:
            out["corr"] = corr["corr"]
    return out


# ------------------------------------------------------------------------------ NER


def ner_f1(true_tag_seqs: Sequence[Sequence[str]], pred_tag_seqs: Sequence[Sequence[str]]) -> Dict[str, Any]:
    """Entity-level micro precision/recall/F1, as conlleval computes them.

    Uses ``seqeval`` in its default mode, which reproduces conlleval's chunking: an
    ``I-X`` after ``O`` or after another type opens a new entity, and an entity counts as
    correct only if both its span and type match exactly (a wrong boundary is one false
    positive and one false negative).

    Args:
        true_tag_seqs: gold BIO tags, one list per sentence, e.g. ``[["B-PER", "O"]]``.
        pred_tag_seqs: predicted tags, same shape.

    Returns:
        ``{"precision", "recall", "f1"}`` in percent, and ``"per_type_f1"``: a dict from
        entity type (``"PER"``, ...) to its F1 in percent, for every type that occurs in
        either gold or predictions. Undefined ratios (no entities) are 0.0.

    Raises:
        ValueError: if the sentence counts or lengths differ.
    """
    y_true, y_pred = [list(s) for s in true_tag_seqs], [list(s) for s in pred_tag_seqs]
    if len(y_true) != len(y_pred) or any(len(t) != len(p) for t, p in zip(y_true, y_pred)):
        raise UserError("true_tag_seqs and pred_tag_seqs must have the same sentences and lengths")
    seqeval = require("seqeval.metrics.sequence_labeling", "the CoNLL entity F1")
    get_entities, precision_recall_fscore_support = seqeval.get_entities, seqeval.precision_recall_fscore_support
    precision, recall, f1, _ = precision_recall_fscore_support(y_true, y_pred, average="micro", zero_division=0)
    # seqeval orders per-type results by sorted type name; rebuild the same list to label them.
    types = sorted({e[0] for e in get_entities(y_true)} | {e[0] for e in get_entities(y_pred)})
    per_type = {}
    if types:
        _, _, type_f1, _ = precision_recall_fscore_support(y_true, y_pred, average=None, zero_division=0)
        per_type = {t: 100.0 * float(v) for t, v in zip(types, type_f1)}
    return {
        "precision": 100.0 * float(precision),
        "recall": 100.0 * float(recall),
        "f1": 100.0 * float(f1),
        "per_type_f1": per_type,
    }


# ------------------------------------------------------------------------ SQuAD v1.1
# The functions below follow the official evaluate-v1.1.py line by line; keep them that way.
# (One exception: remove_punc deletes the official set of characters with str.translate, the
# same result for every str as its per-character loop, checked on all SQuAD v1.1 dev texts.)


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_NO_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(s: str) -> str:
    """Lower text and remove punctuation, articles and extra whitespace (official order).

    The official script's steps; its per-character test against ``set(string.punctuation)``
    is done by one ``str.translate`` that deletes the same characters (a SQuAD evaluation
    normalises every gold answer several times, and this was most of its time)."""

    def remove_articles(text: str) -> str:
        return _ARTICLES.sub(" ", text)

    def white_space_fix(text: str) -> str:
        return " ".join(text.split())

    def remove_punc(text: str) -> str:
        return text.translate(_NO_PUNCTUATION)

    return white_space_fix(remove_articles(remove_punc(s.lower())))


def exact_match_score(prediction: str, ground_truth: str) -> float:
    """1.0 if the normalised strings are equal, else 0.0 (v1.1)."""
    return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def _token_f1(prediction_tokens: List[str], ground_truth_tokens: List[str]) -> float:
    """Token-level F1 from the multiset overlap, 0-1: the arithmetic both official scripts share.

    Args:
        prediction_tokens: the predicted answer's normalised tokens.
        ground_truth_tokens: the gold answer's normalised tokens.

    Returns:
        The harmonic mean of precision and recall, or 0.0 when no token is shared (which
        includes either side being empty, so nothing is divided by zero).
    """
    common = collections.Counter(prediction_tokens) & collections.Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    # The official scripts' exact expressions, so that scores match them to the bit.
    precision = 1.0 * num_same / len(prediction_tokens)
    recall = 1.0 * num_same / len(ground_truth_tokens)
    return (2 * precision * recall) / (precision + recall)


def f1_score(prediction: str, ground_truth: str) -> float:
    """Token-level F1 of normalised answers with multiset overlap, 0-1 (v1.1).

    As in the official v1.1 script, two answers that both normalise to nothing score 0.
    """
    return _token_f1(normalize_answer(prediction).split(), normalize_answer(ground_truth).split())


def metric_max_over_ground_truths(
    metric_fn: Callable[[str, str], float], prediction: str, ground_truths: Iterable[str]
) -> float:
    """Best ``metric_fn(prediction, gold)`` over the gold answers."""
    return max(metric_fn(prediction, gt) for gt in ground_truths)


def _answer_text(answer: Any) -> str:
    if isinstance(answer, str):
        return answer
    if isinstance(answer, Mapping):
        return answer["text"]
    return answer.text


def _iter_questions(dataset: Any) -> Iterable[Tuple[str, List[str], bool]]:
    """Yield ``(qid, gold answer texts, has_answer)`` in dataset order.

    ``has_answer`` follows the official v2 script (``bool(qa["answers"])``); an example
    object with ``is_impossible`` set has no gold answers whatever its ``answers`` hold,
    since the official JSON keeps plausible answers of such questions elsewhere.
    """
    if isinstance(dataset, Mapping):
        dataset = dataset["data"]
    for item in dataset:
        if isinstance(item, Mapping) and "paragraphs" in item:
            for paragraph in item["paragraphs"]:
                for qa in paragraph["qas"]:
                    texts = [_answer_text(a) for a in qa["answers"]]
                    yield qa["id"], texts, bool(texts)
        elif isinstance(item, Mapping):
            texts = [] if item.get("is_impossible", False) else [_answer_text(a) for a in item["answers"]]
            yield item["id"], texts, bool(texts)
        else:
            texts = [] if getattr(item, "is_impossible", False) else [_answer_text(a) for a in item.answers]
            yield item.qid, texts, bool(texts)


def squad_v1(predictions: Mapping[str, str], dataset: Any) -> Dict[str, Union[float, int]]:
    """SQuAD v1.1 exact match and F1, as the official ``evaluate-v1.1.py``.

    Args:
        predictions: question id -> predicted answer text.
        dataset: official JSON (dict with ``"data"`` or its article list) or example
            objects with ``.qid`` and ``.answers``.

    Returns:
        ``{"exact_match", "f1"}`` in percent over all questions, ``"total"`` questions and
        ``"missing"``: questions without a prediction, which score 0 (the official script
        prints a message for each and scores it 0).

    Raises:
        ValueError: for an empty dataset or a question without gold answers.
    """
    exact_match = f1 = 0.0
    total = missing = 0
    for qid, ground_truths, _ in _iter_questions(dataset):
        total += 1
        if qid not in predictions:
            missing += 1
            continue
        if not ground_truths:
            raise UserError(f"question {qid!r} has no gold answer; SQuAD v1.1 needs at least one")
        prediction = predictions[qid]
        exact_match += metric_max_over_ground_truths(exact_match_score, prediction, ground_truths)
        f1 += metric_max_over_ground_truths(f1_score, prediction, ground_truths)
    if total == 0:
        raise UserError("the dataset holds no questions")
    return {"exact_match": 100.0 * exact_match / total, "f1": 100.0 * f1 / total, "total": total, "missing": missing}


# ------------------------------------------------------------------------ SQuAD v2.0
# Following the official evaluate-v2.0.py; its normalize_answer is the v1.1 one above.


def get_tokens(s: str) -> List[str]:
    """Normalised tokens of ``s`` (empty list for an empty string)."""
    if not s:
        return []
    return normalize_answer(s).split()


def compute_exact(a_gold: str, a_pred: str) -> int:
    """1 if the normalised answers are equal, else 0 (v2.0; note the gold-first order)."""
    return int(normalize_answer(a_gold) == normalize_answer(a_pred))


def compute_f1(a_gold: str, a_pred: str) -> float:
    """Token-level F1, 0-1 (v2.0): if either side has no tokens, 1 if both have none, else 0."""
    gold_toks = get_tokens(a_gold)
    pred_toks = get_tokens(a_pred)
    # v2.0's rule for no-answer questions (unlike v1.1): an empty prediction for an empty
    # gold answer is right; checked first, as the official script does.
    if len(gold_toks) == 0 or len(pred_toks) == 0:
        return float(gold_toks == pred_toks)
    return _token_f1(pred_toks, gold_toks)


def _best_thresh_count(
    preds: Mapping[str, str],
    scores: Mapping[str, float],
    na_probs: Mapping[str, float],
    qid_to_has_ans: Mapping[str, bool],
) -> Tuple[float, float]:
    """Official ``find_best_thresh`` before dividing by the number of scored questions.

    Starts as if every question were answered empty (all no-answer questions right), then
    lowers the bar question by question in increasing ``na_prob`` (a stable sort, so ties
    keep ``na_probs``' order) and keeps the first strictly best running score.
    """
    num_no_ans = sum(1 for k in qid_to_has_ans if not qid_to_has_ans[k])
    cur_score = best_score = float(num_no_ans)
    best_thresh = 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in scores:
            continue
        if qid_to_has_ans[qid]:
            diff = scores[qid]
        else:
            diff = -1 if preds[qid] else 0
        cur_score += diff
        if cur_score > best_score:
            best_score = cur_score
            best_thresh = na_probs[qid]
    return best_score, float(best_thresh)


def find_best_thresh(
    preds: Mapping[str, str],
    scores: Mapping[str, float],
    na_probs: Mapping[str, float],
    qid_to_has_ans: Mapping[str, bool],
) -> Tuple[float, float]:
    """Best score (percent) over no-answer thresholds and the threshold reaching it.

    Same arguments and result as the official ``find_best_thresh``: ``scores`` are raw
    per-question scores (0-1) before any threshold.
    """
    best_score, best_thresh = _best_thresh_count(preds, scores, na_probs, qid_to_has_ans)
    return 100.0 * best_score / len(scores), best_thresh


def squad_v2(
    predictions: Mapping[str, str],
    dataset: Any,
    na_probs: Optional[Mapping[str, float]] = None,
    na_prob_thresh: float = 1.0,
) -> Dict[str, Union[float, int]]:
    """SQuAD v2.0 exact match and F1 with no-answer questions, as ``evaluate-v2.0.py``.

    Gold answers that normalise to nothing are dropped; a question left without any has
    the single gold answer ``""``, which only an empty prediction matches. A prediction
    whose ``na_probs[qid] > na_prob_thresh`` is replaced by "no answer" before scoring.

    Deviation from the official script, which only handles complete predictions: a
    question without a prediction scores 0 in every total (never the threshold's "no
    answer") and is counted in ``"missing"``. With complete predictions the numbers equal
    the official ones.

    Args:
        predictions: question id -> predicted text (``""`` for "no answer").
        dataset: official JSON (dict with ``"data"`` or its article list) or example
            objects with ``.qid``, ``.answers`` and ``.is_impossible``.
        na_probs: optional question id -> no-answer probability (any score where higher
            means "more likely unanswerable"); needed for every predicted question.
        na_prob_thresh: threshold applied to ``na_probs``.

    Returns:
        ``exact``, ``f1`` (percent), ``total``, ``missing``; ``HasAns_exact``,
        ``HasAns_f1``, ``HasAns_total`` and the same for ``NoAns`` (the official script
        omits a group with no questions; here its scores are 0.0 and its total 0). With
        ``na_probs``: ``best_exact``, ``best_exact_thresh``, ``best_f1``,
        ``best_f1_thresh``, from the official threshold search.

    Raises:
        ValueError: for an empty dataset, or ``na_probs`` lacking a predicted question.
    """
    qid_to_has_ans: Dict[str, bool] = {}
    exact_raw: Dict[str, float] = {}
    f1_raw: Dict[str, float] = {}
    for qid, texts, has_ans in _iter_questions(dataset):
        qid_to_has_ans[qid] = has_ans
        if qid not in predictions:
            continue
        gold_answers = [t for t in texts if normalize_answer(t)] or [""]
        a_pred = predictions[qid]
        exact_raw[qid] = max(compute_exact(a, a_pred) for a in gold_answers)
        f1_raw[qid] = max(compute_f1(a, a_pred) for a in gold_answers)
    if not qid_to_has_ans:
        raise UserError("the dataset holds no questions")
    if na_probs is not None:
        lacking = [q for q in exact_raw if q not in na_probs]
        if lacking:
            raise UserError(f"na_probs lacks {len(lacking)} predicted question(s), e.g. {lacking[0]!r}")
    probs = na_probs if na_probs is not None else {}

    def thresholded(scores: Dict[str, float]) -> Dict[str, float]:
        return {
            q: float(not qid_to_has_ans[q]) if probs.get(q, 0.0) > na_prob_thresh else float(s)
            for q, s in scores.items()
        }

    exact_t, f1_t = thresholded(exact_raw), thresholded(f1_raw)

    def group(qids: List[str]) -> Tuple[float, float, int]:
        if not qids:
            return 0.0, 0.0, 0
        n = len(qids)
        em = 100.0 * sum(exact_t.get(q, 0.0) for q in qids) / n
        f1 = 100.0 * sum(f1_t.get(q, 0.0) for q in qids) / n
        return em, f1, n

    all_qids = list(qid_to_has_ans)
    out: Dict[str, Union[float, int]] = {}
    out["exact"], out["f1"], out["total"] = group(all_qids)
    out["missing"] = len(all_qids) - len(exact_raw)
    for prefix, want in (("HasAns", True), ("NoAns", False)):
        em, f1, n = group([q for q in all_qids if qid_to_has_ans[q] is want])
        out[f"{prefix}_exact"], out[f"{prefix}_f1"], out[f"{prefix}_total"] = em, f1, n
    if na_probs is not None:
        # Only predicted questions take part, so a missing one cannot be rescued by "no answer".
        answered = {q: qid_to_has_ans[q] for q in exact_raw}
        total = len(all_qids)
        for name, raw in (("exact", exact_raw), ("f1", f1_raw)):
            best, thresh = _best_thresh_count(predictions, raw, na_probs, answered)
            out[f"best_{name}"] = 100.0 * best / total
            out[f"best_{name}_thresh"] = thresh
    return out
