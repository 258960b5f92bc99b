"""BERT pretraining (MLM + NSP): exact resume with dynamic masking, learning, saved model,
FLOPs accounting, and the CLI."""

import json

import pytest
import torch

from ctxkit.cli import main
from ctxkit.models import BertForPreTraining, get_preset, load_bert
from ctxkit.pretraining import MaskingConfig
from ctxkit.pretraining.train import pretrain, training_flops_per_token
from ctxkit.training import TrainConfig
from shards import wiki_shards_of


@pytest.fixture
def shards(wiki_shards):
    return wiki_shards


def _cfg(**kw):
    base = dict(batch_size=16, lr=1e-3, warmup_ratio=0.1, device="cpu", progress=False, log_every=1, eval_each_epoch=False, seed=7)
    return TrainConfig(**{**base, **kw})


def _one_layer(monkeypatch):
    """``bert_2_128_2`` cut to one layer. The compile tests pay for tracing (and guarding)
    every layer, and a second layer adds another copy of the same graph, not another shape or
    code path; the resume and learning tests check what does not depend on the depth."""
    import dataclasses

    from ctxkit.zoo import presets

    base = presets.get_preset("bert_2_128_2")
    monkeypatch.setitem(presets.PRESETS, "bert_2_128_2", dataclasses.replace(base, config=base.config.replace(num_layers=1)))


def _losses(run):
    return [r["loss"] for r in map(json.loads, (run / "log.jsonl").read_text().splitlines()) if r.get("event") == "train"]


def test_resume_with_dynamic_masking_equals_uninterrupted(shards, tmp_path, monkeypatch):
    # One layer and batches of 8: what must come back on resume (the masking RNG, the global
    # RNG, the data order, the optimiser) does not depend on the model's depth or batch size.
    _one_layer(monkeypatch)
    masking = MaskingConfig(whole_word=True, max_predictions=10)
    pretrain(shards, "bert_2_128_2", tmp_path / "full", _cfg(epochs=1, max_steps=8, batch_size=8), masking=masking)
    pretrain(shards, "bert_2_128_2", tmp_path / "cut", _cfg(epochs=1, max_steps=4, batch_size=8), masking=masking)
    torch.manual_seed(99)  # disturb the global RNG; resume must restore it and the masking RNG
    pretrain(shards, "bert_2_128_2", tmp_path / "cut", _cfg(epochs=1, max_steps=8, batch_size=8), masking=masking, resume=True)
    full = _losses(tmp_path / "full")
    assert len(full) == 8
    assert _losses(tmp_path / "cut") == full  # bit-identical: the same computation, resumed


def test_pretraining_learns_and_saves_a_loadable_model(shards, tmp_path, monkeypatch):
    # At length 64 BERT's masking picks at most round(62 * 0.15) = 9 tokens a sequence, so a
    # width of 10 holds every prediction: the default 20 (BERT's, for length 128) only pads
    # the MLM head's 30522-way output, which was over half the run's time.
    # One layer: over these 60 steps it learns as the two-layer preset does (seed 7: mlm_acc
    # 0.068 and MLM loss 10.3 -> 7.2 on 1 and on 2 threads, as with two layers; seed 3: 0.058
    # and 7.2, as with two layers).
    _one_layer(monkeypatch)
    masking = MaskingConfig(max_predictions=10)
    summary = pretrain(shards, "bert_2_128_2", tmp_path, _cfg(epochs=3, max_steps=60, log_every=10), masking=masking)
    log = [r for r in map(json.loads, (tmp_path / "log.jsonl").read_text().splitlines()) if r.get("event") == "train"]
    assert log[0]["mlm_loss"] > 9.5  # ~ln(30522) at the start
    assert log[-1]["mlm_loss"] < log[0]["mlm_loss"] - 1.5
    assert log[-1]["mlm_acc"] > 0.05 and 0.0 <= log[-1]["nsp_acc"] <= 1.0
    assert log[-1]["seq_per_s"] > 0 and log[-1]["tokens_per_s"] > log[-1]["seq_per_s"]
    model = load_bert(summary["final"], with_heads=True)
    assert isinstance(model, BertForPreTraining) and model.config.vocab_size == 30522
    assert (tmp_path / "final" / "vocab.txt").is_file() and (tmp_path / "curve.png").is_file()


def test_flops_per_token_bert_base():
    cfg = get_preset("bert_12_768_12").config
    dense = 12 * (4 * 768 * 768 + 2 * 768 * 3072) + 2 * 768 * 768  # 86.1M matmul weights
    expected = 6 * dense + 12 * 12 * 768 * 128 + 6 * 768 * 30522 * 0.15
    assert training_flops_per_token(cfg, 128) == pytest.approx(expected)
    assert 5.3e8 < expected < 5.6e8  # ~6 x 86M + attention + masked MLM projection


