"""Metrics against hand-computed cases, the official SQuAD scripts and the real dev sets."""

import collections
import json
import random
import re
import string
import warnings
import zipfile
from types import SimpleNamespace as NS

import numpy as np
import pytest

from ctxkit.tasks import metrics as M

# --------------------------------------------------------------------- classification

# preds  1 0 1 1 0 1
# labels 1 0 0 1 1 1
# -> TP 3 (pos 0,3,5), TN 1 (pos 1), FP 1 (pos 2), FN 1 (pos 4)
PREDS = [1, 0, 1, 1, 0, 1]
LABELS = [1, 0, 0, 1, 1, 1]


def test_accuracy_hand():
    assert M.accuracy(PREDS, LABELS) == {"accuracy": pytest.approx(100 * 4 / 6)}
    assert M.accuracy(np.array(LABELS), np.array(LABELS))["accuracy"] == 100.0


def test_f1_binary_hand():
    # class 1: P = 3/4, R = 3/4 -> F1 0.75
    assert M.f1_binary(PREDS, LABELS) == {"f1": pytest.approx(75.0)}
    # class 0: TP 1 (pos 1), FP 1 (pos 4), FN 1 (pos 2) -> 2*1 / (2*1 + 1 + 1) = 0.5
    assert M.f1_binary(PREDS, LABELS, positive=0)["f1"] == pytest.approx(50.0)
    # never predicting the positive class: no TP -> 0, without a warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert M.f1_binary([0] * 6, LABELS)["f1"] == 0.0


def test_matthews_hand_and_constant():
    # (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (3 - 1) / sqrt(4*4*2*2) = 0.25
    out = M.matthews_corr(PREDS, LABELS)
    assert out == {"mcc": pytest.approx(25.0)}
    assert isinstance(out["mcc"], float)
    assert M.matthews_corr([1 - y for y in LABELS], LABELS)["mcc"] == pytest.approx(-100.0)
    assert M.matthews_corr([1] * 6, LABELS)["mcc"] == 0.0


def test_length_mismatch_and_empty_raise():
    with pytest.raises(ValueError):
        M.accuracy([1, 0], [1])
    with pytest.raises(ValueError):
        M.matthews_corr([], [])


def test_pearson_spearman_hand_with_ties():
    x, y = [1, 2, 2, 10], [1, 2, 3, 4]
    # Pearson: mean x 3.75, dx = -2.75 -1.75 -1.75 6.25; dy = -1.5 -0.5 0.5 1.5
    # sum dx*dy = 4.125 + 0.875 - 0.875 + 9.375 = 13.5; sum dx^2 = 52.75; sum dy^2 = 5
    pearson = 13.5 / np.sqrt(52.75 * 5)
    # Spearman with tied (average) ranks: rx = 1 2.5 2.5 4, ry = 1 2 3 4, both mean 2.5
    # sum drx*dry = 2.25 + 0 + 0 + 2.25 = 4.5; sum drx^2 = 4.5; sum dry^2 = 5 -> sqrt(0.9).
    # (The no-ties formula 1 - 6*sum d^2 / (n(n^2-1)) would give 0.95 instead.)
    spearman = np.sqrt(0.9)
    out = M.pearson_spearman(x, y)
    assert out["pearson"] == pytest.approx(100 * pearson)
    assert out["spearman"] == pytest.approx(100 * spearman)
    assert out["spearman"] != pytest.approx(95.0)
    assert out["corr"] == pytest.approx(50 * (pearson + spearman))
    assert all(type(v) is float for v in out.values())


def test_pearson_spearman_constant_is_zero_not_nan():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = M.pearson_spearman([3.0, 3.0, 3.0], [1.0, 2.0, 5.0])
        assert out == {"pearson": 0.0, "spearman": 0.0, "corr": 0.0}
        assert M.pearson_spearman([1.0, 2.0], [4.0, 4.0])["pearson"] == 0.0
    with pytest.raises(ValueError):
        M.pearson_spearman([1.0, float("nan")], [1.0, 2.0])


