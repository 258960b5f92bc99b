"""transformers task checkpoints are runs (issue 38 item 2): tiny random
``*ForSequenceClassification`` / ``*ForTokenClassification`` / ``*ForQuestionAnswering``
folders written here by transformers load with their heads and labels, give transformers'
logits, and ``ctxkit predict`` answers with their label names."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from ctxkit.cli import main  # noqa: E402
from ctxkit.core.errors import UserError  # noqa: E402
from ctxkit.tasks import load_run, load_task  # noqa: E402

WORDS = ("the a film movie great bad awful fine good plot actor was is it in paris john lives works berlin "
         "where does who , . ? !").split()
LABELS = {0: "negative", 1: "positive", 2: "neutral"}
TAGS = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}
TEXTS = ["the film was great", "awful plot , bad actor .", "john lives in paris", "a movie"]


def _folder(tmp_path, name, family, head, **extra):
    """A tiny random transformers checkpoint of ``family`` + ``head`` saved with its tokenizer."""
    folder = tmp_path / name
    folder.mkdir()
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS) + "\n")
    tokenizer = transformers.BertTokenizerFast(str(vocab), do_lower_case=True)
    if family == "bert":
        config = transformers.BertConfig(vocab_size=len(WORDS) + 5, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=48, max_position_embeddings=64, **extra)
    else:
        config = transformers.DistilBertConfig(vocab_size=len(WORDS) + 5, dim=32, n_layers=2, n_heads=2, hidden_dim=48,
                                               max_position_embeddings=64, **extra)
    cls = getattr(transformers, f"{'Bert' if family == 'bert' else 'DistilBert'}For{head}")
    torch.manual_seed(0)
    model = cls(config).eval()
    with torch.no_grad():  # heads initialised at std 0.02 barely separate inputs: scale them
        for name, p in model.named_parameters():
            if name.startswith(("classifier", "qa_outputs", "pre_classifier")):
                p.mul_(30)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, model, tokenizer


def _both(folder, hf_model, tokenizer, texts=TEXTS, pairs=None):
    batch = tokenizer(texts, pairs, padding=True, return_tensors="pt")
    task, model, _, info = load_run(folder, "cpu", fast="reference")
    inputs = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        distil = isinstance(hf_model, transformers.DistilBertPreTrainedModel)  # DistilBERT has no segments
        theirs = hf_model(**{k: v for k, v in inputs.items() if not (distil and k == "token_type_ids")})
        ours = model(**inputs)
    return task, info, ours, theirs, batch["attention_mask"]


def _close(a, b):
    # fp32 against fp32 through different kernels: the error scales with the logits' magnitude
    scale = max(1.0, float(b.abs().max()))
    assert a.shape == b.shape and float((a - b).abs().max()) <= 1e-4 * scale


@pytest.mark.parametrize("family", ["bert", "distilbert"])
def test_sequence_classification_checkpoint_is_a_run(tmp_path, family):
    folder, hf, tok = _folder(tmp_path, family, family, "SequenceClassification", id2label=LABELS,
                              label2id={v: k for k, v in LABELS.items()})
    task, info, ours, theirs, _ = _both(folder, hf, tok)
    assert task.labels == ["negative", "positive", "neutral"] and info["hf_task"] == "sequence"
    assert info["architecture"].endswith("ForSequenceClassification")
    _close(ours["logits"], theirs.logits)
    assert float(theirs.logits.std()) > 0.1  # the logits differ between texts: a wrong head could not pass
    rows = task.predict_lines(load_run(folder, "cpu")[1], load_run(folder, "cpu")[2], TEXTS, 4, "cpu")
    want = [LABELS[int(i)] for i in theirs.logits.argmax(-1)]
    assert [r["label"] for r in rows] == want and set(rows[0]["probs"]) == set(LABELS.values())


def test_regression_checkpoint(tmp_path):
    folder, hf, tok = _folder(tmp_path, "reg", "bert", "SequenceClassification", num_labels=1)
    task, _, ours, theirs, _ = _both(folder, hf, tok)
    assert task.is_regression
    _close(ours["logits"], theirs.logits.squeeze(-1))


def test_token_classification_checkpoint(tmp_path):
    folder, hf, tok = _folder(tmp_path, "ner", "bert", "TokenClassification", id2label=TAGS, label2id={v: k for k, v in TAGS.items()})
    task, info, ours, theirs, mask = _both(folder, hf, tok)
    assert task.name == "conll2003" and task.labels == list(TAGS.values()) and info["hf_task"] == "token"
    real = mask.bool()
    _close(ours["logits"][real], theirs.logits[real])


@pytest.mark.parametrize("family", ["bert", "distilbert"])
def test_question_answering_checkpoint(tmp_path, family):
    folder, hf, tok = _folder(tmp_path, family, family, "QuestionAnswering")
    questions = ["who lives in paris ?", "where does john work ?"]
    contexts = ["john lives in paris", "john works in berlin , it is fine"]
    task, info, ours, theirs, mask = _both(folder, hf, tok, questions, contexts)
    assert task.name == "squad" and info["hf_task"] == "qa"
    start, end = ours["logits"] if isinstance(ours["logits"], tuple) else (ours["start_logits"], ours["end_logits"])
    real = mask.bool()
    _close(start[real], theirs.start_logits[real])
    _close(end[real], theirs.end_logits[real])


def test_cli_predict_names_the_checkpoints_labels(tmp_path, capsys):
    folder, hf, tok = _folder(tmp_path, "cls", "bert", "SequenceClassification", id2label=LABELS,
                              label2id={v: k for k, v in LABELS.items()})
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n")
    assert main(["predict", str(folder), str(tmp_path / "in.txt"), "--device", "cpu"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    with torch.no_grad():
        want = [LABELS[int(i)] for i in hf(**tok(TEXTS, padding=True, return_tensors="pt")).logits.argmax(-1)]
    assert [r["label"] for r in rows] == want


def test_other_folders_get_one_clear_line(tmp_path):
    (tmp_path / "xl").mkdir()
    (tmp_path / "xl" / "config.json").write_text(json.dumps({"architectures": ["XLNetForSequenceClassification"]}))
    with pytest.raises(UserError, match="XLNetForSequenceClassification checkpoint; ctxkit runs the task heads of"):
        load_task(tmp_path / "xl")
    (tmp_path / "enc").mkdir()
    (tmp_path / "enc" / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    with pytest.raises(UserError, match="not a ctxkit run folder .* nor a transformers task checkpoint"):
        load_task(tmp_path / "enc")


def test_a_hub_id_of_a_task_model_is_a_run(tmp_path, monkeypatch, capsys):
    """``ctxkit predict ORG/NAME``: downloaded from the (stand-in) Hub into the cache, then
    predicted from the snapshot like a local folder; nothing is written into the cache."""
    from hub_server import HubServer, commit_id, use_hub

    folder, hf, tok = _folder(tmp_path, "cls", "bert", "SequenceClassification", id2label=LABELS,
                              label2id={v: k for k, v in LABELS.items()})
    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n")
    with HubServer({"org/tiny-sentiment": {"commit": commit_id("tiny"), "files": files}}) as server:
        use_hub(monkeypatch, server.url, tmp_path / "hf")
        assert main(["predict", "org/tiny-sentiment", str(tmp_path / "in.txt"), "--device", "cpu"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    with torch.no_grad():
        want = [LABELS[int(i)] for i in hf(**tok(TEXTS, padding=True, return_tensors="pt")).logits.argmax(-1)]
    assert [r["label"] for r in rows] == want
    snapshot = next((tmp_path / "hf").rglob("snapshots/*/config.json")).parent
    assert not (snapshot / "auto_backend").exists() and not (tmp_path / "org").exists()
