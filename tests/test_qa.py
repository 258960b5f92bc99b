"""Extractive QA: windows over real SQuAD contexts, oracle postprocessing, the span head."""

import json
import logging
import math
import zipfile
from collections import defaultdict

import numpy as np
import pytest
import torch

from ctxkit.core.checkpoint import CheckpointError
from ctxkit.data.qa import make_features, postprocess, window_starts
from ctxkit.heads.span import SpanHead, SpanQAModel, span_head_from_hf, span_loss
from ctxkit.models import load_bert
from ctxkit.tokenizers import WordPieceTokenizer
from tolerance import assert_close_to_reference, assert_same_function, float64

from ctxkit.data.squad import Answer, QAExample

MAX_LEN, STRIDE, N_QUESTIONS = 128, 32, 300


def _read_squad(doc, limit):
    out = []
    for article in doc["data"]:
        for para in article["paragraphs"]:
            for q in para["qas"]:
                answers = [Answer(a["text"], a["answer_start"]) for a in q["answers"]]
                out.append(QAExample(q["id"], article["title"], q["question"], para["context"], answers, q.get("is_impossible", False)))
                if len(out) == limit:
                    return out
    return out


@pytest.fixture(scope="module")
def tok(minilm_dir):
    return WordPieceTokenizer.from_dir(minilm_dir)


@pytest.fixture(scope="module")
def squad(shared_data):
    with zipfile.ZipFile(shared_data / "squad_v1.1" / "dev-v1.1.json.zip") as z:
        return _read_squad(json.loads(z.read("dev-v1.1.json")), N_QUESTIONS)


@pytest.fixture(scope="module")
def feats(tok, squad):
    return make_features(tok, squad, max_seq_len=MAX_LEN, doc_stride=STRIDE)


def _by_example(features):
    groups = defaultdict(list)
    for f in features:
        groups[f.example_index].append(f)
    return groups


def _window_chars(f):
    ctx = [o for o in f.offsets if o is not None]
    return ctx[0][0], ctx[-1][1]


def _contains(f, answer):
    lo, hi = _window_chars(f)
    return lo <= answer.start and answer.start + len(answer.text) <= hi


def _context_offsets(tok, context):
    return tok.encode(context, add_special_tokens=False, max_length=10**6, truncation=None).offsets


# --------------------------------------------------------------------------- windows


def _check_labels(squad, feats):
    """Assert the label of every window; return (exact, mid_token, inside, outside) window counts."""
    exact = mid_token = inside = outside = 0
    for f in feats:
        ex = squad[f.example_index]
        answer = ex.answers[0]
        a_start, a_end = answer.start, answer.start + len(answer.text)
        if not _contains(f, answer):
            assert (f.start_position, f.end_position) == (0, 0)
            outside += 1
            continue
        inside += 1
        s, e = f.start_position, f.end_position
        assert 0 < s <= e < len(f) and f.offsets[s] is not None and f.offsets[e] is not None
        text = ex.context[f.offsets[s][0]:f.offsets[e][1]]
        if text == answer.text:
            exact += 1
            continue
        # Only an answer boundary inside a word piece may widen the span, and then to the
        # smallest token span holding the answer.
        assert f.offsets[s][0] < a_start or f.offsets[e][1] > a_end, (text, answer.text)
        assert f.offsets[s][0] <= a_start < f.offsets[s][1] and f.offsets[e][0] < a_end <= f.offsets[e][1]
        assert "".join(answer.text.split()) in "".join(text.split())
        mid_token += 1
    return exact, mid_token, inside, outside


def test_window_labels_reproduce_the_answer_text(squad, feats):
    exact, mid_token, inside, outside = _check_labels(squad, feats)
    assert inside > 200 and outside > 300, "the windowing must actually split contexts"
    # The Super Bowl article opening dev v1.1 has 10 annotations such as "8" inside "20–18"
    # or "gold" inside "golden"; no tokenization can reproduce those exactly.
    assert mid_token / inside <= 0.05


def test_labels_are_exact_for_99_percent_of_all_dev_answers(tok, shared_data):
    with zipfile.ZipFile(shared_data / "squad_v1.1" / "dev-v1.1.json.zip") as z:
        every = _read_squad(json.loads(z.read("dev-v1.1.json")), None)
    assert len(every) == 10570
    exact, mid_token, inside, outside = _check_labels(every, make_features(tok, every))
    assert inside >= len(every) and outside > 0
    assert exact / inside >= 0.99 and mid_token == inside - exact


