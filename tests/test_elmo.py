"""ELMo: character ids, the biLM's directions, ScalarMix, bilm-tf hdf5 weights, pretraining."""

import json
import math
import random

import numpy as np
import pytest
import torch

from ctxkit.core.checkpoint import CheckpointError, CheckpointMismatchError
from ctxkit.models.elmo.model import (
    ELMO_PRESETS,
    ElmoBiLM,
    ElmoConfig,
    ElmoLanguageModel,
    ScalarMix,
    elmo_embed,
    reverse_padded,
    sampled_softmax_nll,
)
from ctxkit.models.elmo.chars import batch_to_char_ids, word_to_char_ids
from ctxkit.models.elmo.io import bilm_tf_shapes, load_bilm_tf, load_elmo_lm, read_options, write_bilm_tf
from ctxkit.models.sampled_softmax import _sampler_tries
from ctxkit.pretraining.bilm import BiLMTrainConfig, train_bilm
from tolerance import assert_close_to_reference, assert_paths_agree, assert_same_function

h5py = pytest.importorskip("h5py")

TINY = ElmoConfig(filters=((1, 4), (2, 8), (3, 16)), n_highway=2, char_embed_dim=4, cell_size=24, projection_dim=12, dropout=0.0)


pytestmark = pytest.mark.usefixtures("one_thread")


def _bound(config: ElmoConfig, steps: int) -> dict:
    """Rounding budget of a biLM output (tests/README.md): the character CNN (convolutions,
    highways, projection) and then every LSTM layer once per time step, since a step's rounding
    reaches the later steps through the state; k is the widest reduction (the highway's input,
    or the cell that the projection sums over)."""
    return dict(depth=2 + config.n_highway + config.num_layers * steps, k=max(sum(n for _, n in config.filters), config.cell_size))


def _randomised(config: ElmoConfig, seed: int = 0) -> ElmoBiLM:
    torch.manual_seed(seed)
    model = ElmoBiLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
        model.char_cnn.char_embedding.weight[0].zero_()
    return model


# ---------------------------------------------------------------------------- character ids


def test_character_ids_follow_the_elmo_mapper():
    pad = 261  # padding-inside-a-token 260, shifted by one
    assert word_to_char_ids("hello") == [259, 105, 102, 109, 109, 112, 260] + [pad] * 43
    # Non-ASCII: UTF-8 bytes (c3 af for 'ï'), each + 1.
    assert word_to_char_ids("naïve")[:8] == [259, 111, 98, 0xC3 + 1, 0xAF + 1, 119, 102, 260]
    # Sentence markers: begin-of-word, 256/257, end-of-word.
    assert word_to_char_ids("<S>")[:4] == [259, 257, 260, pad]
    assert word_to_char_ids("</S>")[:4] == [259, 258, 260, pad]
    # Over-long words keep their first 48 bytes, even when that splits a character.
    long_ascii = word_to_char_ids("x" * 60)
    assert len(long_ascii) == 50 and long_ascii[1:49] == [ord("x") + 1] * 48 and long_ascii[49] == 260
    long_utf8 = word_to_char_ids("a" + "é" * 30)  # 61 bytes; byte 48 is the lead byte of the 24th 'é'
    assert long_utf8[1] == ord("a") + 1 and long_utf8[2:4] == [0xC3 + 1, 0xA9 + 1]
    assert long_utf8[48] == 0xC3 + 1 and long_utf8[49] == 260
    assert all(len(word_to_char_ids(w)) == 50 for w in ("", "a", "x" * 48, "x" * 49))
    assert word_to_char_ids("x" * 48)[49] == 260 and word_to_char_ids("x" * 47)[48:] == [260, pad]


def test_batch_character_ids_pad_with_zero_rows():
    ids = batch_to_char_ids([["a", "bb"], ["c"]])
    assert ids.shape == (2, 2, 50)
    assert ids[1, 1].eq(0).all() and ids[0, 1].tolist() == word_to_char_ids("bb")
    wrapped = batch_to_char_ids([["a", "bb"], ["c"]], add_boundaries=True)
    assert wrapped.shape == (2, 4, 50)
    assert [wrapped[1, i].tolist() for i in range(3)] == [word_to_char_ids(w) for w in ("<S>", "c", "</S>")]
    assert wrapped[1, 3].eq(0).all() and wrapped[0, 3].tolist() == word_to_char_ids("</S>")
    assert batch_to_char_ids([]).shape == (0, 0, 50)