def test_glue_metric_table_and_dispatch():
    assert dict(M.GLUE_MAIN_METRIC) == {
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
    assert M.glue_metrics(["f1", "accuracy"], PREDS, LABELS) == pytest.approx({"f1": 75.0, "accuracy": 100 * 4 / 6})
    assert M.glue_metrics("MRPC", PREDS, LABELS) == M.glue_metrics(["f1", "accuracy"], PREDS, LABELS)
    assert M.glue_metrics("CoLA", PREDS, LABELS) == {"mcc": pytest.approx(25.0)}
    sts = M.glue_metrics("STS-B", [1, 2, 2, 10], [1, 2, 3, 4])
    assert sts == pytest.approx(M.pearson_spearman([1, 2, 2, 10], [1, 2, 3, 4]))
    assert set(M.glue_metrics(["spearman"], [1, 2, 3], [1, 3, 2])) == {"spearman"}
    with pytest.raises(KeyError):
        M.glue_metrics(["auc"], PREDS, LABELS)


# ------------------------------------------------------------------------------- NER


def test_ner_f1_hand():
    true = [
        ["B-PER", "I-PER", "O", "B-LOC"],  # PER(0-1), LOC(3) at sentence end
        ["B-ORG", "I-ORG", "O"],  # ORG(0-1)
        ["O", "B-PER", "I-PER"],  # PER(1-2) at sentence end
        ["O", "B-LOC"],  # LOC(1) at sentence end...
        ["B-LOC", "O"],  # ...and a new LOC at the start of the next sentence
        ["O", "O"],
    ]
    pred = [
        ["B-PER", "O", "O", "B-LOC"],  # PER(0) wrong boundary: FP + FN; LOC right
        ["B-MISC", "I-MISC", "O"],  # right span, wrong type: FP MISC + FN ORG
        ["O", "I-PER", "I-PER"],  # I- after O opens an entity (conlleval): PER(1-2) right
        ["O", "B-LOC"],  # right
        ["I-LOC", "O"],  # right: sentences do not run into each other
        ["B-PER", "O"],  # spurious: FP
    ]
    # gold 6 entities, predicted 7, correct 4 (LOC, PER, LOC, LOC)
    # P = 4/7, R = 4/6, F = 2*4 / (7 + 6) = 8/13
    out = M.ner_f1(true, pred)
    assert out["precision"] == pytest.approx(100 * 4 / 7)
    assert out["recall"] == pytest.approx(100 * 4 / 6)
    assert out["f1"] == pytest.approx(100 * 8 / 13)
    # PER: gold 2, pred 3, correct 1 -> 2/(3+2); LOC 3/3/3; ORG gold only; MISC predicted only
    assert out["per_type_f1"] == pytest.approx({"PER": 40.0, "LOC": 100.0, "ORG": 0.0, "MISC": 0.0})


def test_ner_f1_perfect_empty_and_mismatch():
    tags = [["B-PER", "I-PER", "O"], ["B-LOC"]]
    assert M.ner_f1(tags, tags) == {"precision": 100.0, "recall": 100.0, "f1": 100.0,
                                   "per_type_f1": {"LOC": 100.0, "PER": 100.0}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert M.ner_f1([["O"]], [["O"]]) == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "per_type_f1": {}}
    with pytest.raises(ValueError):
        M.ner_f1([["O", "O"]], [["O"]])


# ------------------------------------------------------------------------ SQuAD v1.1


@pytest.mark.parametrize(
    "raw, norm",
    [
        ("The  Cat!", "cat"),
        ("an apple a day", "apple day"),
        ("U.S.", "us"),
        ("theatre", "theatre"),
        ("The theatre, an Area", "theatre area"),
        # punctuation goes before articles (official order): "the-cat" -> "thecat", not "cat"
        ("the-cat", "thecat"),
        ("  \tA\n", ""),
    ],
)
def test_normalize_answer(raw, norm):
    assert M.normalize_answer(raw) == norm


def test_em_f1_hand():
    assert M.exact_match_score("The Cat!", "cat") == 1.0
    assert M.exact_match_score("cat sat", "cat") == 0.0
    # "the cat sat" -> [cat, sat]; "cat sat down" -> [cat, sat, down]; overlap 2
    # P = 2/2, R = 2/3, F1 = 2 * 1 * 2/3 / (1 + 2/3) = 0.8
    assert M.f1_score("the cat sat", "cat sat down") == pytest.approx(0.8)
    # multiset overlap: min(3, 1) = 1 -> P 1/3, R 1 -> F1 0.5
    assert M.f1_score("cat cat cat", "cat") == pytest.approx(0.5)
    assert M.f1_score("dog", "cat") == 0.0
    # official v1.1 quirk: two answers normalising to nothing match exactly but have F1 0
    assert M.exact_match_score("the", ".") == 1.0 and M.f1_score("the", ".") == 0.0
    # vs "Broncos": P 1/2, R 1 -> 2/3; vs "Denver Broncos team": P 1, R 2/3 -> 0.8
    golds = ["Broncos", "Denver Broncos team"]
    assert M.metric_max_over_ground_truths(M.f1_score, "Denver Broncos", golds) == pytest.approx(0.8)
    assert M.metric_max_over_ground_truths(M.exact_match_score, "Denver Broncos", golds) == 0.0
    assert M.metric_max_over_ground_truths(M.exact_match_score, "the broncos", golds) == 1.0


def _v1_objects():
    ans = lambda *ts: [NS(text=t) for t in ts]  # noqa: E731
    return [
        NS(qid="a", answers=ans("Paris", "paris, France")),
        NS(qid="b", answers=ans("cat sat down")),
        NS(qid="c", answers=ans("42")),
    ]


def test_squad_v1_small_objects_and_json_agree():
    preds = {"a": "the Paris", "b": "the cat sat"}  # "c" is missing
    # EM: 1 + 0 + 0 (missing) over 3; F1: 1 + 0.8 + 0 over 3
    expected = {"exact_match": pytest.approx(100 / 3), "f1": pytest.approx(60.0), "total": 3, "missing": 1}
    assert M.squad_v1(preds, _v1_objects()) == expected
    as_json = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": "...", "qas": [
        {"id": ex.qid, "question": "?", "answers": [{"text": a.text, "answer_start": 0} for a in ex.answers]}
        for ex in _v1_objects()]}]}]}
    assert M.squad_v1(preds, as_json) == expected
    assert M.squad_v1(preds, as_json["data"]) == expected