def test_each_example_has_a_window_with_its_answer(tok, squad, feats):
    for idx, windows in _by_example(feats).items():
        ex = squad[idx]
        answer = ex.answers[0]
        if any(_contains(f, answer) for f in windows):
            assert any(f.start_position > 0 for f in windows)
            continue
        a_end = answer.start + len(answer.text)
        n_answer = sum(1 for a, b in _context_offsets(tok, ex.context) if b > answer.start and a < a_end)
        budget = MAX_LEN - (len(windows[0]) - len([o for o in windows[0].offsets if o is not None]))
        assert n_answer > budget, f"{ex.qid}: answer of {n_answer} tokens fits a window but none holds it"
    assert len(_by_example(feats)) == len(squad)


def test_windows_cover_the_context_and_step_by_doc_stride(tok, squad, feats):
    assert max(len(f) for f in feats) <= MAX_LEN
    n_multi = 0
    for idx, windows in _by_example(feats).items():
        ex = squad[idx]
        full = [tuple(o) for o in _context_offsets(tok, ex.context)]
        q_len = len(tok.encode(ex.question, add_special_tokens=False).input_ids)
        covered = set()
        for w, f in enumerate(windows):
            assert f.window_index == w and f.window_start == STRIDE * w  # doc_stride = step
            ctx = [o for o in f.offsets if o is not None]
            assert ctx == full[f.window_start:f.window_start + len(ctx)]
            assert f.input_ids[0] == tok.cls_id and f.input_ids[q_len + 1] == tok.sep_id and f.input_ids[-1] == tok.sep_id
            assert f.token_type_ids == [0] * (q_len + 2) + [1] * (len(ctx) + 1)
            assert f.attention_mask == [1] * len(f)
            assert f.offsets[:q_len + 2] == [None] * (q_len + 2) and f.offsets[-1] is None
            if w < len(windows) - 1:
                assert len(f) == MAX_LEN  # only the last window may be short
            covered.update(range(f.window_start, f.window_start + len(ctx)))
        assert covered == set(range(len(full)))
        assert windows[-1].window_start + len([o for o in windows[-1].offsets if o is not None]) == len(full)
        n_multi += len(windows) > 1
    assert n_multi > 100


def test_window_starts_follow_bert_doc_stride():
    assert window_starts(10, 4, 3) == [0, 3, 6]  # 6 + 4 reaches the end
    assert window_starts(4, 4, 3) == [0]
    assert window_starts(0, 4, 3) == [0]
    assert window_starts(10, 4, 9) == [0, 4, 8]  # a step past the window would skip tokens


def test_long_questions_are_cut_and_counted(tok, squad, caplog):
    exs = squad[:40]
    n_long = sum(len(tok.encode(ex.question, add_special_tokens=False).input_ids) > 10 for ex in exs)
    assert 0 < n_long < len(exs)
    with caplog.at_level(logging.INFO, logger="ctxkit"):
        features = make_features(tok, exs, max_seq_len=MAX_LEN, doc_stride=STRIDE, max_query_len=10)
    assert f"cut {n_long} of {len(exs)} questions to max_query_len=10" in caplog.text
    assert "need more than one window" in caplog.text
    assert max(f.token_type_ids.count(0) for f in features) == 10 + 2
    assert max(len(f) for f in features) <= MAX_LEN


def test_unanswerable_questions_are_labelled_cls(tok, shared_data):
    exs = _read_squad(json.loads((shared_data / "squad_v2.0_cs224n" / "dev-v2.0.json").read_text(encoding="utf-8")), 150)
    impossible = {i for i, ex in enumerate(exs) if ex.is_impossible}
    assert 30 < len(impossible) < 120
    features = make_features(tok, exs, max_seq_len=MAX_LEN, doc_stride=STRIDE)
    for idx, windows in _by_example(features).items():
        labels = [(f.start_position, f.end_position) for f in windows]
        if idx in impossible:
            assert labels == [(0, 0)] * len(windows)
        else:
            assert any(s > 0 for s, _ in labels)
    unlabelled = make_features(tok, exs[:5], max_seq_len=MAX_LEN, doc_stride=STRIDE, train=False)
    assert all(f.start_position is None and f.end_position is None for f in unlabelled)


# --------------------------------------------------------------------------- postprocess