# ---------------------------------------------------------------------------- directions


def test_forward_and_backward_lms_see_only_their_side():
    model = _randomised(TINY)
    words = ["the", "quick", "brown", "fox", "jumps", "over", "dogs"]
    base = batch_to_char_ids([words])
    t = 3
    with torch.no_grad():
        ref = model(base)
        later = model(batch_to_char_ids([words[: t + 1] + ["ELEPHANT"] + words[t + 2 :]]))
        earlier = model(batch_to_char_ids([words[: t - 1] + ["ELEPHANT"] + words[t:]]))
    for layer in range(TINY.num_layers):
        # Forward LM: a change at t+1 leaves positions <= t bit-identical, and does reach t+1.
        assert torch.equal(later["forward"][layer][:, : t + 1], ref["forward"][layer][:, : t + 1])
        assert not torch.allclose(later["forward"][layer][:, t + 1], ref["forward"][layer][:, t + 1])
        # ... and changes every backward state up to t+1.
        assert not torch.allclose(later["backward"][layer][:, : t + 2], ref["backward"][layer][:, : t + 2])
        # Backward LM: a change at t-1 leaves positions >= t bit-identical.
        assert torch.equal(earlier["backward"][layer][:, t:], ref["backward"][layer][:, t:])
        assert not torch.allclose(earlier["backward"][layer][:, t - 1], ref["backward"][layer][:, t - 1])
        assert not torch.allclose(earlier["forward"][layer][:, t - 1 :], ref["forward"][layer][:, t - 1 :])
    # The representation layers: 0 = token encoding twice, then [forward; backward].
    p = TINY.projection_dim
    assert torch.equal(ref["layers"][0][..., :p], ref["layers"][0][..., p:])
    assert torch.equal(ref["layers"][2], torch.cat([ref["forward"][1], ref["backward"][1]], dim=-1))


def test_padding_does_not_leak_into_the_backward_lm():
    model = _randomised(TINY, seed=1)
    short, long = ["a", "b", "c"], ["d", "e", "f", "g", "h", "i"]
    with torch.no_grad():
        batch = model(batch_to_char_ids([long, short]))
        alone = model(batch_to_char_ids([short]))
    assert batch["mask"].tolist() == [[True] * 6, [True] * 3 + [False] * 3]
    for i, (got, want) in enumerate(zip(batch["layers"], alone["layers"])):
        assert_paths_agree(got[1, :3], want[0], name=f"layer {i}: padded row vs alone", **_bound(TINY, 6))
        assert got[1, 3:].eq(0).all()
    x = torch.arange(10.0).view(2, 5)
    assert reverse_padded(x, torch.tensor([5, 3])).tolist() == [[4, 3, 2, 1, 0], [7, 6, 5, 8, 9]]


# ---------------------------------------------------------------------------- ScalarMix and the embedder


def test_scalar_mix_is_a_normalised_weighted_sum():
    mix = ScalarMix(3, initial_scalar_parameters=[0.1, -0.5, 1.0])
    with torch.no_grad():
        mix.gamma.fill_(1.7)
    weights = mix.weights()
    e = [math.exp(v) for v in (0.1, -0.5, 1.0)]
    exact = torch.tensor([v / sum(e) for v in e], dtype=torch.float64)  # a softmax of 3: exp, then normalise
    assert_close_to_reference(weights, exact, depth=2, k=3, name="softmax weights")
    assert_close_to_reference(weights.sum(), torch.tensor(1.0, dtype=torch.float64), depth=3, k=3, name="sum of the weights")
    layers = [torch.randn(2, 4, 6) for _ in range(3)]
    manual = 1.7 * sum(w * t for w, t in zip(exact.float(), layers))
    manual64 = 1.7 * sum(w * t.double() for w, t in zip(exact, layers))
    assert_same_function(mix(layers), manual, manual64, depth=3, k=3, name="mix")
    mix(layers).sum().backward()
    assert mix.scalar_parameters.grad is not None and mix.gamma.grad is not None

    # AllenNLP's layer norm: one mean/variance per layer over the unmasked elements only.
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    normed_mix = ScalarMix(3, do_layer_norm=True)
    expected = expected64 = 0
    for t in layers:
        values, values64 = t[mask], t[mask].double()  # (5, 6)
        expected = expected + (t - values.mean()) / torch.sqrt(values.var(unbiased=False) + 1e-12) / 3
        expected64 = expected64 + (t.double() - values64.mean()) / torch.sqrt(values64.var(unbiased=False) + 1e-12) / 3
    # the mean and variance sum 30 values; then normalise and mix
    assert_same_function(normed_mix(layers, mask), expected, expected64, depth=4, k=30, name="normalised mix")


