"""Tiny end-to-end fine-tunes of the real checkpoint on slices of the real data; each
must beat chance by a clear margin. Also drives ``ctxkit finetune | evaluate | predict``.

These are training outcomes, so each threshold sits well below what was observed under
1, 2 and 4 threads (the margins are in the comments): BLAS kernels change the rounding and
with it the trajectory, never the fact that the model learns. Where the 6-layer checkpoint
is not needed to learn the task from a slice, its first 2 layers are (``minilm_layers``):
the same pretrained weights at a third of the CPU time.
"""

import csv
import json

import pytest
import torch

from ctxkit.cli import main
from ctxkit.tasks import evaluate_run, finetune, get_task, load_run
from ctxkit.training import TrainConfig

pytestmark = pytest.mark.usefixtures("minilm_dir")


def _cfg(**kw):
    base = dict(batch_size=16, lr=1e-4, progress=False, device="cpu", log_every=10)
    return TrainConfig(**{**base, **kw})


def test_sst2_slice_through_the_cli_on_a_user_table(shared_data, tmp_path, capsys):
    """Sentence classification from the user's own CSV files, via finetune / evaluate / predict."""
    with open(shared_data / "glue" / "SST-2" / "train.tsv", encoding="utf-8") as f:
        train = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:201]
    with open(shared_data / "glue" / "SST-2" / "dev.tsv", encoding="utf-8") as f:
        dev = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:201]
    data = tmp_path / "data"
    data.mkdir()
    for name, rows in (("train.csv", train), ("dev.csv", dev)):
        with open(data / name, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["text", "label"])
            w.writerows([[text.strip(), "positive" if label == "1" else "negative"] for text, label in rows])
    run = tmp_path / "run"
    # 14 steps of 32 rather than 26 of 16: fewer passes over the 22.7M weights (gradient zeroing,
    # clipping, AdamW) and a wider margin (75 and 77 % for seeds 42 and 1, against 74 and 71).
    rc = main(["finetune", "table", "--data", str(data), "--out", str(run), "--epochs", "2", "--batch-size", "32",
               "--lr", "3e-4", "--max-length", "64", "--device", "cpu", "--no-progress"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    acc = summary["results"]["dev"]["accuracy"]
    # Chance 50, the majority class 51.5.
    assert acc >= 65.0, f"SST-2 slice accuracy {acc} (chance 50, majority {100 * sum(r[1] == '1' for r in dev) / len(dev):.1f})"
    assert (run / "curve.png").is_file() and (run / "best" / "head.safetensors").is_file()
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert sum(r["event"] == "eval" for r in log) == 2
    # evaluate reproduces the number from the saved best model
    assert main(["evaluate", str(run), "--device", "cpu"]) == 0
    assert json.loads(capsys.readouterr().out)["dev"]["accuracy"] == pytest.approx(acc)
    (tmp_path / "in.txt").write_text("a wonderful , moving film\nthe worst , most boring mess of the year\n", encoding="utf-8")
    assert main(["predict", str(run), str(tmp_path / "in.txt"), "--device", "cpu", "--backend", "pytorch"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["label"] for r in rows] == ["positive", "negative"]
    assert sum(rows[0]["probs"].values()) == pytest.approx(1.0, abs=1e-3)


def test_stsb_regression_slice(shared_data, tmp_path):
    task = get_task("sts-b", max_length=64)
    # 64 steps, many of them spent moving the output from 0 to the labels' scale (0-5): at lr
    # 1e-4 the seed decided (pearson 74, 55, 68 for seeds 42, 1, 2); at 2e-4 seeds 42 and 1 both
    # reach 64 (spearman 62). Scored once, on the final weights (evaluating and saving best/ after every epoch
    # was a quarter of the CPU time).
    summary = finetune(task, "all_minilm_l6_v2", shared_data / "glue" / "STS-B", tmp_path,
                       _cfg(epochs=2, lr=2e-4, save_checkpoints=False, eval_each_epoch=False), limit_train=500, limit_eval=200)
    corr = summary["results"]["dev"]
    assert corr["pearson"] >= 50.0 and corr["spearman"] >= 45.0, corr  # chance: 0; observed 64 / 62


def test_conll_slice_beats_chance_and_predicts_entities(shared_data, tmp_path, minilm_layers):
    task = get_task("conll2003")
    summary = finetune(task, str(minilm_layers(2)), shared_data / "conll2003", tmp_path,
                       _cfg(epochs=2, lr=5e-4, save_checkpoints=False, eval_each_epoch=False), limit_train=200, limit_eval=120)
    dev = summary["results"]["dev"]
    assert dev["f1"] >= 15.0, dev  # an untrained tagger finds almost no exact entity; observed 27, 28.5 (seeds 42, 1)
    assert dev["truncated_words"] == 0
    _, model, tokenizer, _ = load_run(tmp_path, device="cpu")
    rows = task.predict_lines(model, tokenizer, ["Germany beat France in Paris ."], device="cpu")
    for ent in rows[0]["entities"]:  # spans index the input text exactly
        assert rows[0]["text"][ent["start"]:ent["end"]] == ent["text"]
    more = evaluate_run(tmp_path, shared_data / "conll2003", ["dev"], device="cpu", limit_eval=600)  # beyond the 120 seen
    assert more["dev"]["f1"] >= 15.0 and more["dev"]["truncated_words"] == 0


def test_frozen_features_logistic_regression_on_sst2_slice(shared_data, minilm_layers):
    """Mean-pooled frozen vectors from the checkpoint's first two layers (half the CPU time of
    all six, which reach 75.3 here): no training, so only rounding varies with the machine."""
    from ctxkit.data import read_glue
    from ctxkit.features.probe import linear_probe

    train = read_glue("SST-2", shared_data / "glue" / "SST-2", "train")[:800]
    dev = read_glue("SST-2", shared_data / "glue" / "SST-2", "dev")[:300]
    res = linear_probe([e.text for e in train], [e.label for e in train], [e.text for e in dev], [e.label for e in dev], pooling="mean",
                       model=str(minilm_layers(2)))
    assert res.accuracy >= 68.0, res.accuracy  # chance 50; observed 73.3 (1 and 2 threads)
    assert res.train_accuracy >= res.accuracy - 5  # fitted, not degenerate


def test_squad_slice_numeric_questions(shared_data, tmp_path, minilm_layers):
    """Extractive QA on the article split, restricted to how-many / what-year / when
    questions: a slice small enough for a CPU, learnable in one short epoch by the first
    two layers of the checkpoint. It trains on the windows that hold the answer: a SQuAD v1.1
    question always has one and evaluation never picks the null span, so the windows that miss
    it (both ends on [CLS]; 144 of the 327 here) would spend 44 % of the training CPU teaching
    that position alone. Observed F1 27-33 against 3-6 before training (1 and 2 threads; head
    seeds 0, 1, 2)."""
    import re

    from ctxkit.training import Trainer
    from ctxkit.zoo import get_model

    numeric = re.compile(r"^(how many|how much|in what year|what year|when)\b", re.I)
    task = get_task("squad", max_seq_len=128, doc_stride=64)
    train = [e for e in task.load(shared_data / "squad_v1.1", "train") if numeric.match(e.question)][:160]
    dev = [e for e in task.load(shared_data / "squad_v1.1", "dev") if numeric.match(e.question)][:80]
    assert not {e.title for e in train} & {e.title for e in dev}  # held-out articles
    encoder, tokenizer = get_model(str(minilm_layers(2)))
    torch.manual_seed(0)
    model = task.build_model(encoder)
    chance, _ = task.evaluate(model, tokenizer, dev, device="cpu")  # untrained span head
    feats = task.featurize(tokenizer, train, train=True)
    answered = [f for f in feats if f["start_positions"] > 0]  # the others point both ends at [CLS]
    assert all(f["end_positions"] == 0 for f in feats if f["start_positions"] == 0) and len(answered) >= len(train)
    Trainer(model, answered, _cfg(epochs=1, lr=3e-4, save_checkpoints=False), tmp_path).train()
    trained, preds = task.evaluate(model, tokenizer, dev, device="cpu")
    assert trained["f1"] >= 15.0 and trained["f1"] >= 3 * chance["f1"], (chance, trained)
    for e in dev:  # every answer is an exact substring of its context
        p = preds[e.qid]
        assert p.text == e.context[p.start_char:p.end_char]
    line = json.dumps({"question": "When was the bridge opened?", "context": "The bridge was opened in 1932 after six years of work."})
    row = task.predict_lines(model, tokenizer, [line], device="cpu")[0]
    assert row["answer"] and row["answer"] in "The bridge was opened in 1932 after six years of work."