def _oracle_logits(feats, chosen, seq=MAX_LEN + 7, seed=0):
    """Small noise everywhere (beyond each feature's length too), 10 at the gold tokens of ``chosen`` windows."""
    rng = np.random.default_rng(seed)
    start, end = rng.normal(0, 0.1, (len(feats), seq)), rng.normal(0, 0.1, (len(feats), seq))
    for i in chosen:
        start[i, feats[i].start_position] = end[i, feats[i].end_position] = 10.0
    return start.astype(np.float32), end.astype(np.float32)


def _gold_windows(feats):
    """Index of the first window holding each example's answer."""
    first = {}
    for i, f in enumerate(feats):
        if f.start_position > 0:
            first.setdefault(f.example_index, i)
    return first


def test_postprocess_with_oracle_logits_recovers_gold_answers(squad, feats):
    gold = _gold_windows(feats)
    start, end = _oracle_logits(feats, gold.values())
    as_arrays = postprocess(squad, feats, start, end)
    as_tensors = postprocess(squad, feats, torch.from_numpy(start), torch.from_numpy(end), return_nbest=True)
    ragged = postprocess(squad, feats, [(s[:len(f)], e[:len(f)]) for s, e, f in zip(start, end, feats)])
    exact = 0
    for idx, i in gold.items():
        ex, f = squad[idx], feats[i]
        want = (f.offsets[f.start_position][0], f.offsets[f.end_position][1])
        for preds in (as_arrays, as_tensors, ragged):
            p = preds[ex.qid]
            assert (p.start_char, p.end_char) == want and p.text == ex.context[want[0]:want[1]]
            assert p.score > 19.0
        assert as_tensors[ex.qid].nbest[0] == (as_tensors[ex.qid].text, pytest.approx(as_tensors[ex.qid].score))
        assert len(as_tensors[ex.qid].nbest) == 20
        # The gold text itself wherever the label reproduces it (all but the mid-token answers).
        assert (as_arrays[ex.qid].text == ex.answers[0].text) == (ex.context[want[0]:want[1]] == ex.answers[0].text)
        exact += as_arrays[ex.qid].text == ex.answers[0].text
    assert len(gold) == len(squad) and exact / len(gold) >= 0.95


def test_postprocess_respects_max_answer_len(tok, squad, feats):
    gold = _gold_windows(feats)
    long = {idx: i for idx, i in gold.items() if feats[i].end_position - feats[i].start_position + 1 >= 3}
    assert len(long) > 50
    start, end = _oracle_logits(feats, long.values())
    fits = postprocess(squad, feats, start, end, max_answer_len=30)
    limited = postprocess(squad, feats, start, end, max_answer_len=2)
    for idx, i in long.items():
        f, qid = feats[i], squad[idx].qid
        gold_chars = (f.offsets[f.start_position][0], f.offsets[f.end_position][1])
        assert (fits[qid].start_char, fits[qid].end_char) == gold_chars
        p = limited[qid]
        assert (p.start_char, p.end_char) != gold_chars and p.score < 19.0
        n_tokens = sum(1 for a, b in _context_offsets(tok, squad[idx].context) if b > p.start_char and a < p.end_char)
        assert 1 <= n_tokens <= 2


def test_postprocess_v2_null_answer_and_threshold(tok):
    ex = QAExample("q1", "t", "Who won?", "The Denver Broncos won the game. " * 12, [Answer("Denver Broncos", 4)])
    feats = make_features(tok, [ex], max_seq_len=64, doc_stride=32)
    assert len(feats) >= 2
    start, end = np.zeros((len(feats), 64)), np.zeros((len(feats), 64))
    f = feats[0]
    start[0, f.start_position], end[0, f.end_position] = 2.5, 2.5  # best span: 5.0
    start[0, 0] = end[0, 0] = 3.0  # null 6.0 in the window holding the answer
    start[1:, 0] = end[1:, 0] = 4.0  # null 8.0 elsewhere: the minimum (6.0) counts
    null = postprocess([ex], feats, start, end, version_2=True, return_nbest=True)["q1"]
    assert null.text == "" and null.start_char is None and null.score == pytest.approx(6.0)
    assert null.null_score_diff == pytest.approx(1.0)
    assert null.nbest[0] == ("", pytest.approx(6.0)) and null.nbest[1] == ("Denver Broncos", pytest.approx(5.0))
    span = postprocess([ex], feats, start, end, version_2=True, null_threshold=1.5)["q1"]
    assert span.text == "Denver Broncos" and span.score == pytest.approx(5.0) and span.null_score_diff == pytest.approx(1.0)
    assert postprocess([ex], feats, start, end)["q1"].text == "Denver Broncos"  # v1 never answers ""
    start[1, 0] = end[1, 0] = 2.0  # now another window's null (4.0) is the minimum
    assert postprocess([ex], feats, start, end, version_2=True)["q1"].text == "Denver Broncos"