def test_elmo_embed_returns_word_aligned_layers():
    model = _randomised(TINY, seed=2)
    sentences = [["Hello", "world", "!"], ["Bonjour"], []]
    out = elmo_embed(model, sentences, batch_size=2)
    dim = 2 * TINY.projection_dim
    assert out.layers.shape == (3, 3, 3, dim) and out.mixed.shape == (3, 3, dim)
    assert out.mask.tolist() == [[True] * 3, [True, False, False], [False] * 3]
    with torch.no_grad():
        ref = model(batch_to_char_ids([sentences[0]], add_boundaries=True))
    for i in range(3):  # markers dropped: word j is position j + 1
        assert_paths_agree(out.layers[0, i], ref["layers"][i][0, 1:4], name=f"layer {i} in a batch vs alone", **_bound(TINY, 5))
    # default mix: equal weights (a softmax of zeros), gamma 1
    assert_paths_agree(out.mixed, out.layers.mean(dim=1), depth=2, k=3, name="mix vs mean")
    assert out.layers[1, :, 1:].eq(0).all() and out.layers[2].eq(0).all()
    layers, mixed = out.sentence(1)
    assert layers.shape == (3, 1, dim) and mixed.shape == (1, dim)


# ---------------------------------------------------------------------------- bilm-tf hdf5


def test_bilm_tf_hdf5_round_trip(tmp_path):
    model = _randomised(TINY, seed=3)
    weights, options = tmp_path / "weights.hdf5", tmp_path / "options.json"
    write_bilm_tf(model, weights, options)

    c, p = TINY.cell_size, TINY.projection_dim
    expected = {"char_embed": (261, 4),
                "CNN/W_cnn_0": (1, 1, 4, 4), "CNN/W_cnn_1": (1, 2, 4, 8), "CNN/W_cnn_2": (1, 3, 4, 16),
                "CNN/b_cnn_0": (4,), "CNN/b_cnn_1": (8,), "CNN/b_cnn_2": (16,),
                "CNN_proj/W_proj": (28, p), "CNN_proj/b_proj": (p,)}
    for k in range(2):
        expected.update({f"CNN_high_{k}/W_carry": (28, 28), f"CNN_high_{k}/b_carry": (28,),
                         f"CNN_high_{k}/W_transform": (28, 28), f"CNN_high_{k}/b_transform": (28,)})
    for d in range(2):
        for layer in range(2):
            root = f"RNN_{d}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"
            expected.update({f"{root}/W_0": (2 * p, 4 * c), f"{root}/B": (4 * c,), f"{root}/W_P_0": (c, p)})
    with h5py.File(weights, "r") as f:
        found = {}
        f.visititems(lambda name, obj: found.__setitem__(name, obj[...]) if isinstance(obj, h5py.Dataset) else None)
    assert {k: v.shape for k, v in found.items()} == expected == bilm_tf_shapes(TINY)
    assert all(v.dtype.name == "float32" for v in found.values())

    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    assert (found["char_embed"] == sd["char_cnn.char_embedding.weight"][1:]).all()
    assert (found["CNN/W_cnn_2"][0] == sd["char_cnn.convolutions.2.weight"].transpose(2, 1, 0)).all()
    assert (found["CNN_high_1/W_carry"] == sd["char_cnn.highways.1.carry.weight"].T).all()
    assert (found["CNN_proj/W_proj"] == sd["char_cnn.projection.weight"].T).all()
    # LSTM: TF kernel rows are [input; state], gate columns i, j, f, o; forget bias 1.0 not stored.
    w0, b = found["RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/W_0"], found["RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/B"]
    w_in, w_state = sd["backward_layers.1.input_linearity.weight"], sd["backward_layers.1.state_linearity.weight"]
    bias = sd["backward_layers.1.state_linearity.bias"]
    for tf_gate, torch_gate in ((0, 0), (1, 2), (2, 1), (3, 3)):
        cols, rows = slice(tf_gate * c, (tf_gate + 1) * c), slice(torch_gate * c, (torch_gate + 1) * c)
        assert (w0[:p, cols] == w_in[rows].T).all() and (w0[p:, cols] == w_state[rows].T).all()
        shift = 1.0 if tf_gate == 2 else 0.0
        # one float32 rounding of bias - shift: within eps * (|bias| + shift) of the exact difference
        assert_close_to_reference(b[cols], bias[rows].astype(np.float64) - shift, dtype=np.float32, scale=np.abs(bias[rows]) + shift,
                                  name=f"TF bias of gate {tf_gate}")
    assert (found["RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/W_P_0"] == sd["forward_layers.0.state_projection.weight"].T).all()

    opts = json.loads(options.read_text())
    assert opts["lstm"] == {"dim": c, "projection_dim": p, "n_layers": 2, "cell_clip": 3.0, "proj_clip": 3.0, "use_skip_connections": True}
    assert opts["char_cnn"]["filters"] == [[1, 4], [2, 8], [3, 16]] and opts["char_cnn"]["n_characters"] == 262

    loaded = load_bilm_tf(options, weights)
    assert loaded.config == TINY
    ours, theirs = model.state_dict(), loaded.state_dict()
    assert list(ours) == list(theirs)
    for key in ours:
        if key.endswith("state_linearity.bias"):  # the forget-bias shift costs two float32 roundings (- 1, then + 1)
            assert_close_to_reference(theirs[key], ours[key], scale=ours[key].abs() + 1, name=key)
        else:
            assert torch.equal(theirs[key], ours[key]), key
    chars = batch_to_char_ids([["round", "trip", "works"], ["ok"]], add_boundaries=True)
    with torch.no_grad():
        for i, (got, want) in enumerate(zip(loaded(chars)["layers"], model(chars)["layers"])):
            assert_paths_agree(got, want, name=f"layer {i} after the hdf5 round trip", **_bound(TINY, 5))