# ------------------------------------------------------------------------ SQuAD v2.0


def test_v2_token_scores():
    assert M.get_tokens("") == [] and M.get_tokens("The Big, cat") == ["big", "cat"]
    assert M.compute_exact("", "") == 1 and M.compute_exact("Paris", "the paris.") == 1
    assert M.compute_f1("", "") == 1.0
    assert M.compute_f1("", "London") == 0.0 and M.compute_f1("London", "") == 0.0
    # both normalise to nothing: unlike v1.1, F1 is 1
    assert M.compute_f1("the", ".") == 1.0
    assert M.compute_f1("cat sat down", "the cat sat") == pytest.approx(0.8)


def _v2_examples():
    ans = lambda *ts: [NS(text=t) for t in ts]  # noqa: E731
    return [
        NS(qid="q1", answers=ans("Paris"), is_impossible=False),
        NS(qid="q2", answers=ans("blue whale", "the blue whale"), is_impossible=False),
        NS(qid="q3", answers=[], is_impossible=True),
        # a plausible answer on an impossible question is not a gold answer
        NS(qid="q4", answers=ans("London"), is_impossible=True),
    ]


PREDS_V2 = {"q1": "Paris", "q2": "whale", "q3": "", "q4": "London"}


def test_squad_v2_split_and_no_answer_scoring():
    out = M.squad_v2(PREDS_V2, _v2_examples())
    # q1 1/1, q2 EM 0 / F1 (P 1, R 1/2) 2/3, q3 empty on impossible 1/1, q4 non-empty on impossible 0/0
    assert out == pytest.approx({
        "exact": 50.0, "f1": 100 * (1 + 2 / 3 + 1) / 4, "total": 4, "missing": 0,
        "HasAns_exact": 50.0, "HasAns_f1": 100 * (1 + 2 / 3) / 2, "HasAns_total": 2,
        "NoAns_exact": 50.0, "NoAns_f1": 50.0, "NoAns_total": 2,
    })
    # a missing prediction scores 0 and is counted
    partial = M.squad_v2({"q1": "Paris", "q3": ""}, _v2_examples())
    assert partial["missing"] == 2 and partial["exact"] == 50.0 and partial["NoAns_exact"] == 50.0