def test_cli_pretrain_and_wrong_tokenizer(shards, tmp_path, capsys):
    rc = main(["pretrain", "--data", str(shards), "--preset", "bert_2_128_2", "--out", str(tmp_path / "run"), "--max-steps", "3",
               "--batch-size", "8", "--device", "cpu", "--no-progress", "--log-every", "1"])
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 3
    other = tmp_path / "other_vocab"
    other.mkdir()
    (other / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"]) + "\n")
    rc = main(["pretrain", "--data", str(shards), "--out", str(tmp_path / "bad"), "--tokenizer", str(other), "--max-steps", "1", "--device", "cpu"])
    assert rc == 2
    assert "not the vocabulary the shards" in capsys.readouterr().err


def test_pretraining_batches_come_in_a_fixed_set_of_shapes(wiki_shards):
    """With compiling or CUDA graphs the collator pads real shards (their lengths mix) to half
    or full length and fills the epoch's last batch to full rows with ignored copies: every
    batch of two epochs has one of a fixed set of shapes (issue 37: no recompilation)."""
    from ctxkit.data.batching import length_grouped_batches
    from ctxkit.pretraining import PretrainDataset
    from ctxkit.pretraining.masking import IGNORE_INDEX, MaskingConfig, MLMCollator
    from ctxkit.pretraining.train import length_buckets
    from ctxkit.tokenizers import WordPieceTokenizer

    data = PretrainDataset(wiki_shards)
    tokenizer = WordPieceTokenizer.from_dir(data.meta["tokenizer"]["path"])
    buckets = length_buckets(data.meta["max_seq_len"])
    assert buckets == (32, 64)
    lengths = list(data.lengths)
    assert min(lengths) < 32 < max(lengths)  # the real mix: short pairs and full ones
    batch = 16
    collator = MLMCollator(tokenizer, MaskingConfig(max_predictions=6), seed=0, lengths=buckets, rows=batch)
    shapes, short = set(), 0
    for epoch in range(2):
        for j, idx in enumerate(length_grouped_batches(lengths, batch, seed=0, epoch=epoch, group_factor=50)):
            out = collator([data[i] for i in idx], key=(epoch, j))
            shapes.add((tuple(out["input_ids"].shape), tuple(out["masked_positions"].shape), "attention_mask" in out))
            if len(idx) < batch:  # the filler rows train on nothing
                short += 1
                assert (out["masked_labels"][len(idx):] == IGNORE_INDEX).all()
                assert (out["next_sentence_label"][len(idx):] == IGNORE_INDEX).all()
                assert (out["masked_labels"][:len(idx)] != IGNORE_INDEX).any()
    assert short == (2 if len(lengths) % batch else 0)
    assert {s[0] for s in shapes} <= {(batch, n) for n in buckets} and {s[1] for s in shapes} == {(batch, 6)}
    assert {s[2] for s in shapes} == {True}  # the mask always there: one shape per bucket, padded or not


def test_compile_warm_up_leaves_training_as_it_was(shards, tmp_path, monkeypatch):
    """Compiling the buckets before step 1 (a forward and backward per shape, no update)
    changes nothing the run computes: the random streams are restored, so the losses equal
    those of the same run without the warm-up, bit for bit."""
    import torch

    from ctxkit.pretraining import train as pretraining
    from ctxkit.training import trainer as trainer_module

    compile_module = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: compile_module(self, backend="eager", dynamic=kw.get("dynamic")))
    _one_layer(monkeypatch)
    cfg = _cfg(batch_size=8, max_steps=4, log_every=1, fast="compile+qkv")

    def losses(out):
        pretraining.pretrain(shards, "bert_2_128_2", out, cfg, masking=MaskingConfig(max_predictions=6))
        records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
        return [r["loss"] for r in records if r["event"] == "train"], [r["warm_up"] for r in records if "warm_up" in r]

    warmed, warm_records = losses(tmp_path / "warmed")
    assert len(warm_records) == 1 and warm_records[0]["shapes"]
    monkeypatch.setattr(trainer_module, "compile_warm_up", lambda *a, **k: 0.0)
    plain, _ = losses(tmp_path / "plain")
    assert len(warmed) == 4 and warmed == plain


@pytest.fixture(scope="module")
def mixed_shards(shared_data, minilm_dir, tmp_path_factory):
    """Shards of the first 40 documents of the extract (seq 64): short pairs for the half-length
    bucket as well as full ones, and a spread of lengths for the unbucketed run."""
    return wiki_shards_of(40, shared_data, minilm_dir, tmp_path_factory)


