"""The shared training core (ctxkit.core.run_state): RNG capture / restore, checkpoint
folders, word2vec's resume through them, and predict()'s precision."""

import random

import numpy as np
import pytest
import torch

from ctxkit.core.durable import MANIFEST, IncompleteFolderError
from ctxkit.core.errors import MissingFileError, UserError
from ctxkit.core.run_state import (capture_rng, load_checkpoint, resolve_precision, restore_rng, save_checkpoint)
from ctxkit.heads.classification import EncoderWithHead, SequenceClassificationHead
from ctxkit.models import BertModel, get_preset
from ctxkit.pretraining.word2vec import train_word2vec
from ctxkit.training import predict
from tolerance import assert_close_to_reference, through_linear


def _draws(gen: np.random.Generator):
    out = [random.random(), random.getrandbits(64), float(np.random.rand()), np.random.randint(0, 1 << 30, 5).tolist(),
           torch.rand(4), torch.randint(0, 1000, (3,)), gen.random(3).tolist(), gen.integers(0, 1 << 40, 2).tolist()]
    if torch.cuda.is_available():
        out.append(torch.rand(4, device="cuda").cpu())
    return out


def _same(a, b) -> bool:
    return all(torch.equal(x, y) if torch.is_tensor(x) else x == y for x, y in zip(a, b, strict=True))


def test_rng_round_trip_reproduces_every_generator(tmp_path):
    gen = np.random.default_rng(7)
    _draws(gen)  # move every generator off its seed
    state = capture_rng({"mine": gen})
    first = _draws(gen)
    # Through the file format of a checkpoint (weights_only loading) and back.
    torch.save(state, tmp_path / "rng.pt")
    restore_rng(torch.load(tmp_path / "rng.pt", weights_only=True), {"mine": gen})
    assert _same(_draws(gen), first)
    restore_rng(state, {"mine": gen})  # and straight from memory
    assert _same(_draws(gen), first)
    with pytest.raises(UserError, match="no state for the random generator 'other'"):
        restore_rng(state, {"other": np.random.default_rng(0)})
    # An older checkpoint that kept only torch's state restores that and leaves the rest alone.
    restore_rng({"torch": state["torch"]})
    assert torch.equal(torch.rand(4), first[4])