def test_squad_v2_gold_normalising_to_empty_is_no_answer():
    # official: such gold answers are dropped and [""] remains, although the question counts as HasAns
    ds = [{"id": "x", "answers": [{"text": "The"}]},
          {"id": "y", "answers": [{"text": "the", "answer_start": 0}, {"text": "cat"}]}]
    out = M.squad_v2({"x": "", "y": "cat"}, ds)
    assert out["exact"] == 100.0 and out["HasAns_total"] == 2 and out["NoAns_total"] == 0


def test_squad_v2_threshold_application():
    na = {"q1": 0.2, "q2": 0.9, "q3": 0.8, "q4": 0.95}
    # thresh 0.85: q2 (answerable) and q4 (impossible) are blanked -> q2 scores 0, q4 scores 1
    out = M.squad_v2(PREDS_V2, _v2_examples(), na_probs=na, na_prob_thresh=0.85)
    assert (out["exact"], out["f1"]) == (75.0, 75.0)
    assert (out["HasAns_f1"], out["NoAns_exact"]) == (50.0, 100.0)
    # only strictly above the threshold: q2 at 0.9 keeps its answer, q4 is blanked
    out = M.squad_v2(PREDS_V2, _v2_examples(), na_probs=na, na_prob_thresh=0.9)
    assert out["exact"] == 75.0 and out["f1"] == pytest.approx(100 * (1 + 2 / 3 + 1 + 1) / 4)
    with pytest.raises(ValueError):
        M.squad_v2(PREDS_V2, _v2_examples(), na_probs={"q1": 0.0})


def test_squad_v2_best_threshold_hand():
    na = {"q1": 0.2, "q2": 0.9, "q3": 0.8, "q4": 0.95}
    out = M.squad_v2(PREDS_V2, _v2_examples(), na_probs=na)
    # start: 2 no-answer questions right; walk q1 (0.2), q3 (0.8), q2 (0.9), q4 (0.95)
    # exact: +1 -> 3 (best, 0.2); +0 -> 3; +0 -> 3; -1 -> 2      => 75, thresh 0.2
    # f1:    +1 -> 3 (best, 0.2); +0 -> 3; +2/3 -> 11/3 (best, 0.9); -1 -> 8/3 => 91.67, 0.9
    assert out["best_exact"] == 75.0 and out["best_exact_thresh"] == 0.2
    assert out["best_f1"] == pytest.approx(100 * (11 / 3) / 4) and out["best_f1_thresh"] == 0.9
    # nothing beats answering nothing: best stays the no-answer count, thresh 0.0
    wrong = dict(PREDS_V2, q1="Rome", q2="shark")
    out = M.squad_v2(wrong, _v2_examples(), na_probs=na)
    assert (out["best_exact"], out["best_exact_thresh"], out["best_f1"], out["best_f1_thresh"]) == (50.0, 0.0, 50.0, 0.0)


