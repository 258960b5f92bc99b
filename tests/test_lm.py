"""Causal LM: sliding-window perplexity (definition, and parity with the Hugging Face
recipe on the same weights) and training a small GPT-2 from scratch on real text."""

import math

import pytest
import torch

from ctxkit.models.gpt2.model import GPT2Config, GPT2LMHeadModel, load_gpt2
from ctxkit.pretraining.lm import perplexity, train_lm
from ctxkit.tokenizers import ByteLevelBPETokenizer

CONFIG = GPT2Config(num_layers=2, hidden_size=64, num_heads=4, vocab_size=120, max_position=32, ffn_size=256)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPT2LMHeadModel(CONFIG).eval()


def _nll(model, window):
    with torch.no_grad():
        logp = model(window[None])[0, :-1].log_softmax(-1)
    return -logp.gather(1, window[1:, None])[:, 0]


def test_perplexity_definition(model):
    ids = torch.randint(0, 120, (100,), generator=torch.Generator().manual_seed(1))
    # Non-overlapping windows: each window's own predictions.
    chunks = [ids[i : i + 32] for i in range(0, 100, 32)]
    nll = torch.cat([_nll(model, c) for c in chunks if len(c) > 1])
    out = perplexity(model, ids, max_length=32, stride=32, device="cpu")
    assert out["tokens"] == len(nll) == 100 - 4
    assert out["nll"] == pytest.approx(nll.mean().item(), rel=1e-5)
    assert out["perplexity"] == pytest.approx(math.exp(out["nll"]), rel=1e-6)
    # Stride 1: every token gets the longest context the window allows.
    full = perplexity(model, ids[:32], max_length=32, stride=1, device="cpu")
    assert full["tokens"] == 31 and full["nll"] == pytest.approx(_nll(model, ids[:32]).mean().item(), rel=1e-5)
    with pytest.raises(ValueError, match="stride"):
        perplexity(model, ids, max_length=32, stride=40)


def test_perplexity_matches_the_transformers_recipe(model, tmp_path):
    transformers = pytest.importorskip("transformers")
    from ctxkit.models.gpt2.model import save_gpt2

    save_gpt2(model, tmp_path)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, 120, (1, 150), generator=torch.Generator().manual_seed(2))
    max_length, stride = 32, 12
    # The recipe of the transformers documentation ("Perplexity of fixed-length models").
    nll_sum, n_tokens, prev_end = 0.0, 0, 0
    for begin in range(0, ids.size(1), stride):
        end = min(begin + max_length, ids.size(1))
        trg_len = end - prev_end
        input_ids = ids[:, begin:end]
        target_ids = input_ids.clone()
        target_ids[:, :-trg_len] = -100
        with torch.no_grad():
            loss = hf(input_ids, labels=target_ids).loss
        valid = (target_ids[:, 1:] != -100).sum().item()  # the model shifts the labels by one
        nll_sum += loss.item() * valid
        n_tokens += valid
        prev_end = end
        if end == ids.size(1):
            break
    ours = perplexity(model, ids[0], max_length, stride, device="cpu")
    assert ours["tokens"] == n_tokens
    assert ours["perplexity"] == pytest.approx(math.exp(nll_sum / n_tokens), rel=1e-5)


def test_train_small_gpt_on_ptb(shared_data, tmp_path):
    from ctxkit.training import TrainConfig

    valid = shared_data / "ptb" / "ptb.valid.txt.xz"
    test = shared_data / "ptb" / "ptb.test.txt.xz"
    config = TrainConfig(epochs=1, batch_size=16, lr=3e-3, warmup_ratio=0.1, device="cpu", progress=False, log_every=10,
                         max_steps=30, seed=0)
    # Validation windows side by side (stride 64, not the default 32): every test token is still
    # scored once, at half the forward passes (the validation pass was half this test's time).
    summary = train_lm([valid], [test], "gpt2_2_128_2", tmp_path / "run", config, vocab_size=1000, block_size=64,
                       eval_stride=64)
    tokenizer = ByteLevelBPETokenizer.from_dir(tmp_path / "run" / "best")
    model = load_gpt2(tmp_path / "run" / "best")
    assert model.config.vocab_size == tokenizer.vocab_size == 1000
    # An untrained model is near-uniform over 1000 tokens (perplexity ~1000); 30 steps learn PTB's frequent tokens.
    assert summary["best_perplexity"] < 300, summary
    assert summary["valid"]["tokens"] > 50_000


