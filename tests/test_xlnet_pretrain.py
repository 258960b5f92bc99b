"""XLNet permutation-LM pretraining: collator masks vs labels, learning on a synthetic
corpus, exact resume, and the CLI on a tiny shard folder."""

import json
import random

import pytest
import torch

from ctxkit.zoo.presets import XLNetConfig
from ctxkit.models.xlnet.model import load_xlnet
from ctxkit.cli import main as cli_main
from ctxkit.pretraining.xlnet_pretrain import IGNORE_INDEX, XLNetCollator, pretrain_xlnet, to_xlnet_layout
from ctxkit.training import TrainConfig

PAD, CLS, SEP = 0, 1, 2
VOCAB = 40


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    yield


def _counting(n, seed=0, lo=8, hi=24):
    """Sequences of consecutive ids (mod the non-special range): every token is its left
    neighbour + 1, so a context token next to a target determines it."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        start, length = rng.randrange(3, VOCAB), rng.randrange(lo, hi + 1)
        out.append({"input_ids": [3 + (start - 3 + t) % (VOCAB - 3) for t in range(length)]})
    return out


def _losses(run):
    return [r["loss"] for r in map(json.loads, (run / "log.jsonl").read_text().splitlines()) if r.get("event") == "train"]


def _tiny(**kw):
    return XLNetConfig(vocab_size=VOCAB, d_model=64, n_heads=4, d_inner=128, n_layers=2, dropout=0.0, **kw)


def _cfg(**kw):
    base = dict(batch_size=16, lr=3e-3, warmup_ratio=0.05, device="cpu", progress=False, log_every=10,
                eval_each_epoch=False, seed=3, weight_decay=0.0, group_factor=0)
    return TrainConfig(**{**base, **kw})


def test_layout_of_a_shard_instance():
    feat = {"input_ids": [CLS, 10, 11, SEP, 20, 21, 22, SEP], "token_type_ids": [0, 0, 0, 0, 1, 1, 1, 1]}
    ids, tt, content = to_xlnet_layout(feat, CLS, SEP)
    assert ids == [10, 11, SEP, 20, 21, 22, SEP, CLS]
    assert tt == [0, 0, 0, 1, 1, 1, 1, 2]
    assert content == [True, True, False, True, True, True, False, False]
    assert to_xlnet_layout([5, 6], CLS, SEP) == ([5, 6, SEP, CLS], [0, 0, 0, 2], [True, True, False, False])


def test_collator_masks_agree_with_labels():
    feats = _counting(12, seed=1, lo=3, hi=30)
    coll = XLNetCollator(PAD, CLS, SEP, K=6, seed=0)
    b = coll(feats, key=(0, 1))
    batch, seq = b["input_ids"].shape
    assert b["perm_mask"].shape == (batch, seq, seq) and b["target_mapping"].shape[:2] == b["labels"].shape
    for i, f in enumerate(feats):
        n = len(f["input_ids"])
        n_pred = max(1, round(n / 6))
        assert int(b["num_predict"][i]) == n_pred
        assert int((b["labels"][i] != IGNORE_INDEX).sum()) == n_pred
        assert int(b["attention_mask"][i].sum()) == n + 2
        tm = b["target_mapping"][i]
        assert torch.equal(tm[:n_pred].sum(-1), torch.ones(n_pred)) and not tm[n_pred:].any()
        assert (b["labels"][i, n_pred:] == IGNORE_INDEX).all()
        pos = tm[:n_pred].argmax(-1)
        assert len(set(pos.tolist())) == n_pred
        # each target row picks the position whose label it predicts; padding and specials never targets
        assert torch.equal(b["input_ids"][i, pos], b["labels"][i, :n_pred])
        assert (pos < n).all()
        # a target's query stream hides its own token; every target is hidden from non-targets
        pm = b["perm_mask"][i]
        assert (pm[pos, pos] == 1).all()
        others = torch.ones(seq, dtype=torch.bool)
        others[pos] = False
        assert (pm[others][:, pos] == 1).all() and (pm[:, others] == 0).all()
        # targets form a chain: the m-th target (factorisation order) sees exactly the earlier ones
        sees = (pm[pos][:, pos] == 0).sum(-1)
        assert sorted(sees.tolist()) == list(range(n_pred))
    # keyed draws are reproducible and differ between keys
    again = coll(feats, key=(0, 1))
    assert torch.equal(again["perm_mask"], b["perm_mask"]) and torch.equal(again["labels"], b["labels"])
    assert not torch.equal(coll(feats, key=(0, 2))["perm_mask"], b["perm_mask"])


def test_tiny_xlnet_learns_the_synthetic_corpus(tmp_path):
    summary = pretrain_xlnet(_counting(256), _tiny(), tmp_path, _cfg(epochs=20, max_steps=150),
                             special_ids={"pad_id": PAD, "cls_id": CLS, "sep_id": SEP})
    losses = _losses(tmp_path)
    assert losses[0] > 3.0  # ~ln(40) at the start
    assert losses[-1] < 0.5 * losses[0], losses
    model = load_xlnet(summary["final"])
    assert model.config.vocab_size == VOCAB and model.config.n_layers == 2


def test_resume_equals_uninterrupted(tmp_path):
    data, ids = _counting(64, seed=2), {"pad_id": PAD, "cls_id": CLS, "sep_id": SEP}
    pretrain_xlnet(data, _tiny(), tmp_path / "full", _cfg(epochs=2, max_steps=6, log_every=1), special_ids=ids)
    pretrain_xlnet(data, _tiny(), tmp_path / "cut", _cfg(epochs=2, max_steps=3, log_every=1), special_ids=ids)
    torch.manual_seed(99)
    pretrain_xlnet(data, _tiny(), tmp_path / "cut", _cfg(epochs=2, max_steps=6, log_every=1), special_ids=ids, resume=True)
    full = _losses(tmp_path / "full")
    assert len(full) == 6
    assert _losses(tmp_path / "cut") == full  # bit-identical: the same computation, resumed


def test_cli_end_to_end_on_tiny_shards(tmp_path):
    from ctxkit.pretraining.shards import PretrainDataset, build_shards, train_vocab

    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "river", "stone", "light", "north", "green", "table"]
    docs = ["\n".join(" ".join(rng.choice(words) for _ in range(rng.randrange(4, 10))) + "." for _ in range(6))
            for _ in range(12)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(docs) + "\n")
    train_vocab([corpus], 60, tmp_path / "tok", min_frequency=1, show_progress=False)
    build_shards([corpus], tmp_path / "tok", tmp_path / "shards", max_seq_len=32, workers=1, show_progress=False)
    data = PretrainDataset(tmp_path / "shards")
    inst = data[0]
    b = XLNetCollator(data.pad_id, data.cls_id, data.sep_id)([inst], key=(0, 0))
    len_a = inst["token_type_ids"].count(0)
    assert b["input_ids"][0].tolist() == inst["input_ids"][1:] + [data.cls_id]  # A <sep> B <sep> <cls>
    assert b["token_type_ids"][0].tolist() == [0] * (len_a - 1) + [1] * (len(inst["input_ids"]) - len_a) + [2]
    pos = b["target_mapping"][0].argmax(-1)
    assert not any(t in (data.cls_id, data.sep_id) for t in b["input_ids"][0, pos].tolist())
    assert len(pos) == round((len(inst["input_ids"]) - 3) / 6)
    out = tmp_path / "run"
    rc = cli_main(["pretrain-xlnet", "--data", str(tmp_path / "shards"), "--preset", "xlnet_12_768_12", "--d-model", "32", "--n-layers", "1",
               "--n-heads", "2", "--d-inner", "64", "--out", str(out), "--max-steps", "3", "--batch-size", "4",
               "--log-every", "1", "--device", "cpu", "--no-progress", "--lr", "1e-3"])
    assert rc == 0
    losses = _losses(out)
    assert len(losses) == 3 and all(x == x for x in losses)
    assert (out / "checkpoint").is_dir() and (out / "summary.json").is_file()  # stopped mid-epoch: resumable
    model = load_xlnet(out / "final")
    assert model.config.d_model == 32 and model.config.vocab_size == json.loads((tmp_path / "shards" / "meta.json").read_text())["tokenizer"]["vocab_size"]
    assert (out / "final" / "vocab.txt").is_file()