def test_find_best_thresh_ties_follow_na_probs_order():
    ds = [NS(qid="a", answers=[NS(text="x")]), NS(qid="b", answers=[], is_impossible=True)]
    preds = {"a": "x", "b": "y"}
    # equal na_probs keep their dict order (stable sort). Start 1 (b counted right).
    # b first: -1 -> 0, +1 -> 1, not above 1 => 1/2, thresh 0.0
    out = M.squad_v2(preds, ds, na_probs={"b": 0.5, "a": 0.5})
    assert (out["best_exact"], out["best_exact_thresh"]) == (50.0, 0.0)
    # a first: +1 -> 2 (best, 0.5), -1 -> 1 => 2/2, thresh 0.5 (the official optimism on ties)
    out = M.squad_v2(preds, ds, na_probs={"a": 0.5, "b": 0.5})
    assert (out["best_exact"], out["best_exact_thresh"]) == (100.0, 0.5)
    assert M.find_best_thresh(preds, {"a": 1, "b": 0}, {"a": 0.5, "b": 0.5}, {"a": True, "b": False}) == (100.0, 0.5)


# ------------------------------------------------------------------------- real data


@pytest.fixture(scope="module")
def squad1(shared_data):
    with zipfile.ZipFile(shared_data / "squad_v1.1" / "dev-v1.1.json.zip") as zf:
        return json.loads(zf.read("dev-v1.1.json"))


@pytest.fixture(scope="module")
def squad2(shared_data):
    return json.loads((shared_data / "squad_v2.0_cs224n" / "dev-v2.0.json").read_text(encoding="utf-8"))


def _qas(dataset):
    return [qa for article in dataset["data"] for p in article["paragraphs"] for qa in p["qas"]]


def test_squad_v1_real_dev(squad1):
    qas = _qas(squad1)
    assert len(qas) == 10570
    gold = {qa["id"]: qa["answers"][0]["text"] for qa in qas}
    assert M.squad_v1(gold, squad1) == {"exact_match": 100.0, "f1": 100.0, "total": 10570, "missing": 0}

    # Empty predictions: EM is not quite 0, because three questions have "." among their gold
    # answers, which normalises to "" (the official script scores these EM 1, F1 0).
    empty = M.squad_v1({q: "" for q in gold}, squad1)
    dot_golds = [qa["id"] for qa in qas if any(not M.normalize_answer(a["text"]) for a in qa["answers"])]
    assert len(dot_golds) == 3
    assert empty["exact_match"] == pytest.approx(100 * 3 / 10570) and empty["f1"] == 0.0

    first_word = {qa["id"]: qa["answers"][0]["text"].split()[0] for qa in qas}
    out = M.squad_v1(first_word, squad1)
    assert 0.0 < out["f1"] < 100.0
    per_q = [M.metric_max_over_ground_truths(M.f1_score, first_word[qa["id"]], [a["text"] for a in qa["answers"]])
             for qa in qas]
    assert out["f1"] == pytest.approx(100 * sum(per_q) / len(per_q), rel=1e-12)

    dropped = dict(gold)
    del dropped[qas[0]["id"]]
    assert M.squad_v1(dropped, squad1) == pytest.approx(
        {"exact_match": 100 * 10569 / 10570, "f1": 100 * 10569 / 10570, "total": 10570, "missing": 1})


def test_squad_v2_real_dev_empty_predictions(squad2):
    qas = _qas(squad2)
    out = M.squad_v2({qa["id"]: "" for qa in qas}, squad2)
    assert out["total"] == 6078 and out["NoAns_total"] == 3168 and out["HasAns_total"] == 2910
    assert out["exact"] == pytest.approx(100 * 3168 / 6078) and out["f1"] == pytest.approx(100 * 3168 / 6078)
    assert (out["HasAns_exact"], out["NoAns_exact"]) == (0.0, 100.0)
    # the same questions as example objects give the same numbers
    objs = [NS(qid=qa["id"], answers=[NS(text=a["text"]) for a in qa["answers"]],
               is_impossible=qa["is_impossible"]) for qa in qas]
    assert M.squad_v2({qa["id"]: "" for qa in qas}, objs) == out


