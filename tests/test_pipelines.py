"""ctxkit.pipeline against transformers' pipelines on the same tiny random checkpoints
(issue 38 items 2 and 3): the same keys, labels, spans and (within fp32 rounding) scores; the
token-classification aggregation strategies over a vocabulary that splits words into pieces;
a ``*ForMaskedLM`` folder behind fill-mask; text generation streamed; translation as
``ctxkit translate`` does it."""

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


def _gpt(tmp_path):
    """A tiny random GPT-2 folder with a byte-level BPE trained here: ``(folder, model, tokenizer)``."""
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
    return folder, hf, tok


def test_text_generation_greedy_equals_transformers(tmp_path):
    folder, hf, tok = _gpt(tmp_path)
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


# --- issue 38 item 2: *ForMaskedLM checkpoints behind fill-mask --------------------------------


def _masked_lm(tmp_path, family):
    """A tiny random ``BertForMaskedLM`` / ``DistilBertForMaskedLM`` folder whose MLM head
    separates the fillers (at init its logits are nearly flat: every ranking would be a tie)."""
    folder, hf, tok = _folder(tmp_path, family, family, "MaskedLM")
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.startswith(("cls.", "vocab_")):
                p.normal_(0.0, 2.0 if name.endswith("bias") else 1.0)
    hf.save_pretrained(folder)
    return folder, hf, tok


@pytest.mark.parametrize("family", ["bert", "distilbert"])
def test_masked_lm_checkpoint_fills_masks_as_transformers(tmp_path, family):
    from safetensors import safe_open

    folder, hf, tok = _masked_lm(tmp_path, family)
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        assert not [k for k in f.keys() if "pooler" in k or "seq_relationship" in k]  # no NSP head: not BertForPreTraining
    theirs = transformers.pipeline("fill-mask", model=hf, tokenizer=tok, device="cpu")
    ours = ctxkit.pipeline("fill-mask", model=folder, device="cpu")
    texts = ["john lives in [MASK] .", "the [MASK] was great"]
    keys = ("score", "token", "token_str", "sequence")
    for options in ({}, {"top_k": 3}, {"targets": ["paris", "berlin", "film"]}, {"targets": "berlin"}):
        for a, b in zip(ours(texts, **options), theirs(texts, **options)):
            _same(a, b, keys)
    best = ours(texts[0])
    assert best[0]["score"] > 2 * best[-1]["score"]  # the head ranks: a comparison of ties could not fail
    _same(ours(texts[0], targets=["paris", "zzz"]), theirs(texts[0], targets=["paris", "zzz"]), keys)  # zzz -> [UNK], as theirs


@pytest.mark.parametrize("family", ["bert", "distilbert"])
def test_masked_lm_model_saves_for_transformers(tmp_path, family):
    """get_model(with_heads=True) of a *ForMaskedLM folder is BertForMaskedLM (MLM head, no NSP);
    saved again, transformers' *ForMaskedLM reads it back with the same logits."""
    from ctxkit.models.bert.mlm import BertForMaskedLM

    folder, hf, tok = _masked_lm(tmp_path, family)
    model, tokenizer = ctxkit.get_model(str(folder), with_heads=True)
    assert isinstance(model, BertForMaskedLM)
    batch = tok(TEXTS, padding=True, return_tensors="pt")
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        logits, nsp = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        want = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert nsp is None and float((logits - want)[real].abs().max()) <= 1e-4 * float(want.abs().max())
    model.save_pretrained(tmp_path / "again", tokenizer=tokenizer)
    back = type(hf).from_pretrained(tmp_path / "again").eval()
    with torch.no_grad():
        again = back(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert torch.equal(again, want)


def test_an_encoder_without_heads_is_one_line_for_fill_mask(tmp_path):
    folder = tmp_path / "enc"
    folder.mkdir()
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the"]) + "\n")
    config = transformers.DistilBertConfig(vocab_size=6, dim=32, n_layers=1, n_heads=2, hidden_dim=48, max_position_embeddings=16)
    transformers.DistilBertModel(config).save_pretrained(folder)
    with pytest.raises(UserError, match="no masked-LM head in the weights"):
        ctxkit.pipeline("fill-mask", model=folder, device="cpu")


# --- issue 38 item 3: aggregation strategies over word pieces -----------------------------------

PIECES = "the a in and lives works john paris ber ##lin ##s mer ##kel ang ##ela visit ##ed , . city".split()
NER_TEXTS = ["angela merkel visited zurich and berlin", "johns lives in berlin , a city", "john works in paris ."]


def _ner_with_pieces(tmp_path):
    """A tiny random BertForTokenClassification over a vocabulary that splits words
    (ang ##ela, ber ##lin, visit ##ed; zurich is [UNK])."""
    folder = tmp_path / "ner-pieces"
    folder.mkdir()
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + PIECES) + "\n")
    tok = transformers.BertTokenizerFast(str(folder / "vocab.txt"), do_lower_case=True)
    config = transformers.BertConfig(vocab_size=len(PIECES) + 5, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=48, max_position_embeddings=64, id2label=TAGS,
                                     label2id={v: k for k, v in TAGS.items()})
    torch.manual_seed(0)
    hf = transformers.BertForTokenClassification(config).eval()
    with torch.no_grad():
        hf.classifier.weight.mul_(30)  # tags that differ between the pieces of a word
    hf.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder, hf, tok