def test_bilm_tf_mismatches_are_listed(tmp_path):
    model = _randomised(TINY)
    weights, options = tmp_path / "weights.hdf5", tmp_path / "options.json"
    write_bilm_tf(model, weights, options)
    with h5py.File(weights, "a") as f:
        del f["CNN/b_cnn_0"]
        del f["CNN_proj/b_proj"]
        f.create_dataset("CNN_proj/b_proj", data=torch.zeros(5).numpy())
        f.create_dataset("softmax/W", data=torch.zeros(3, 2).numpy())
    with pytest.raises(CheckpointMismatchError) as err:
        load_bilm_tf(options, weights)
    assert err.value.missing == ["CNN/b_cnn_0"] and err.value.unexpected == ["softmax/W"]
    assert err.value.misshaped == [("CNN_proj/b_proj", (5,), (12,))]
    assert str(weights) in str(err.value)


def test_malformed_options_name_the_file(tmp_path):
    bad = tmp_path / "broken_options.json"
    bad.write_text('{"lstm": {"dim": 8,}')
    with pytest.raises(CheckpointError, match=r"broken_options\.json:1:\d+: malformed options JSON"):
        read_options(bad)
    incomplete = tmp_path / "incomplete_options.json"
    incomplete.write_text(json.dumps({"lstm": {"dim": 8}, "char_cnn": {}}))
    with pytest.raises(CheckpointError, match=r"incomplete_options\.json: options field char_cnn\.filters is missing"):
        read_options(incomplete)


# ---------------------------------------------------------------------------- presets


def _expected_counts(cell: int, proj: int, highways: int) -> dict:
    filters = [(1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 512), (7, 1024)]
    n_filters = sum(n for _, n in filters)
    # Per direction and layer: W_0 (input + projected state) x 4 gates, B, W_P_0.
    lstm = 2 * 2 * ((proj + proj) * 4 * cell + 4 * cell + cell * proj)
    char_cnn = 261 * 16 + sum(w * 16 * n + n for w, n in filters)
    highway = highways * 2 * (n_filters * n_filters + n_filters)
    projection = n_filters * proj + proj
    return {"lstm": lstm, "total": lstm + char_cnn + highway + projection}


