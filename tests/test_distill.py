"""Distillation (issue 21): the losses against hand computations, the student's layers, the
objective, and a CPU end-to-end run on SST-2 where the distilled student beats the same
student trained without distillation."""

import csv
import math

import numpy as np
import pytest
import torch

from ctxkit.models.bert.model import BertConfig, BertModel
from ctxkit.training.distill import (DistillationObjective, cosine_loss, distilbert_loss, every_other_layer, soft_target_loss,
                                     student_from_teacher)


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


STUDENT = np.array([[2.0, -1.0, 0.5], [0.1, 0.2, -3.0]])
TEACHER = np.array([[3.0, -2.0, 0.0], [-1.0, 1.5, 0.5]])


@pytest.mark.parametrize("T", [1.0, 2.0, 4.0])
def test_soft_target_loss_is_t_squared_kl_by_hand(T):
    p_t, p_s = _softmax(TEACHER / T), _softmax(STUDENT / T)
    rows = [T * T * sum(p_t[i, c] * math.log(p_t[i, c] / p_s[i, c]) for c in range(3)) for i in range(2)]
    got = soft_target_loss(torch.tensor(STUDENT), torch.tensor(TEACHER), T)
    assert abs(got.item() - sum(rows) / 2) < 1e-5 * max(1.0, abs(sum(rows)))
    masked = soft_target_loss(torch.tensor(STUDENT), torch.tensor(TEACHER), T, mask=torch.tensor([False, True]))
    assert abs(masked.item() - rows[1]) < 1e-5 * max(1.0, rows[1])
    assert soft_target_loss(torch.tensor(TEACHER), torch.tensor(TEACHER), T).abs().item() < 1e-6  # KL(p || p) = 0
    with pytest.raises(ValueError, match="temperature"):
        soft_target_loss(torch.tensor(STUDENT), torch.tensor(TEACHER), 0.0)