@pytest.mark.parametrize("strategy", ["none", "simple", "first", "average", "max"])
def test_aggregation_strategies_equal_transformers_on_word_pieces(tmp_path, strategy):
    folder, hf, tok = _ner_with_pieces(tmp_path)
    assert "##" in " ".join(t for text in NER_TEXTS for t in tok.tokenize(text))
    theirs = transformers.pipeline("token-classification", model=hf, tokenizer=tok, device="cpu",
                                   aggregation_strategy=strategy)(NER_TEXTS)
    ours = ctxkit.pipeline("ner", model=folder, device="cpu", fast="reference", aggregation_strategy=strategy)(NER_TEXTS)
    keys = ("entity", "score", "index", "word", "start", "end") if strategy == "none" else ("entity_group", "score", "word", "start", "end")
    assert sum(len(w) for w in theirs) >= 4
    for a, b in zip(ours, theirs):
        _same(a, b, keys)
    if strategy in ("first", "average", "max"):  # whole words: no group starts or ends inside one
        words = " ".join(g["word"] for groups in ours for g in groups).split()
        assert "##" not in " ".join(words) and {"angela", "merkel", "visited", "berlin", "johns"} & set(words)


def test_word_strategies_differ_where_the_pieces_disagree(tmp_path):
    """The random head tags the pieces of some word differently, so the strategies give
    different groups: each is checked above against transformers on content that tells them apart."""
    folder, _, _ = _ner_with_pieces(tmp_path)
    ner = ctxkit.pipeline("ner", model=folder, device="cpu", fast="reference")
    found = {s: ner(NER_TEXTS, aggregation_strategy=s) for s in ("simple", "first", "average", "max")}
    assert len({repr(v) for v in found.values()}) >= 3
    with pytest.raises(UserError, match="aggregation_strategy 'longest'"):
        ner(NER_TEXTS, aggregation_strategy="longest")


# --- issue 38 item 3: text generation streamed --------------------------------------------------


def test_streamer_gets_what_transformers_streamers_get(tmp_path):
    """transformers' TextIteratorStreamer as ``streamer=``: the pieces join into the generated
    continuation, and are the pieces transformers' own pipeline streams."""
    folder, hf, tok = _gpt(tmp_path)
    ours = ctxkit.pipeline("text-generation", model=folder, device="cpu")
    plain = ours("the film", max_new_tokens=12, return_full_text=False)[0]["generated_text"]
    streamer = transformers.TextIteratorStreamer(tok, skip_prompt=True)
    streamed = ours("the film", max_new_tokens=12, return_full_text=False, streamer=streamer)
    pieces = list(streamer)  # the queue holds every piece already: generation ran on this thread
    assert streamed[0]["generated_text"] == plain and "".join(pieces) == plain and len(plain) > 0
    theirs = transformers.TextIteratorStreamer(tok, skip_prompt=True)
    transformers.pipeline("text-generation", model=hf, tokenizer=tok, device="cpu")("the film", max_new_tokens=12,
                                                                                   do_sample=False, streamer=theirs)
    assert pieces == list(theirs)