@pytest.mark.parametrize("name, cell, proj, highways, published_millions", [
    ("elmo_2x1024_128_2048cnn_1xhighway", 1024, 128, 1, 13.6),
    ("elmo_2x2048_256_2048cnn_1xhighway", 2048, 256, 1, 28.0),
    ("elmo_2x4096_512_2048cnn_2xhighway", 4096, 512, 2, 93.6),
])
def test_preset_parameter_counts(name, cell, proj, highways, published_millions):
    config = ELMO_PRESETS[name]
    assert (config.cell_size, config.projection_dim, config.n_highway, config.n_filters) == (cell, proj, highways, 2048)
    assert (config.char_embed_dim, config.max_chars, config.n_characters, config.cell_clip, config.proj_clip) == (16, 50, 262, 3.0, 3.0)
    with torch.device("meta"):
        model = ElmoBiLM(config)
    expected = _expected_counts(cell, proj, highways)
    lstm = sum(p.numel() for n, p in model.named_parameters() if "_layers." in n)
    total = sum(p.numel() for p in model.parameters()) - config.char_embed_dim  # the padding row is not in the files
    assert lstm == expected["lstm"] and total == expected["total"]
    assert round(total / 1e6, 1) == published_millions
    if name.startswith("elmo_2x4096"):
        assert lstm == 75_563_008 and total == 93_600_848


# ---------------------------------------------------------------------------- language model and pretraining


def test_sampled_softmax_learns_the_true_distribution():
    # Its optimum must be the full softmax's: fit output biases to draws from a known
    # distribution (ids not sorted by frequency, so the corrections matter) with the
    # sampled loss alone. An uncorrected or wrongly corrected loss lands far off (TV > 0.3).
    torch.manual_seed(0)
    vocab, num_samples = 200, 20
    p = torch.softmax(torch.randn(vocab) * 2, dim=0)
    weight, bias = torch.zeros(vocab, 1), torch.zeros(vocab, requires_grad=True)
    opt = torch.optim.Adam([bias], lr=0.05)
    for _ in range(400):
        targets = torch.multinomial(p, 256, replacement=True)
        loss = sampled_softmax_nll(torch.zeros(256, 1), targets, weight, bias, num_samples).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    q = torch.softmax(bias.detach(), dim=0)
    assert 0.5 * (q - p).abs().sum() < 0.15 and (p * (p / q).log()).sum() < 0.1
    # About num_samples distinct negatives per batch, as TF's unique sampler gives.
    tries = _sampler_tries(vocab, num_samples)
    distinct = [len(torch.unique(torch.exp(torch.rand(tries) * math.log(vocab + 1)).floor().long() - 1)) for _ in range(200)]
    assert abs(sum(distinct) / len(distinct) - num_samples) < 1.0
    lm = ElmoLanguageModel(TINY, 50, softmax="sampled", num_samples=16)
    assert lm.token_nll(torch.randn(6, 12), torch.tensor([1, -100, 2, 3, -100, 4])).shape == (4,)