def test_postprocess_rejects_mismatched_inputs(squad, feats):
    start, end = _oracle_logits(feats, [])
    with pytest.raises(ValueError, match="features"):
        postprocess(squad, feats, start[:-1], end[:-1])
    with pytest.raises(ValueError, match="no features"):
        postprocess(squad + [squad[0]], feats, start, end)


# --------------------------------------------------------------------------- span head


def test_span_head_is_two_dot_products_and_masks_padding():
    head = SpanHead(16)
    with torch.no_grad():
        head.qa_outputs.bias.copy_(torch.tensor([0.3, -0.2]))
    hidden = torch.randn(2, 5, 16)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    start, end = head(hidden, mask)
    assert start.shape == end.shape == (2, 5)
    want_start = hidden @ head.start_vector + 0.3  # <s, v_i> + b_s
    want_end = hidden @ head.end_vector - 0.2
    real = mask.bool()
    # 16-term dot products plus a bias: checked against float64, the scale of each being
    # sum |s_d v_id| + |b| (tests/README.md)
    head64, hidden64 = float64(head), hidden.double()
    start64, end64 = head64(hidden64, mask)
    b_start, b_end = head64.qa_outputs.bias.tolist()  # 0.3 and -0.2 as stored (float32)
    for name, got, got64, want, vector, bias in (("start", start, start64, want_start, head64.start_vector, b_start),
                                                  ("end", end, end64, want_end, head64.end_vector, b_end)):
        want64 = hidden64 @ vector + bias
        bound = dict(k=17, scale=(hidden64.abs() @ vector.abs() + abs(bias))[real])
        assert_close_to_reference(got64[real], want64[real], name=f"{name} logits float64", **bound)
        assert_same_function(got[real], want[real], want64[real], name=f"{name} logits", **bound)
    very_negative = torch.finfo(torch.float32).min / 2
    assert (start[~real] == very_negative).all() and (end[~real] == very_negative).all()
    assert torch.isfinite(start + end).all()
    unmasked, _ = head(hidden)
    assert torch.equal(unmasked[real], start[real])


def test_span_loss_is_mean_of_two_cross_entropies():
    start, end = torch.randn(3, 6, dtype=torch.float64), torch.randn(3, 6, dtype=torch.float64)
    s_pos, e_pos = torch.tensor([0, 2, 5]), torch.tensor([1, 4, 5])

    def nll(logits, pos):  # -log softmax at the gold index, by hand
        picked = logits[torch.arange(len(pos)), pos]
        return (torch.log(torch.exp(logits).sum(-1)) - picked).mean()

    want = (nll(start, s_pos) + nll(end, e_pos)) / 2
    # a log-sum-exp of 6 terms, then means (span_loss computes in float32 by design, the hand
    # version in float64); the rounding happens at the size of the log-sum-exp, at most
    # max |logit| + log 6 (tests/README.md)
    bound = dict(depth=3, k=6, scale=torch.cat([start, end]).abs().max().item() + math.log(6))
    assert_close_to_reference(span_loss(start, end, s_pos, e_pos), want, name="span_loss", **bound)
    assert_close_to_reference(SpanHead.loss(start, end, s_pos, e_pos), want, name="SpanHead.loss", **bound)
    # A position past the sequence is clamped to seq and ignored, as in BERT.
    clamped = span_loss(start, end, torch.tensor([0, 2, 99]), torch.tensor([1, 4, 99]))
    assert_close_to_reference(clamped, (nll(start[:2], s_pos[:2]) + nll(end[:2], e_pos[:2])) / 2, name="clamped span_loss", **bound)


def test_span_head_from_hf_checks_the_tensors():
    with pytest.raises(CheckpointError, match="qa_outputs.bias"):
        span_head_from_hf({"qa_outputs.weight": torch.zeros(2, 4)})
    with pytest.raises(CheckpointError, match="span head"):
        span_head_from_hf({"qa_outputs.weight": torch.zeros(3, 4), "qa_outputs.bias": torch.zeros(3)})