def test_checkpoint_save_load_round_trip(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(torch.randn(2, 5)).sum().backward()
    opt.step()
    folder = tmp_path / "run" / "checkpoint"
    with pytest.raises(MissingFileError, match="no checkpoint to resume from"):
        load_checkpoint(folder)
    trainer_state = {"step": 3, "losses": [0.1, 1 / 3], "position": {"epoch": 0, "chunk": 2}}
    save_checkpoint(folder, model_state=model.state_dict(), optimizer_state=opt.state_dict(), trainer_state=trainer_state,
                    extra={"scheduler": {"last_epoch": 3}})
    after = torch.rand(3)
    assert (folder / MANIFEST).is_file() and sorted(p.name for p in folder.iterdir()) == \
        [MANIFEST, "model.safetensors", "optimizer.pt", "trainer_state.json"]
    ckpt = load_checkpoint(folder)
    assert ckpt.trainer_state == trainer_state and ckpt.extra["scheduler"] == {"last_epoch": 3}
    assert all(torch.equal(ckpt.model_state[k], v) for k, v in model.state_dict().items())
    twin = torch.optim.Adam(torch.nn.Linear(5, 3).parameters(), lr=1e-2)
    twin.load_state_dict(ckpt.optimizer_state)
    for k, v in opt.state_dict()["state"][0].items():
        assert torch.equal(twin.state_dict()["state"][0][k], v)
    restore_rng(ckpt.rng)
    assert torch.equal(torch.rand(3), after)
    # Saved again: the folder is replaced whole; a changed file is caught by the manifest.
    save_checkpoint(folder, model_state=model.state_dict(), optimizer_state=None, trainer_state={"step": 4}, rng=False)
    assert load_checkpoint(folder).trainer_state == {"step": 4} and load_checkpoint(folder).rng is None
    (folder / "trainer_state.json").write_text('{"step": 5}')
    with pytest.raises(IncompleteFolderError, match="trainer_state.json"):
        load_checkpoint(folder)


def _topic_corpus(n=400, seed=0):
    g = np.random.default_rng(seed)
    topics = [[f"t{t}w{i}" for i in range(8)] for t in range(3)]
    return [list(g.choice(topics[g.integers(3)], size=int(g.integers(3, 9)))) for _ in range(n)]


class _Kill(Exception):
    pass


class _KillAfter:
    """A callback that stops training (as a crash would) after ``n`` chunks."""

    def __init__(self, n):
        self.n = n

    def on_train_begin(self, info):
        pass

    def on_log(self, step, record):
        self.n -= 1
        if self.n == 0:
            raise _Kill

    def on_train_end(self, summary):
        pass

    def close(self):
        pass


@pytest.mark.parametrize("optimizer,subwords", [("sgd", False), ("sparse_adam", True)])
def test_word2vec_resume_is_bit_exact(tmp_path, optimizer, subwords):
    sentences = _topic_corpus()
    kwargs = dict(model="skipgram", optimizer=optimizer, subwords=subwords, buckets=500, dim=12, window=3, min_count=1,
                  epochs=3, batch_size=64, chunk_tokens=300, progress=False, seed=3, save_every=2)
    whole = train_word2vec(sentences, checkpoint=tmp_path / "whole", **kwargs)
    for kill_after in (3, 7):  # mid-epoch, between two saves (work since the last save is redone), and again
        run = tmp_path / f"cut{kill_after}"
        with pytest.raises(_Kill):
            train_word2vec(sentences, checkpoint=run, callbacks=[_KillAfter(kill_after)], **kwargs)
        resumed = train_word2vec(sentences, checkpoint=run, resume=True, **kwargs)
        assert torch.equal(torch.as_tensor(resumed.vectors), torch.as_tensor(whole.vectors))
        if subwords:
            assert torch.equal(torch.as_tensor(resumed.ngram_vectors), torch.as_tensor(whole.ngram_vectors))
        assert resumed.meta["epoch_losses"] == whole.meta["epoch_losses"]
        assert resumed.meta["examples"] == whole.meta["examples"]
    with pytest.raises(UserError, match="cannot resume with other settings"):
        train_word2vec(sentences, checkpoint=tmp_path / "whole", resume=True, **{**kwargs, "dim": 10})
    # No checkpoint yet (a crash before the first save): resume starts from the beginning (issue 39 item 6).
    fresh = train_word2vec(sentences, checkpoint=tmp_path / "none", resume=True, **kwargs)
    assert torch.equal(torch.as_tensor(fresh.vectors), torch.as_tensor(whole.vectors))


def test_word2vec_cli_resume(tmp_path):
    from ctxkit.cli import main

    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(" ".join(s) + "\n" for s in _topic_corpus(200)), encoding="utf-8")
    args = ["word2vec-train", str(corpus), "--dim", "8", "--min-count", "1", "--epochs", "2", "--no-progress",
            "--checkpoint", str(tmp_path / "ck")]
    assert main(args + ["--out", str(tmp_path / "a.npz")]) == 0
    assert (tmp_path / "ck" / MANIFEST).is_file()
    # Resuming a finished run repeats nothing and gives the same vectors.
    assert main(args + ["--resume", "--out", str(tmp_path / "b.npz")]) == 0
    a, b = np.load(tmp_path / "a.npz"), np.load(tmp_path / "b.npz")
    assert all(np.array_equal(a[k], b[k]) for k in a.files if k != "meta_json")  # meta: seconds, words/s


TINY = get_preset("bert_2_128_2").config.replace(vocab_size=50, hidden_size=32, num_heads=2, ffn_size=64, max_position=32,
                                                   dropout=0.0, attention_dropout=0.0)


def test_predict_precision_on_cpu():
    torch.manual_seed(0)
    model = EncoderWithHead(BertModel(TINY), SequenceClassificationHead(32, 3, 0.0))
    g = torch.Generator().manual_seed(1)
    feats = []
    for _ in range(12):
        n = int(torch.randint(4, 20, (1,), generator=g))
        feats.append({"input_ids": torch.randint(4, 50, (n,), generator=g).tolist(), "attention_mask": [1] * n})
    default = np.stack(predict(model, feats, batch_size=5, device="cpu"))
    assert np.array_equal(np.stack(predict(model, feats, batch_size=5, device="cpu", precision="fp32")), default)
    assert np.array_equal(np.stack(predict(model, feats, batch_size=5, device="cpu", precision="auto")), default)
    bf16 = np.stack(predict(model, feats, batch_size=5, device="cpu", precision="bf16"))
    assert not np.array_equal(bf16, default)  # autocast did run
    # bf16 vs the fp32 result (exact to bf16's precision): 2 layers + the embeddings' LayerNorm,
    # each reducing over at most the FFN width; the logits' scale is the head's on the hidden states.
    with torch.no_grad():
        hidden = max(float(model.encoder(torch.tensor([f["input_ids"]])).last_hidden_state.abs().max()) for f in feats)
    assert_close_to_reference(torch.from_numpy(bf16), torch.from_numpy(default).double(), dtype=torch.bfloat16,
                              scale=through_linear(model.head.classifier.weight, hidden), depth=3, k=64, name="bf16 logits")
    with pytest.raises(UserError, match="precision must be"):
        predict(model, feats, device="cpu", precision="fp16")
    assert resolve_precision(None, torch.device("cuda")) == "bf16" and resolve_precision("auto", torch.device("cpu")) == "fp32"