def _write_corpus(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_tiny_bilm_learns_a_deterministic_grammar(tmp_path):
    # After "a" the next word depends on the one before it, in either reading direction,
    # so both LMs need their recurrent state to reach zero loss.
    train = _write_corpus(tmp_path / "train.txt", ["a b a c a d"] * 200)
    valid = _write_corpus(tmp_path / "valid.txt", ["a b a c a d"] * 20)
    arch = ElmoConfig(filters=((1, 8), (2, 8)), n_highway=1, char_embed_dim=8, cell_size=32, projection_dim=16, dropout=0.0)
    cfg = BiLMTrainConfig(batch_size=8, unroll=10, epochs=8, lr=1e-2, softmax="full", eval_batch_size=2, progress=False, save_every=1000)
    summary = train_bilm([train], [valid], tmp_path / "run", arch, cfg)
    assert summary["steps"] == 160 and summary["vocab_size"] == 7
    assert max(summary["losses"][-10:]) < 0.02 < summary["losses"][0]
    valid_result = summary["valid"]
    assert valid_result["forward_perplexity"] < 1.05 and valid_result["backward_perplexity"] < 1.05
    # 2 rows of 80 tokens, 79 targets each, minus the 9 "<S> after </S>" targets per row.
    assert valid_result["tokens"] == 2 * (79 - 9)
    # The exported folder and hdf5 reproduce the trained network.
    lm, vocab = load_elmo_lm(tmp_path / "run" / "final")
    assert vocab[:3] == ["<S>", "</S>", "<UNK>"] and sorted(vocab[3:]) == ["a", "b", "c", "d"]
    bilm = load_bilm_tf(tmp_path / "run" / "final" / "options.json", tmp_path / "run" / "final" / "weights.hdf5")
    chars = batch_to_char_ids([["a", "b", "a", "c"]], add_boundaries=True)
    with torch.no_grad():
        for i, (got, want) in enumerate(zip(bilm(chars)["layers"], lm.bilm(chars)["layers"])):
            assert_paths_agree(got, want, name=f"layer {i} of the hdf5 export", **_bound(arch, 6))


def test_resume_equals_an_uninterrupted_run(tmp_path):
    rng = random.Random(0)
    words = [f"w{i}" for i in range(30)]
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 9))) for _ in range(60)]
    train = _write_corpus(tmp_path / "train.txt", lines)
    valid = _write_corpus(tmp_path / "valid.txt", lines[:8])
    arch = ElmoConfig(filters=((1, 4), (2, 4)), n_highway=1, char_embed_dim=4, cell_size=16, projection_dim=8, dropout=0.2)
    # Sampled softmax (8 of 33 words) and dropout both draw random numbers: their RNG must resume too.
    cfg = BiLMTrainConfig(batch_size=4, unroll=6, epochs=2, lr=3e-3, softmax="sampled", num_samples=8, save_every=5,
                          eval_batch_size=2, progress=False)
    full = train_bilm([train], [valid], tmp_path / "full", arch, cfg)
    steps = full["steps"]
    assert steps > 20 and len(full["losses"]) == steps

    first = train_bilm([train], [valid], tmp_path / "split", arch, BiLMTrainConfig(**{**cfg.__dict__, "max_steps": 13}))
    assert first["steps"] == 13 and first["losses"] == full["losses"][:13]
    resumed = train_bilm([train], [valid], tmp_path / "split", arch, cfg, resume=True)
    assert resumed["steps"] == steps
    assert resumed["losses"] == full["losses"]  # bit-identical, including the steps after the resume
    assert resumed["valid"]["perplexity"] == full["valid"]["perplexity"]
    assert not list((tmp_path / "split").glob("*.tmp"))  # atomic writes leave no temporaries

    with pytest.raises(CheckpointError, match="batch_size"):
        train_bilm([train], [valid], tmp_path / "split", arch, BiLMTrainConfig(**{**cfg.__dict__, "batch_size": 2}), resume=True)

    # checkpoint/ (ctxkit.core.run_state) holds the biLM that final/ holds, for load_bilm too.
    from ctxkit.models.elmo.io import load_bilm

    from_ckpt, info = load_bilm(tmp_path / "split" / "checkpoint")
    assert info["format"] == f"train_bilm checkpoint (step {steps})"
    final = load_bilm(tmp_path / "split")[0]
    assert all(torch.equal(a, b) for a, b in zip(from_ckpt.state_dict().values(), final.state_dict().values(), strict=True))

    # A run of an earlier version (one checkpoint.pt) resumes the same way.
    import shutil

    from ctxkit.core.run_state import load_checkpoint

    train_bilm([train], [valid], tmp_path / "old", arch, BiLMTrainConfig(**{**cfg.__dict__, "max_steps": 13}))
    ckpt = load_checkpoint(tmp_path / "old" / "checkpoint")
    torch.save({**ckpt.trainer_state, **ckpt.extra, "model": ckpt.model_state, "optimizer": ckpt.optimizer_state},
               tmp_path / "old" / "checkpoint.pt")
    shutil.rmtree(tmp_path / "old" / "checkpoint")
    assert train_bilm([train], [valid], tmp_path / "old", arch, cfg, resume=True)["losses"] == full["losses"]