def test_stream_true_yields_the_continuation_in_pieces(tmp_path):
    from ctxkit.decoding import TextIteratorStreamer

    folder, _, _ = _gpt(tmp_path)
    ours = ctxkit.pipeline("text-generation", model=folder, device="cpu")
    for prompt in ("the film", "john lives in"):
        plain = ours(prompt, max_new_tokens=16, return_full_text=False)[0]["generated_text"]
        stream = ours(prompt, max_new_tokens=16, stream=True)
        pieces = list(stream)
        assert "".join(pieces) == plain and len(pieces) > 1
    # ctxkit's own streamer, two prompts one after the other: two streams, each ended
    mine = TextIteratorStreamer(ours.tokenizer, skip_prompt=True)
    both = ours(["the film", "john lives in"], max_new_tokens=6, return_full_text=False, streamer=mine)
    joined = "".join(iter(mine)), "".join(iter(mine))
    assert list(joined) == [b[0]["generated_text"] for b in both]
    with pytest.raises(UserError, match="temperature"):
        ours("the film", stream=True, temperature=0)  # refused at the call, not on the thread
    with pytest.raises(UserError, match="one prompt"):
        ours(["the film", "john"], stream=True)


# --- issue 38 item 3: translation ---------------------------------------------------------------


def _translator(tmp_path):
    """A tiny random Transformer translator saved as a ``translate-train`` run (``RUN/best/``):
    a joint byte-level BPE with the translation specials, the model from a preset, shrunk."""
    from ctxkit.zoo.presets import SEQ2SEQ_PRESETS
    from ctxkit.models.seq2seq.model import TransformerSeq2Seq, save_seq2seq
    from ctxkit.tasks.translation import SPECIALS
    from ctxkit.tokenizers import ByteLevelBPETokenizer

    text = ["ein hund läuft", "eine katze schläft", "die frau liest ein buch", "a dog runs", "a cat sleeps", "the woman reads a book"]
    tok = ByteLevelBPETokenizer.train(iter(text), vocab_size=300, min_frequency=1, show_progress=False, special_tokens=SPECIALS)
    arch = SEQ2SEQ_PRESETS["transformer_3_256_8"].replace(vocab_size=tok.vocab_size, max_position=64, num_encoder_layers=1,
                                                          num_decoder_layers=1, hidden_size=32, num_heads=2, ffn_size=64)
    torch.manual_seed(0)
    model = TransformerSeq2Seq(arch).eval()
    with torch.no_grad():  # random weights pick stray bytes; larger merged-word rows make the output words
        model.embed.weight[259:].mul_(4)
    run = tmp_path / "run"
    save_seq2seq(model, run / "best")
    tok.save(run / "best")
    return run


SOURCES = ["ein hund läuft", "die frau liest ein buch", "zwei katzen", "der mann isst im park"]


def test_translation_equals_the_translate_function_and_verb(tmp_path, capsys):
    import json

    from ctxkit.cli import main
    from ctxkit.tasks.translation import load_translator, translate

    run = _translator(tmp_path)
    model, tok = load_translator(run)
    greedy, beams = translate(model, tok, SOURCES, device="cpu"), translate(model, tok, SOURCES, num_beams=2, device="cpu")
    assert len(set(greedy)) > 1 and all(greedy)
    pipe = ctxkit.pipeline("translation", model=run, device="cpu")
    assert pipe(SOURCES) == [{"translation_text": t} for t in greedy]
    assert pipe(SOURCES[0]) == [{"translation_text": greedy[0]}]  # one text: a one-element list, as transformers
    assert pipe(SOURCES, num_beams=2) == [{"translation_text": t} for t in beams]
    assert ctxkit.pipeline("translation_de_to_en", model=run / "best", device="cpu", num_beams=2)(SOURCES[1]) == \
        [{"translation_text": beams[1]}]
    (tmp_path / "in.de").write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    assert main(["translate", str(run), str(tmp_path / "in.de"), "--beams", "2", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.splitlines() == beams
    assert main(["pipeline", "translation", str(run), str(tmp_path / "in.de"), "--num-beams", "2", "--device", "cpu"]) == 0
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [{"translation_text": t} for t in beams]