def test_cosine_and_triple_loss_by_hand():
    s = torch.tensor([[[1.0, 0.0], [1.0, 1.0], [5.0, 5.0]]])
    t = torch.tensor([[[0.0, 1.0], [2.0, 2.0], [1.0, 0.0]]])
    mask = torch.tensor([[1, 1, 0]])
    assert abs(cosine_loss(s, t, mask).item() - (1.0 + 0.0) / 2) < 1e-6  # orthogonal, then parallel; padding ignored
    logits_s = torch.tensor([[[2.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])
    logits_t = torch.tensor([[[1.0, 0.0], [0.0, 3.0], [9.0, 9.0]]])
    labels = torch.tensor([[0, -100, -100]])
    out = distilbert_loss(logits_s, logits_t, labels, s, t, mask, temperature=2.0, alpha_ce=5.0, alpha_mlm=2.0, alpha_cos=1.0)
    p_t, p_s = _softmax(np.array([1.0, 0.0]) / 2), _softmax(np.array([2.0, 0.0]) / 2)
    soft = 4 * sum(p_t * np.log(p_t / p_s))  # only the predicted position counts
    mlm = -math.log(_softmax(np.array([2.0, 0.0]))[0])
    assert abs(out["soft"].item() - soft) < 1e-6 and abs(out["mlm"].item() - mlm) < 1e-6
    assert abs(out["loss"].item() - (5 * soft + 2 * mlm + 1 * 0.5)) < 1e-5


def test_student_keeps_exactly_the_chosen_teacher_layers():
    assert every_other_layer(12, 6) == [0, 2, 4, 6, 8, 10] and every_other_layer(6, 3) == [0, 2, 4]
    assert every_other_layer(6, 6) == list(range(6)) and every_other_layer(4, 1) == [0]
    torch.manual_seed(0)
    teacher = BertModel(BertConfig(num_layers=6, hidden_size=32, num_heads=2, ffn_size=64, vocab_size=100, max_position=32)).eval()
    student = student_from_teacher(teacher, [0, 2, 4]).eval()
    assert student.config.num_layers == 3 and len(student.encoder.layers) == 3 and teacher.config.num_layers == 6
    for i, j in enumerate([0, 2, 4]):
        for (k, a), (_, b) in zip(student.encoder.layers[i].state_dict().items(), teacher.encoder.layers[j].state_dict().items()):
            assert torch.equal(a, b), (i, j, k)
    assert torch.equal(student.embeddings.word_embeddings.weight, teacher.embeddings.word_embeddings.weight)
    assert student.encoder.layers[0].self_attn is not teacher.encoder.layers[0].self_attn  # a copy, not shared
    # the student computes the teacher's embeddings followed by teacher layers 0, 2, 4
    ids = torch.randint(0, 100, (2, 7))
    with torch.no_grad():
        h = teacher.embeddings(ids, torch.zeros_like(ids))
        for j in (0, 2, 4):
            h = teacher.encoder.layers[j](h)[0]  # (hidden, attention weights)
        assert torch.equal(student(ids).last_hidden_state, h)
    with pytest.raises(ValueError, match="not in 0..5"):
        student_from_teacher(teacher, [0, 6])


def test_objective_mixes_soft_and_hard_losses():
    from ctxkit.heads.classification import EncoderWithHead, SequenceClassificationHead

    torch.manual_seed(0)
    enc = BertModel(BertConfig(num_layers=1, hidden_size=16, num_heads=2, ffn_size=32, vocab_size=50, max_position=16))
    model = EncoderWithHead(enc, SequenceClassificationHead(16, 2, 0.0), cls_only=True).eval()
    batch = {"input_ids": torch.randint(0, 50, (3, 5)), "attention_mask": torch.ones(3, 5, dtype=torch.long),
             "labels": torch.tensor([0, 1, 1])}
    teacher = torch.tensor([[2.0, -2.0], [0.0, 1.0], [-1.0, 3.0]])
    out = DistillationObjective(model, "sequence", temperature=3.0, alpha=0.25)(teacher_logits=teacher, **batch)
    hard = model(**batch)["loss"]
    soft = soft_target_loss(model(**batch)["logits"], teacher, 3.0)
    assert torch.allclose(out["loss"], 0.25 * soft + 0.75 * hard) and torch.allclose(out["hard_loss"], hard)
    plain = DistillationObjective(model, "sequence", alpha=0.0)(teacher_logits=teacher, **batch)
    assert torch.equal(plain["loss"], hard)  # alpha 0: the undistilled baseline


def _sst_rows(shared_data, start, n):
    with open(shared_data / "glue" / "SST-2" / "train.tsv", encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    return rows[start:start + n]


def _write_table(folder, train, dev):
    folder.mkdir(parents=True, exist_ok=True)
    for name, part in (("train.csv", train), ("dev.csv", dev)):
        with open(folder / name, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["text", "label"])
            writer.writerows([[text.strip(), "pos" if label == "1" else "neg"] for text, label in part])
    return folder


def test_distilled_student_beats_the_undistilled_one_on_sst2(shared_data, minilm_layers, tmp_path):
    """A 4-layer MiniLM teacher fine-tuned on 1,200 SST-2 sentences (one and a half epochs);
    2-layer students (the teacher's layers 0 and 2 and its head) get 120 labelled sentences,
    and the distilled one also 1,080 sentences without labels that the teacher scores (a
    transfer set). Distillation must be worth clearly more than rounding or thread count can
    move, on 400 dev sentences: >= 3 points over the student without distillation and >= 10
    over the majority class (56.5 %; 8 steps from a cut teacher do not recover, and the
    undistilled student ends up predicting one class: 43.5 or 56.5). Measured on a 2-core AMD
    EPYC under 1 and 2 threads and with seeds 42, 1, 2: teacher 80.5-82.25, distilled student
    76.75-80. Every run scores its final weights (no per-epoch evaluation: CPU time)."""
    from ctxkit.cli import main
    from ctxkit.tasks import finetune, get_task
    from ctxkit.tasks.distill import CACHE, distill
    from ctxkit.training import TrainConfig

    rows, dev = _sst_rows(shared_data, 0, 1200), _sst_rows(shared_data, 20000, 400)
    majority = 100 * max(sum(label == "1" for _, label in dev), sum(label == "0" for _, label in dev)) / len(dev)
    cfg = dict(batch_size=32, progress=False, save_checkpoints=False, log_every=1000, eval_each_epoch=False)
    teacher = finetune(get_task("table"), str(minilm_layers(4)), _write_table(tmp_path / "teach", rows, dev), tmp_path / "teacher",
                       TrainConfig(epochs=1.5, lr=3e-4, **cfg))
    labelled = _write_table(tmp_path / "few", rows[:120], dev)
    (tmp_path / "transfer.txt").write_text("".join(text.strip() + "\n" for text, _ in rows[120:]), encoding="utf-8")
    student_cfg = TrainConfig(epochs=2, lr=5e-4, **cfg)
    plain = distill(tmp_path / "teacher", labelled, tmp_path / "plain", student_cfg, student_layers=2, alpha=0.0)
    taught = distill(tmp_path / "teacher", labelled, tmp_path / "taught", student_cfg, student_layers=2, alpha=0.9,
                     transfer_data=tmp_path / "transfer.txt")
    t, p, d = (r["results"]["dev"]["accuracy"] for r in (teacher, plain, taught))
    assert taught["distillation"]["teacher_layers_kept"] == [0, 2] and taught["distillation"]["transfer_examples"] == 1080
    assert t > 75 and d >= p + 3 and d >= majority + 10, (t, p, d, majority)
    assert (tmp_path / "taught" / CACHE).is_file()
    # the student run is an ordinary run folder: evaluate reads it
    assert main(["evaluate", str(tmp_path / "taught"), "--data", str(labelled)]) == 0


def test_distill_cli_stop_then_resume_equals_uninterrupted(tiny_bert_dir, sst_table, tmp_path, capsys):
    """The student trains through the same Trainer as finetune: --max-steps stops it mid-epoch
    and --resume ends with the same weights and losses as a run that never stopped (the
    teacher's cached logits are reused, not recomputed)."""
    import json

    from safetensors.torch import load_file

    from ctxkit.cli import main
    from ctxkit.tasks.distill import CACHE

    teacher = tmp_path / "teacher"
    assert main(["finetune", "table", "--model", str(tiny_bert_dir), "--data", str(sst_table), "--out", str(teacher),
                 "--epochs", "1", "--batch-size", "8", "--max-length", "32", "--device", "cpu", "--no-progress"]) == 0
    common = ["distill", str(teacher), "--student-layers", "1", "--epochs", "2", "--batch-size", "8", "--device", "cpu",
              "--no-progress", "--seed", "42", "--log-every", "1"]
    assert main(common + ["--out", str(tmp_path / "whole"), "--save-every", "1"]) == 0
    assert main(common + ["--out", str(tmp_path / "cut"), "--max-steps", "4"]) == 0
    stamp = (tmp_path / "cut" / CACHE).stat().st_mtime_ns
    assert json.loads((tmp_path / "cut" / "results.json").read_text())["stopped"]["step"] == 4
    assert main(common + ["--out", str(tmp_path / "cut"), "--resume"]) == 0
    assert (tmp_path / "cut" / CACHE).stat().st_mtime_ns == stamp  # the teacher did not run again

    def losses(run):
        rows = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
        return [(r["step"], r["loss"], r["soft_loss"]) for r in rows if r["event"] == "train"]

    assert losses(tmp_path / "cut") == losses(tmp_path / "whole") and len(losses(tmp_path / "whole")) == 12
    a, b = (load_file(str(tmp_path / r / "checkpoint" / "model.safetensors")) for r in ("whole", "cut"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    capsys.readouterr()


def test_task_agnostic_distillation_fits_the_missing_head_then_trains_a_student(wiki_shards, minilm_layers, tmp_path):
    """MiniLM ships without a masked-LM head: it is fitted first with the body frozen (the
    teacher's encoder weights stay exactly as released), then a 2-layer student of the
    4-layer teacher trains on the triple loss and saves an HF folder that loads again."""
    import json

    from ctxkit.models.bert.model import load_bert
    from ctxkit.pretraining.distill import distill_pretrain
    from ctxkit.training import TrainConfig
    from ctxkit.zoo import get_model

    teacher = minilm_layers(4)
    # A few steps of each phase: what is checked is the mechanics (a step with every loss, the
    # body frozen while the head fits, a loadable student), not what the student learns.
    # No resumable checkpoints (the objective's weights and the optimiser state, written twice
    # and read by nothing here: ~1 s of CPU); test_distill_pretrain_cli runs with them.
    cfg = TrainConfig(batch_size=8, lr=5e-4, max_steps=3, progress=False, log_every=1, eval_each_epoch=False, warmup_ratio=0.0,
                      save_checkpoints=False)
    summary = distill_pretrain(wiki_shards, str(teacher), tmp_path / "run", cfg, student_layers=2, head_steps=2)
    assert summary["head_fitted"] and summary["teacher_layers_kept"] == [0, 2] and summary["steps"] == 3
    fitted = load_bert(tmp_path / "run" / "teacher_head" / "final", with_heads=True)
    released = load_bert(teacher)
    assert all(torch.equal(v, fitted.bert.state_dict()[k]) for k, v in released.state_dict().items())  # body untouched
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    steps = [r for r in log if r["event"] == "train"]
    assert len(steps) == 3 and all(r["soft_loss"] > 0 and r["mlm_loss"] > 0 and 0 <= r["cos_loss"] <= 2 for r in steps)
    student, tokenizer = get_model(str(tmp_path / "run" / "final"))
    assert student.config.num_layers == 2 and tokenizer is not None


def test_distill_pretrain_cli(wiki_shards, minilm_layers, tmp_path, capsys):
    import json

    from ctxkit.cli import main

    assert main(["distill-pretrain", "--data", str(wiki_shards), "--teacher", str(minilm_layers(2)), "--out", str(tmp_path / "r"),
                 "--student-layers", "1", "--head-steps", "2", "--max-steps", "3", "--batch-size", "8", "--device", "cpu",
                 "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["teacher_layers_kept"] == [0] and summary["steps"] == 3 and summary["head_fitted"]
    assert (tmp_path / "r" / "final" / "model.safetensors").is_file()