def test_no_recompilation_after_warm_up_on_real_shards(mixed_shards, tmp_path, monkeypatch):
    """A compiled plan on real shards of mixed lengths compiles one specialised graph per
    shape of its fixed set early on and never again, epoch ends included; the log counts the
    compiles (Dynamo's eager backend here: the same tracing and guards as Inductor, without
    code generation). Without the length buckets the same run keeps recompiling."""
    import torch

    from ctxkit.pretraining import train as pretraining

    compile_module = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: compile_module(self, backend="eager", dynamic=kw.get("dynamic")))
    _one_layer(monkeypatch)
    cfg = _cfg(batch_size=16, epochs=2, log_every=1, fast="compile+qkv")

    def compiles(out):
        pretraining.pretrain(mixed_shards, "bert_2_128_2", out, cfg, masking=MaskingConfig(max_predictions=6))
        records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
        assert records[0]["fast"] == "compile+qkv"
        return [r["compiles"] for r in records if r["event"] == "train"]

    bucketed = compiles(tmp_path / "run")
    assert len(bucketed) >= 8 and bucketed[0] == 2  # two lengths, both with the attention mask
    # Both buckets compiled before step 1 (a warm_up record names their shapes), so the count
    # never moves afterwards, two epoch ends included.
    assert bucketed == [bucketed[0]] * len(bucketed)
    warm = json.loads((tmp_path / "run" / "log.jsonl").read_text().splitlines()[0])["warm_up"]
    assert sorted(map(tuple, warm["shapes"])) == [(16, 32), (16, 64)]
    assert warm["compiles"] == bucketed[0]
    monkeypatch.setattr(pretraining, "length_buckets", lambda max_len: None)  # the lengths as they come
    unbucketed = compiles(tmp_path / "plain")
    assert unbucketed[-1] > 2 * bucketed[-1]


@pytest.fixture(scope="module")
def few_shards(shared_data, minilm_dir, tmp_path_factory):
    """Shards of the first 6 documents of the extract (33 instances, 5 batches of 8): two
    whole epochs in seconds."""
    return wiki_shards_of(6, shared_data, minilm_dir, tmp_path_factory)


def test_held_out_evaluation_after_every_epoch(few_shards, tmp_path, monkeypatch):
    """``--eval-data``: an ``eval`` record per epoch with MLM loss/accuracy and NSP accuracy on
    the held-out shards; the masks are the same at every evaluation, so evaluating one model
    twice gives the same numbers (from batches collated once and kept), and an untrained model
    scores near chance."""
    from ctxkit.pretraining import PretrainDataset
    from ctxkit.pretraining.masking import MLMCollator
    from ctxkit.pretraining import train as train_module
    from ctxkit.pretraining.train import PretrainingModel, held_out_evaluation
    from ctxkit.tokenizers import WordPieceTokenizer

    shards = few_shards
    rc = main(["pretrain", "--data", str(shards), "--eval-data", str(shards), "--preset", "bert_2_128_2", "--out", str(tmp_path / "run"),
               "--epochs", "2", "--batch-size", "8", "--device", "cpu", "--no-progress", "--log-every", "100"])
    assert rc == 0
    records = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["event"] == "eval"]
    data = PretrainDataset(shards)
    assert [r["epoch"] for r in evals] == [0, 1] and all(r["sequences"] == len(data) for r in evals)
    assert all(0 <= r["mlm_acc"] <= 1 and 0 <= r["nsp_acc"] <= 1 and r["mlm_loss"] > 0 for r in evals)

    tokenizer = WordPieceTokenizer.from_dir(data.meta["tokenizer"]["path"])
    torch.manual_seed(0)
    model = PretrainingModel(get_preset("bert_2_128_2").config.replace(vocab_size=tokenizer.vocab_size, max_position=512))
    collator, keys = MLMCollator(tokenizer, MaskingConfig(max_predictions=6), seed=1), []

    def counting(examples, key=None):
        keys.append(key)
        return collator(examples, key=key)

    evaluate = held_out_evaluation(data, counting, 8, torch.device("cpu"), "fp32")
    first = evaluate(model)
    batches = len(keys)
    second = evaluate(model)
    assert first == second and model.training  # same masks; the model handed back in training mode
    assert batches == -(-len(data) // 8) and len(keys) == batches  # kept: the second evaluation collated nothing
    assert abs(first["mlm_loss"] - torch.log(torch.tensor(float(tokenizer.vocab_size))).item()) < 1.5 and first["mlm_acc"] < 0.05
    # Over the budget for kept batches they are collated at every evaluation, with the same numbers.
    monkeypatch.setattr(train_module, "EVAL_CACHE_BYTES", 0)
    evaluate = held_out_evaluation(data, counting, 8, torch.device("cpu"), "fp32")
    assert evaluate(model) == evaluate(model) == first and len(keys) == 3 * batches