def test_resume_without_a_checkpoint_starts_from_the_beginning(tmp_path, caplog):
    """A command that crashed before its first checkpoint can simply be run again with --resume
    (issue 39 item 6): a one-line note, then the run a fresh start gives; a finished run whose
    checkpoint is gone is refused in one line instead of being trained over."""
    import shutil

    from ctxkit.core.errors import UserError

    rng = random.Random(0)
    words = [f"w{i}" for i in range(30)]
    train = _write_corpus(tmp_path / "train.txt", [" ".join(rng.choice(words) for _ in range(rng.randint(3, 9))) for _ in range(40)])
    arch = ElmoConfig(filters=((1, 4), (2, 4)), n_highway=1, char_embed_dim=4, cell_size=16, projection_dim=8, dropout=0.2)
    cfg = BiLMTrainConfig(batch_size=4, unroll=6, max_steps=5, lr=3e-3, softmax="sampled", num_samples=8, progress=False)
    fresh = train_bilm([train], [], tmp_path / "fresh", arch, cfg)
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    (crashed / "vocab.txt").write_text("<S>\n")  # a crash before the first checkpoint: no checkpoint/, maybe a vocabulary
    with caplog.at_level("INFO", logger="ctxkit"):
        again = train_bilm([train], [], crashed, arch, cfg, resume=True)
    notes = [r.getMessage() for r in caplog.records if "no complete checkpoint" in r.getMessage()]
    assert notes == [f"{crashed / 'checkpoint'}: no complete checkpoint to resume from: starting from the beginning"]
    assert again["losses"] == fresh["losses"] and again["steps"] == 5
    shutil.rmtree(crashed / "checkpoint")
    with pytest.raises(UserError, match="results.json: from a finished run with no checkpoint left to resume from"):
        train_bilm([train], [], crashed, arch, cfg, resume=True)


def test_embed_with_elmo_gives_word_aligned_vectors_like_bert(tmp_path):
    """``embed(model="elmo:DIR")`` and ``ctxkit embed --model elmo:DIR``: BERT's words and
    spans, ELMo's vectors (equal to elmo_embed's), layer choices, mean pooling."""
    from ctxkit.cli import main
    from ctxkit.features.embed import embed
    from ctxkit.models.elmo.model import ELMO_PRESETS, ElmoLanguageModel, elmo_embed
    from ctxkit.models.elmo.io import save_elmo_lm

    torch.manual_seed(0)
    config = ELMO_PRESETS["elmo_2x1024_128_2048cnn_1xhighway"].replace(filters=((1, 8), (2, 8)), cell_size=32, projection_dim=16)
    lm = ElmoLanguageModel(config, 4, softmax="full")
    folder = save_elmo_lm(lm, tmp_path / "elmo", ["<S>", "</S>", "<UNK>", "bank"])
    texts = ["The bank's rates rose.", "", "river bank"]
    out = embed(texts, model=f"elmo:{folder}", layers="mix")
    assert out[0].words == ["The", "bank", "'", "s", "rates", "rose", "."]
    assert out[0].spans[1] == (4, 8) and texts[0][slice(*out[0].spans[4])] == "rates"
    assert out[1].words == [] and out[1].vectors.shape == (0, 32)
    ref = elmo_embed(lm.bilm, [out[0].words]).sentence(0)[0]  # (3, n_words, 32)
    bound = _bound(config, len(out[0].words) + 2)  # the words and the sentence markers; the mix one more
    assert_paths_agree(out[0].vectors, ref.mean(0).numpy(), name="embed mix vs elmo_embed mean", **{**bound, "depth": bound["depth"] + 1})
    last = embed(texts, model=folder, layers="last")  # a bare ELMo folder works too
    assert_paths_agree(last[2].vectors, elmo_embed(lm.bilm, [["river", "bank"]]).sentence(0)[0][2].numpy(), name="last layer",
                       **_bound(config, 4))
    assert not np.allclose(last[0].vectors, out[0].vectors)
    pooled = embed(texts, model=f"elmo:{folder}", layers="mix", pooling="mean")
    assert_paths_agree(pooled[0], out[0].vectors.mean(0), k=len(out[0].words), name="mean pooling")
    with pytest.raises(ValueError, match="no \\[CLS\\]"):
        embed(texts, model=f"elmo:{folder}", pooling="cls")
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    assert main(["embed", str(tmp_path / "in.txt"), "--model", f"elmo:{folder}", "--layers", "mix",
                 "--out", str(tmp_path / "v.npz"), "--no-progress"]) == 0
    saved = np.load(tmp_path / "v.npz")
    assert_paths_agree(saved["vectors_0"], out[0].vectors, name="CLI vectors", **{**bound, "depth": bound["depth"] + 1})
