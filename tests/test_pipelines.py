"""ctxkit.pipeline against transformers' pipelines on the same tiny random checkpoints
(issue 38 item 3): the same keys, labels, spans and (within fp32 rounding) scores."""

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import ctxkit  # noqa: E402
from ctxkit.core.errors import UserError  # noqa: E402
from test_hub_task_models import LABELS, TAGS, TEXTS, _folder  # noqa: E402


def _same(ours, theirs, keys):
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert set(a) == set(b), (a, b)
        for k in keys:
            if isinstance(b[k], (float, np.floating)):
                assert abs(a[k] - b[k]) <= 1e-4 * max(1.0, abs(b[k])), (k, a, b)
            else:
                assert a[k] == b[k], (k, a, b)


def test_text_classification_equals_transformers(tmp_path):
    folder, hf, tok = _folder(tmp_path, "cls", "bert", "SequenceClassification", id2label=LABELS,
                              label2id={v: k for k, v in LABELS.items()})
    theirs = transformers.pipeline("text-classification", model=hf, tokenizer=tok, device="cpu")
    ours = ctxkit.pipeline("sentiment-analysis", model=folder, device="cpu", fast="reference")
    _same(ours(TEXTS), theirs(TEXTS), ("label", "score"))
    _same(ours(TEXTS[0]), theirs(TEXTS[0]), ("label", "score"))  # a single text: a one-element list
    for a, b in zip(ours(TEXTS, top_k=None), theirs(TEXTS, top_k=None)):
        _same(a, b, ("label", "score"))
    assert len({r["label"] for r in ours(TEXTS)}) >= 1 and abs(sum(r["score"] for r in ours(TEXTS[1], top_k=None)) - 1) < 1e-5


@pytest.mark.parametrize("strategy", ["none", "simple"])
def test_token_classification_equals_transformers(tmp_path, strategy):
    folder, hf, tok = _folder(tmp_path, "ner", "bert", "TokenClassification", id2label=TAGS, label2id={v: k for k, v in TAGS.items()})
    theirs = transformers.pipeline("token-classification", model=hf, tokenizer=tok, device="cpu", aggregation_strategy=strategy)
    ours = ctxkit.pipeline("ner", model=folder, device="cpu", fast="reference", aggregation_strategy=strategy)
    texts = ["john lives in paris", "the actor works in berlin"]
    got, want = ours(texts), theirs(texts)
    keys = ("entity", "score", "index", "word", "start", "end") if strategy == "none" else ("entity_group", "score", "word", "start", "end")
    assert sum(len(w) for w in want) >= 2  # the random head tags something: the comparison has content
    for a, b in zip(got, want):
        _same(a, b, keys)


def _hf_best_span(hf, tok, question, context, max_answer_len=30):
    """The answer transformers' model picks (transformers 5 has no question-answering pipeline
    any more): the context span of highest start + end logit, at most ``max_answer_len`` tokens."""
    enc = tok(question, context, return_offsets_mapping=True, return_tensors="pt")
    offsets = enc.pop("offset_mapping")[0]
    with torch.no_grad():
        out = hf(**enc)
    seq = enc.sequence_ids(0)
    ctx = [i for i, s in enumerate(seq) if s == 1]
    best = max(((out.start_logits[0, i] + out.end_logits[0, j]).item(), i, j) for i in ctx for j in ctx if i <= j < i + max_answer_len)
    _, i, j = best
    start, end = int(offsets[i][0]), int(offsets[j][1])
    return {"start": start, "end": end, "answer": context[start:end]}


def test_question_answering_finds_transformers_span(tmp_path):
    folder, hf, tok = _folder(tmp_path, "qa", "bert", "QuestionAnswering")
    ours = ctxkit.pipeline("question-answering", model=folder, device="cpu", fast="reference")
    cases = (("who lives in paris ?", "john lives in paris , the actor works in berlin"),
             ("where does john work ?", "john works in berlin , it is fine"))
    for question, context in cases:
        want = _hf_best_span(hf, tok, question, context)
        got = ours(question=question, context=context)
        assert set(got) == {"score", "start", "end", "answer"}
        assert (got["start"], got["end"], got["answer"]) == (want["start"], want["end"], want["answer"])
    batch = ours([{"question": q, "context": c} for q, c in cases])
    assert [b["answer"] for b in batch] == [_hf_best_span(hf, tok, q, c)["answer"] for q, c in cases]