# Transcription of the official evaluate-v2.0.py scoring path (without I/O and plots), kept
# only as an oracle for the test below.
def _official_v2(dataset, preds, na_probs, na_prob_thresh):
    def normalize_answer(s):
        def remove_articles(text):
            return re.sub(re.compile(r"\b(a|an|the)\b", re.UNICODE), " ", text)

        def white_space_fix(text):
            return " ".join(text.split())

        def remove_punc(text):
            exclude = set(string.punctuation)
            return "".join(ch for ch in text if ch not in exclude)

        return white_space_fix(remove_articles(remove_punc(s.lower())))

    def get_tokens(s):
        return [] if not s else normalize_answer(s).split()

    def compute_f1(a_gold, a_pred):
        gold_toks, pred_toks = get_tokens(a_gold), get_tokens(a_pred)
        common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
        num_same = sum(common.values())
        if len(gold_toks) == 0 or len(pred_toks) == 0:
            return int(gold_toks == pred_toks)
        if num_same == 0:
            return 0
        precision, recall = 1.0 * num_same / len(pred_toks), 1.0 * num_same / len(gold_toks)
        return (2 * precision * recall) / (precision + recall)

    qid_to_has_ans = {qa["id"]: bool(qa["answers"]) for qa in _qas({"data": dataset})}
    exact_raw, f1_raw = {}, {}
    for qa in _qas({"data": dataset}):
        golds = [a["text"] for a in qa["answers"] if normalize_answer(a["text"])] or [""]
        exact_raw[qa["id"]] = max(int(normalize_answer(a) == normalize_answer(preds[qa["id"]])) for a in golds)
        f1_raw[qa["id"]] = max(compute_f1(a, preds[qa["id"]]) for a in golds)

    def apply(scores):
        return {q: float(not qid_to_has_ans[q]) if na_probs[q] > na_prob_thresh else s for q, s in scores.items()}

    def make(ex, f1, qids):
        return {"exact": 100.0 * sum(ex[k] for k in qids) / len(qids),
                "f1": 100.0 * sum(f1[k] for k in qids) / len(qids), "total": len(qids)}

    def find_best_thresh(scores):
        cur_score = best_score = sum(1 for k in qid_to_has_ans if not qid_to_has_ans[k])
        best_thresh = 0.0
        for qid in sorted(na_probs, key=lambda k: na_probs[k]):
            if qid not in scores:
                continue
            diff = scores[qid] if qid_to_has_ans[qid] else (-1 if preds[qid] else 0)
            cur_score += diff
            if cur_score > best_score:
                best_score, best_thresh = cur_score, na_probs[qid]
        return 100.0 * best_score / len(scores), best_thresh

    ex_t, f1_t = apply(exact_raw), apply(f1_raw)
    out = make(ex_t, f1_t, list(exact_raw))
    for prefix, want in (("HasAns", True), ("NoAns", False)):
        for k, v in make(ex_t, f1_t, [q for q, h in qid_to_has_ans.items() if h == want]).items():
            out[f"{prefix}_{k}"] = v
    out["best_exact"], out["best_exact_thresh"] = find_best_thresh(exact_raw)
    out["best_f1"], out["best_f1_thresh"] = find_best_thresh(f1_raw)
    return out


def test_squad_v2_real_dev_matches_official_script(squad2):
    rng = random.Random(0)
    preds, na = {}, {}
    for article in squad2["data"]:
        for p in article["paragraphs"]:
            words = p["context"].split()
            for qa in p["qas"]:
                gold = qa["answers"][0]["text"] if qa["answers"] else ""
                preds[qa["id"]] = rng.choice([gold, "", " ".join(gold.split()[:1]), " ".join(rng.sample(words, 3))])
                na[qa["id"]] = round(rng.random(), 1)  # coarse values: many ties in the threshold search
    ours = M.squad_v2(preds, squad2, na_probs=na, na_prob_thresh=0.5)
    ref = _official_v2(squad2["data"], preds, na, 0.5)
    assert 0 < ours["exact"] < ours["f1"] < 100 and ours["best_f1"] > ours["f1"]
    assert ours.pop("missing") == 0
    assert ours == ref  # exact equality, float for float
