"""Word-level Transformer-XL LM training/evaluation (ctxkit.pretraining.xl_lm) on tiny synthetic corpora."""

import json
import os
import random

import pytest
import torch


from ctxkit.models.transformer_xl.model import TransformerXLConfig
from ctxkit.cli import main as cli_main
from ctxkit.pretraining import xl_lm
from ctxkit.pretraining.xl_lm import (XLTrainConfig, build_model, build_xl_vocab, evaluate_xl_lm, load_xl_lm, make_rows,
                                      train_xl_lm, xl_stream)

TINY = TransformerXLConfig(vocab_size=0, d_model=32, n_heads=2, d_inner=64, n_layers=2, dropout=0.0, cutoffs=(), div_val=1,
                           mem_len=16, tgt_len=8)


@pytest.fixture(autouse=True)
def _few_threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _repeat_corpus(path, lines, width=12, words=20, seed=0):
    """Each line: ``width`` random words then the same words again (a repeat 12 tokens back)."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(lines):
            first = [f"w{rng.randrange(words)}" for _ in range(width)]
            f.write(" ".join(first + first) + "\n")
    return path


def _cfg(**kw):
    base = dict(batch_size=4, tgt_len=8, mem_len=16, max_steps=12, lr=3e-3, warmup_steps=2, eval_batch_size=2, save_every=5,
                log_every=2, device="cpu", progress=False)
    base.update(kw)
    return XLTrainConfig(**base)


def test_vocab_stream_and_rows(tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("a b a\n\nc <unk>\n", encoding="utf-8")
    vocab = build_xl_vocab([f])
    assert vocab[0] == "<eos>" and vocab[1] == "a" and "<unk>" in vocab
    ids = xl_stream([f], vocab).tolist()
    assert [vocab[i] for i in ids] == ["a", "b", "a", "<eos>", "<eos>", "c", "<unk>", "<eos>"]
    inputs, targets, weights = make_rows(torch.tensor(ids), 3, pad=True)
    assert int(weights.sum()) == len(ids) - 1  # every token after the first is predicted once
    flat_t = targets.flatten()[weights.flatten() > 0].tolist()
    assert flat_t == ids[1:] and inputs.flatten()[: len(ids) - 1].tolist() == ids[:-1]


def test_vocab_cap_keeps_the_most_frequent_words(tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("a a a b b c\nd a b\n", encoding="utf-8")  # a:4 b:3 <eos>:2 c:1 d:1
    assert build_xl_vocab([f], max_size=4) == ["a", "b", "<eos>", "<unk>"]
    assert build_xl_vocab([f], max_size=3) == ["a", "<eos>", "<unk>"]  # <eos> is never dropped
    vocab = build_xl_vocab([f], max_size=4)
    assert [vocab[i] for i in xl_stream([f], vocab).tolist()] == "a a a b b <unk> <eos> <unk> a b <eos>".split()
    with pytest.raises(ValueError, match="at least 3"):
        build_xl_vocab([f], max_size=2)


def test_memory_helps_on_long_range_repeats(tmp_path):
    train = _repeat_corpus(tmp_path / "train.txt", 120)
    valid = _repeat_corpus(tmp_path / "valid.txt", 12, seed=1)
    summary = train_xl_lm([train], [valid], tmp_path / "run", TINY, _cfg(max_steps=500, batch_size=8, warmup_steps=10, clip_norm=1.0,
                                                                             save_every=1000, log_every=50))
    model, vocab = load_xl_lm(tmp_path / "run" / "final")
    stream = xl_stream([valid], vocab)
    with_mem = evaluate_xl_lm(model, stream, 8, mem_len=16, batch_size=2, device="cpu")
    no_mem = evaluate_xl_lm(model, stream, 8, mem_len=0, batch_size=2, device="cpu")
    # The repeat is 12 tokens back, farther than any 8-token segment reaches alone.
    assert with_mem["perplexity"] < 0.6 * no_mem["perplexity"], (with_mem, no_mem)
    assert with_mem["tokens"] == no_mem["tokens"] == len(stream) - 1
    assert summary["valid"]["perplexity"] == pytest.approx(with_mem["perplexity"], rel=1e-4)
    assert model.transformer.mem_len == 16  # restored after the evaluation


def test_resume_equals_uninterrupted(tmp_path):
    train = _repeat_corpus(tmp_path / "train.txt", 30)
    cfg = TINY.replace(dropout=0.1)  # dropout makes the RNG state matter
    full = train_xl_lm([train], [], tmp_path / "a", cfg, _cfg())
    first = train_xl_lm([train], [], tmp_path / "b", cfg, _cfg(stop_step=7))
    assert first["steps"] == 7
    resumed = train_xl_lm([train], [], tmp_path / "b", cfg, _cfg(), resume=True)
    assert resumed["steps"] == full["steps"] == 12
    assert resumed["losses"] == full["losses"]
    a, b = load_xl_lm(tmp_path / "a" / "final")[0], load_xl_lm(tmp_path / "b" / "final")[0]
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    with pytest.raises(Exception, match="changed settings"):
        train_xl_lm([train], [], tmp_path / "b", cfg, _cfg(batch_size=2), resume=True)
    # A run of an earlier version (one checkpoint.pt) resumes the same way.
    import shutil

    from ctxkit.core.run_state import load_checkpoint

    train_xl_lm([train], [], tmp_path / "c", cfg, _cfg(stop_step=7))
    ckpt = load_checkpoint(tmp_path / "c" / "checkpoint")
    torch.save({"run": ckpt.trainer_state["run"], "train_config": ckpt.trainer_state["train_config"], "model": ckpt.model_state,
                "optimizer": ckpt.optimizer_state, "mems": ckpt.extra["mems"], "rng": ckpt.rng}, tmp_path / "c" / "checkpoint.pt")
    shutil.rmtree(tmp_path / "c" / "checkpoint")
    assert train_xl_lm([train], [], tmp_path / "c", cfg, _cfg(), resume=True)["losses"] == full["losses"]


def test_resume_without_a_checkpoint_starts_from_the_beginning(tmp_path, caplog):
    """A command that crashed before its first checkpoint can simply be run again with --resume
    (issue 39 item 6): a one-line note, then the run a fresh start gives; a finished run whose
    checkpoint is gone is refused in one line instead of being trained over."""
    import shutil

    from ctxkit.core.errors import UserError

    train = _repeat_corpus(tmp_path / "train.txt", 30)
    cfg = TINY.replace(dropout=0.1)
    fresh = train_xl_lm([train], [], tmp_path / "fresh", cfg, _cfg(max_steps=6))
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    (crashed / "vocab.txt").write_text("half a vocabulary\n")  # what a crash before the first checkpoint may leave
    with caplog.at_level("INFO", logger="ctxkit"):
        again = train_xl_lm([train], [], crashed, cfg, _cfg(max_steps=6), resume=True)
    notes = [r.getMessage() for r in caplog.records if "no complete checkpoint to resume from" in r.getMessage()]
    assert notes == [f"{crashed / 'checkpoint'}: no complete checkpoint to resume from: starting from the beginning"]
    assert again["losses"] == fresh["losses"] and again["steps"] == 6
    shutil.rmtree(crashed / "checkpoint")
    with pytest.raises(UserError, match="from a finished run with no checkpoint left to resume from"):
        train_xl_lm([train], [], crashed, cfg, _cfg(max_steps=6), resume=True)


def test_no_memory_eval_equals_independent_segments(tmp_path):
    torch.manual_seed(0)
    model = build_model("xl", TINY.replace(vocab_size=30, mem_len=16))
    stream = torch.randint(0, 30, (83,))
    got = evaluate_xl_lm(model, stream, 8, mem_len=0, batch_size=2, device="cpu", precision="fp32")
    inputs, targets, weights = make_rows(stream, 2, pad=True)
    total = 0.0
    with torch.no_grad():
        model.eval()
        for s in range(0, inputs.size(1), 8):
            for row in range(2):
                out = model(inputs[row : row + 1, s : s + 8], labels=targets[row : row + 1, s : s + 8])
                total += (out.nll[0] * weights[row, s : s + 8]).sum().item()
    assert got["tokens"] == 82
    assert got["nll"] == pytest.approx(total / 82, rel=1e-5)
    with_mem = evaluate_xl_lm(model, stream, 8, mem_len=16, batch_size=2, device="cpu", precision="fp32")
    assert with_mem["nll"] != pytest.approx(got["nll"], rel=1e-6)  # memory changes the scores


def test_checkpoint_written_as_a_unit(tmp_path):
    from ctxkit.core.durable import MANIFEST, verify_manifest

    train = _repeat_corpus(tmp_path / "train.txt", 30)
    train_xl_lm([train], [], tmp_path / "run", TINY, _cfg(max_steps=6))
    folder = tmp_path / "run" / "checkpoint"  # ctxkit.core.run_state: swapped in whole, with a manifest
    assert verify_manifest(folder) and (folder / MANIFEST).is_file()
    assert not [p for p in os.listdir(tmp_path / "run") if p.endswith(".tmp") or p.startswith(".checkpoint")]
    state = json.loads((folder / "trainer_state.json").read_text())
    blob = torch.load(folder / "optimizer.pt", weights_only=True)
    assert state["run"]["step"] == 6 and len(blob["mems"]) == TINY.n_layers


def test_vanilla_same_code_path(tmp_path):
    train = _repeat_corpus(tmp_path / "train.txt", 30)
    valid = _repeat_corpus(tmp_path / "valid.txt", 4, seed=1)
    summary = train_xl_lm([train], [valid], tmp_path / "v", TINY, _cfg(model="vanilla"))
    assert summary["architecture"]["mem_len"] == 0 and summary["steps"] == 12
    model, vocab = load_xl_lm(tmp_path / "v" / "final")
    assert isinstance(model, xl_lm.VanillaTransformerLM) and not hasattr(model.transformer, "layers")
    assert model.transformer.pos_emb.num_embeddings == 8
    r = evaluate_xl_lm(model, xl_stream([valid], vocab), 8, mem_len=64, batch_size=2, device="cpu")
    assert r["perplexity"] == pytest.approx(summary["valid"]["perplexity"], rel=1e-4)


def test_cli_end_to_end(tmp_path, capsys):
    train = _repeat_corpus(tmp_path / "train.txt", 30)
    valid = _repeat_corpus(tmp_path / "valid.txt", 4, seed=1)
    test = _repeat_corpus(tmp_path / "test.txt", 4, seed=2)
    out = tmp_path / "cli"
    rc = cli_main(["train-transformer-xl", "--train", str(train), "--valid", str(valid), "--test", str(test), "--out", str(out), "--model", "xl",
                     "--d-model", "32", "--n-heads", "2", "--d-inner", "64", "--n-layers", "2", "--tgt-len", "8",
                     "--mem-len", "8", "--batch-size", "4", "--max-steps", "4", "--eval-mem-lens", "0", "16", "32",
                     "--device", "cpu", "--no-progress"])
    assert rc == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results["test"]) == {"mem_len=0", "mem_len=16", "mem_len=32"}
    assert results["train_tokens_per_s"] > 0 and all(r["tokens_per_s"] > 0 for r in results["test"].values())
    assert results["architecture"]["cutoffs"] == []  # the preset's cutoffs do not fit this vocabulary
    assert {"model.safetensors", "config.json", "vocab.txt"} <= set(os.listdir(out / "final"))
    assert json.loads(capsys.readouterr().out)["steps"] == 4