def test_parity_with_transformers_bert_for_question_answering(tmp_path, caplog):
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file

    cfg = transformers.BertConfig(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=128, max_position_embeddings=64)
    torch.manual_seed(1)
    ref = transformers.BertForQuestionAnswering(cfg).eval()
    with torch.no_grad():
        ref.qa_outputs.bias.copy_(torch.tensor([0.5, -0.7]))  # HF initialises it to zero
    ref.save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING, logger="ctxkit"):
        encoder = load_bert(tmp_path)  # HF's QA model has no pooler; load_bert builds none
    assert encoder.pooler is None
    ours = SpanQAModel(encoder, cfg.hidden_size).eval()
    ours.head.load_state_dict(span_head_from_hf(load_file(str(tmp_path / "model.safetensors"))))

    g = torch.Generator().manual_seed(2)
    ids = torch.randint(5, 300, (3, 20), generator=g)
    types = torch.zeros_like(ids)
    types[:, 8:] = 1
    mask = torch.ones_like(ids)
    mask[1, 14:] = 0
    mask[2, 6:] = 0
    ours64, ref64 = float64(ours), float64(ref)
    with torch.no_grad():
        o = ours(ids, mask, token_type_ids=types)
        r = ref(input_ids=ids, token_type_ids=types, attention_mask=mask)
        o64 = ours64(ids, mask, token_type_ids=types)
        r64 = ref64(input_ids=ids, token_type_ids=types, attention_mask=mask)
    real = mask.bool()
    logits = dict(depth=4, k=128)  # embeddings, 2 layers (FFN 128), the span head (tests/README.md)
    for name in ("start_logits", "end_logits"):
        assert_close_to_reference(o64[name][real], getattr(r64, name)[real], name=f"{name} float64", **logits)
        assert_same_function(o[name][real], getattr(r, name)[real], getattr(r64, name)[real], name=name, **logits)
    assert r.start_logits[real].std() > 0.1 and (r.start_logits - r.end_logits)[real].abs().max() > 0.1
    assert (o["start_logits"][~real] == torch.finfo(torch.float32).min / 2).all()

    # Without padding the two losses agree too, including a clamped (ignored) position.
    s_pos, e_pos = torch.tensor([3, 0, 50]), torch.tensor([7, 0, 50])
    full = torch.ones_like(mask)
    kw = dict(token_type_ids=types, attention_mask=full, start_positions=s_pos, end_positions=e_pos)
    with torch.no_grad():
        o = ours(ids, **kw)
        r = ref(input_ids=ids, **kw)
        o64 = ours64(ids, **kw)
        r64 = ref64(input_ids=ids, **kw)
    # the logits' bound, then a log-sum-exp over 20 positions (rounding at the size of the logits);
    # span_loss computes in float32 by design, so even the float64 model's loss takes the float32 bound
    loss = dict(depth=5, k=128, scale=torch.cat([r64.start_logits, r64.end_logits]).abs().max().item() + math.log(20))
    assert_close_to_reference(o64["loss"], r64.loss, name="loss float64", **loss)
    assert_same_function(o["loss"], r.loss, r64.loss, name="loss", **loss)


def test_real_model_trains_on_collated_features_and_postprocesses(minilm_layers, tok, squad, feats):
    from ctxkit.data.batching import collate
    from ctxkit.models import load_bert

    # MiniLM's real weights cut to 2 layers (the tokenizer's vocabulary and embeddings whole):
    # what is checked (shapes, a finite loss, gradients, spans of the context) is not the depth.
    model = SpanQAModel(load_bert(minilm_layers(2)))
    chosen = feats[:12]
    batch = collate([f.as_inputs() for f in chosen])
    assert batch["input_ids"].shape == (12, max(len(f) for f in chosen))
    out = model(**batch)
    assert out["start_logits"].shape == batch["input_ids"].shape and torch.isfinite(out["loss"])
    out["loss"].backward()
    assert model.head.qa_outputs.weight.grad.abs().sum() > 0
    examples = squad[:chosen[-1].example_index + 1]
    sub = [f for f in feats if f.example_index < len(examples)]
    with torch.no_grad():
        logits = model(**collate([f.as_inputs() for f in sub]))
    preds = postprocess(examples, sub, logits["start_logits"], logits["end_logits"], version_2=True)
    for ex in examples:
        p = preds[ex.qid]
        assert p.text == "" or p.text == ex.context[p.start_char:p.end_char]