def test_cli_lm_train_and_perplexity(shared_data, tmp_path, capsys):
    import json

    from ctxkit.cli import main

    from ctxkit.tokenizers import read_lines

    lines = list(read_lines(shared_data / "ptb" / "ptb.valid.txt.xz"))[:400]  # a slice of real text keeps this quick
    valid = str(tmp_path / "ptb_slice.txt")
    (tmp_path / "ptb_slice.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    rc = main(["lm-train", "--train", valid, "--valid", valid, "--preset", "gpt2_2_128_2", "--out", str(tmp_path / "run"),
               "--vocab-size", "600", "--block-size", "32", "--max-steps", "3", "--batch-size", "8", "--device", "cpu", "--no-progress"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 3 and summary["valid"]["perplexity"] > 1
    rc = main(["perplexity", str(tmp_path / "run" / "best"), valid, "--stride", "16", "--device", "cpu", "--no-progress"])
    assert rc == 0
    line = json.loads(capsys.readouterr().out)
    assert line["perplexity"] == pytest.approx(summary["valid"]["perplexity"], rel=1e-5)  # the same stream, windows and model
    words = sum(len(t.split()) + 1 for t in read_lines(valid))
    assert line["words"] == words
    assert math.log(line["word_perplexity"]) * words == pytest.approx(line["nll"] * line["tokens"], rel=1e-9)


def test_cli_lm_train_reports_every_phase_on_clean_lines(shared_data, tmp_path, capsys):
    """With progress on, stderr read as a terminal shows it: a bar for the vocabulary, the
    tokenising, training and validation; no blank lines (the tokenizers library's own bars
    printed them, to stdout); the epoch line and the time-budget message (once) each on a
    line of their own, not glued to the end of the train bar."""
    import json

    from terminal import screen_lines

    from ctxkit.cli import main
    from ctxkit.tokenizers import read_lines

    lines = list(read_lines(shared_data / "ptb" / "ptb.valid.txt.xz"))
    (tmp_path / "train.txt").write_text("\n".join(lines[:24]) + "\n", encoding="utf-8")  # 4 steps an epoch
    (tmp_path / "valid.txt").write_text("\n".join(lines[24:34]) + "\n", encoding="utf-8")
    common = ["--train", str(tmp_path / "train.txt"), "--valid", str(tmp_path / "valid.txt"), "--preset", "gpt2_2_128_2",
              "--block-size", "32", "--batch-size", "16", "--device", "cpu"]

    def run(*options):
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # a tiny model: a second thread only adds synchronisation on a shared CPU
        try:
            assert main(["lm-train", *common, *options]) == 0
        finally:
            torch.set_num_threads(threads)
        out, err = capsys.readouterr()
        assert out.startswith("{") and json.loads(out)["steps"] >= 1  # nothing but the JSON summary on stdout
        screen = screen_lines(err)
        assert "" not in screen, screen  # no blank lines
        assert "\x1b[" not in err  # no cursor movement (a second bar line) to garble a log file
        return err, screen

    err, screen = run("--out", str(tmp_path / "run"), "--vocab-size", "300", "--epochs", "1")
    assert any(line.startswith("vocabulary: ") and "300 tokens" in line for line in screen), screen
    assert any(line.startswith("tokenize valid.txt: 100%") for line in screen)
    assert "\rvalidation:" in err  # the validation pass had its bar (erased when done)
    epoch_lines = [line for line in screen if "epoch 0:" in line]
    assert len(epoch_lines) == 1 and epoch_lines[0].startswith("ctxkit: epoch 0: perplexity="), screen
    assert screen[-1].startswith("train: 100%")

    # Stopped by the time budget after the first step (the trained tokenizer, so no vocabulary phase).
    err, screen = run("--out", str(tmp_path / "budget"), "--tokenizer", str(tmp_path / "run" / "best"), "--epochs", "2",
                      "--max-minutes", "0.000001")
    assert err.count("time budget") == 1
    assert [line for line in screen if "time budget" in line] == ["ctxkit: time budget of 1e-06 min reached at step 1"]
    assert "\rvalidation:" in err and not any(line.startswith("vocabulary") for line in screen)