def test_fill_mask_and_features_equal_transformers(tmp_path):
    folder, hf, tok = _folder(tmp_path, "mlm", "bert", "PreTraining")
    mlm = transformers.BertForMaskedLM.from_pretrained(folder).eval()
    theirs = transformers.pipeline("fill-mask", model=mlm, tokenizer=tok, device="cpu")
    ours = ctxkit.pipeline("fill-mask", model=folder, device="cpu")
    _same(ours("john lives in [MASK] ."), theirs("john lives in [MASK] ."), ("score", "token", "token_str", "sequence"))
    base = transformers.BertModel.from_pretrained(folder).eval()
    want = transformers.pipeline("feature-extraction", model=base, tokenizer=tok, device="cpu")("the film was great")
    got = ctxkit.pipeline("feature-extraction", model=folder, device="cpu")("the film was great")
    got, want = torch.tensor(got), torch.tensor(want)
    assert got.shape == want.shape and float((got - want).abs().max()) <= 1e-4 * float(want.abs().max())


def test_unknown_task_and_missing_model_are_one_line():
    with pytest.raises(UserError, match="unknown pipeline task 'summarise'; known: "):
        ctxkit.pipeline("summarise", model="x")
    with pytest.raises(UserError, match="needs model="):
        ctxkit.pipeline("ner")


def test_cli_pipeline_reads_lines_and_prints_json(tmp_path, capsys):
    import json

    from ctxkit.cli import main

    folder, hf, tok = _folder(tmp_path, "cls", "bert", "SequenceClassification", id2label=LABELS,
                              label2id={v: k for k, v in LABELS.items()})
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n\n")
    assert main(["pipeline", "sentiment-analysis", str(folder), str(tmp_path / "in.txt"), "--device", "cpu", "--fast", "reference"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    want = transformers.pipeline("text-classification", model=hf, tokenizer=tok, device="cpu")(TEXTS)
    assert [r["label"] for r in rows] == [w["label"] for w in want] and len(rows) == len(TEXTS)


def test_text_generation_greedy_equals_transformers(tmp_path):
    from tokenizers import ByteLevelBPETokenizer

    corpus = ["the film was great and the actor was fine", "john lives in paris and works in berlin"] * 20
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus, vocab_size=300, min_frequency=1, special_tokens=["<|endoftext|>"], show_progress=False)
    bpe.save_model(str(tmp_path))
    tok = transformers.GPT2TokenizerFast(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"))
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=tok.vocab_size, n_embd=32, n_layer=2, n_head=2, n_positions=64)
    hf = transformers.GPT2LMHeadModel(config).eval()
    folder = tmp_path / "gpt"
    hf.save_pretrained(folder)
    tok.save_pretrained(folder)
    want = transformers.pipeline("text-generation", model=hf, tokenizer=tok, device="cpu")(
        "the film", max_new_tokens=8, do_sample=False)
    got = ctxkit.pipeline("text-generation", model=folder, device="cpu")("the film", max_new_tokens=8)
    assert got == [{"generated_text": want[0]["generated_text"]}] and len(got[0]["generated_text"]) > len("the film")


def test_batched_inputs_answer_as_one_by_one(tmp_path):
    """Inputs of different lengths batched together (padded, length-sorted) give what each
    gives alone, in input order."""
    folder, _, _ = _folder(tmp_path, "mlm", "bert", "PreTraining")
    texts = ["john lives in [MASK] .", "the [MASK] was great", "a movie , the plot was awful , the actor was [MASK] !"]
    fill = ctxkit.pipeline("fill-mask", model=folder, device="cpu", batch_size=8)
    feats = ctxkit.pipeline("feature-extraction", model=folder, device="cpu", batch_size=8)
    together, alone = fill(texts), [fill(t) for t in texts]
    for a, b in zip(together, alone):
        assert [r["token"] for r in a] == [r["token"] for r in b]
        assert all(abs(x["score"] - y["score"]) <= 1e-5 for x, y in zip(a, b))
    for t, f in zip(texts, feats(texts)):
        one = torch.tensor(feats(t))
        assert torch.tensor(f).shape == one.shape and float((torch.tensor(f) - one).abs().max()) <= 1e-4 * float(one.abs().max())
