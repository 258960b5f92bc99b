"""Task models on frozen word features (static vectors, ELMo layers): learning, ScalarMix,
padding, feature sources and biLM loading."""

import numpy as np
import pytest
import torch

from ctxkit.models.elmo.model import ElmoBiLM, ElmoConfig, ElmoLanguageModel, elmo_embed
from ctxkit.models.elmo.io import config_to_options, save_elmo_lm, write_bilm_tf
from ctxkit.models.static.vectors import WordVectors
from ctxkit.tasks.feature_models import (
    CASING_DIM,
    ElmoFeatures,
    FeatureSentenceClassifier,
    FeatureTagger,
    StaticFeatures,
    collate_features,
    length_batches,
    load_bilm,
    predict_tags,
    train_feature_classifier,
    train_feature_tagger,
)
from tolerance import assert_close_to_reference, assert_paths_agree, magnitude

TINY = ElmoConfig(filters=((1, 4), (2, 8), (3, 16)), n_highway=1, char_embed_dim=4, cell_size=24, projection_dim=12, dropout=0.0)
LABELS = ["O", "B-A", "I-A", "B-B"]
TAG_OF = {(False, False): "O", (True, False): "B-A", (True, True): "I-A", (False, True): "B-B"}  # (own, previous word's)


pytestmark = pytest.mark.usefixtures("one_thread")


def _synthetic_tagging(n: int, seed: int, layers: int = 1, dim: int = 6):
    """Words are random vectors of 30 types. A word's tag says whether its own first
    component is positive and whether the previous word's was (context the BiLSTM needs)."""
    rng = np.random.default_rng(0)  # one vocabulary for every split
    table = rng.normal(size=(30, layers, dim)).astype(np.float32)
    rng = np.random.default_rng(seed)
    feats, tags = [], []
    for _ in range(n):
        ids = rng.integers(0, 30, rng.integers(3, 12))
        pos = table[ids, 0, 0] > 0
        prev = np.concatenate([[False], pos[:-1]])
        tags.append([TAG_OF[bool(p), bool(q)] for p, q in zip(pos, prev)])
        feats.append(torch.from_numpy(table[ids]).transpose(0, 1).contiguous())  # (L, n, dim)
    return feats, tags


def _token_accuracy(model, feats, tags):
    pred = predict_tags(model, feats)
    pairs = [(LABELS[p], t) for ps, ts in zip(pred, tags) for p, t in zip(ps, ts)]
    return sum(p == t for p, t in pairs) / len(pairs)


def test_tagger_learns_word_and_context_tags():
    train = _synthetic_tagging(400, seed=1, layers=2)
    dev, test = _synthetic_tagging(60, seed=2, layers=2), _synthetic_tagging(60, seed=3, layers=2)
    # Both tag bits must be in the data, or the test would not need the context.
    assert {"B-B", "I-A", "B-A", "O"} <= {t for s in train[1] for t in s}
    out = train_feature_tagger(*train, *dev, *test, LABELS, epochs=12, lr=1e-2, batch_size=16, hidden=32, lstm_layers=1,
                               dropout=0.0, progress=False)
    assert _token_accuracy(out["model"], *test) >= 0.95
    assert out["test_f1"] >= 90.0 and len(out["dev_f1_curve"]) == 12
    assert out["best_epoch"] == 1 + int(np.argmax(out["dev_f1_curve"]))
    assert abs(sum(out["scalar_mix"]["weights"]) - 1.0) < 1e-3


def test_classifier_learns_separable_task():
    rng = np.random.default_rng(0)

    def data(n):
        feats = [torch.from_numpy(rng.normal(size=(1, int(rng.integers(2, 10)), 5)).astype(np.float32)) for _ in range(n)]
        return feats, [int(f[0, :, 0].mean() > 0) for f in feats]

    out = train_feature_classifier(*data(400), *data(100), epochs=10, lr=1e-2, batch_size=16, hidden=16, dropout=0.0,
                                   progress=False)
    assert out["best_dev_accuracy"] >= 90.0 and out["last_dev_accuracy"] >= 85.0
    assert out["scalar_mix"] is None and out["model"].scalar_mix is None


def test_scalar_mix_weights_sum_to_one_and_get_gradients():
    torch.manual_seed(0)
    model = FeatureTagger(3, 8, 4, hidden=8, lstm_layers=1)
    x, lengths = collate_features([torch.randn(3, 5, 8), torch.randn(3, 2, 8)])
    assert x.shape == (2, 5, 3, 8) and lengths.tolist() == [5, 2]
    model(x, lengths).sum().backward()
    # a softmax of 3 sums to one up to its normalisation's rounding (tests/README.md)
    assert_close_to_reference(model.scalar_mix.weights().sum(), torch.tensor(1.0, dtype=torch.float64), scale=1.0, depth=2, k=3,
                              name="scalar mix weights sum")
    assert model.scalar_mix.scalar_parameters.grad.abs().sum() > 0 and model.scalar_mix.gamma.grad.abs().sum() > 0
    assert FeatureTagger(1, 8, 4).scalar_mix is None


@pytest.mark.parametrize("cls", [FeatureTagger, FeatureSentenceClassifier])
def test_padding_does_not_change_predictions(cls):
    torch.manual_seed(0)
    model = cls(3, 8, 4, hidden=8, lstm_layers=2).eval()
    sentence = torch.randn(3, 5, 8)
    alone = model(*collate_features([sentence]))
    batched = model(*collate_features([torch.randn(3, 9, 8), sentence, torch.randn(3, 2, 8)]))
    # the same function at another batch shape (tests/README.md): the scalar mix, then 2 LSTM
    # layers once per time step (9 in the batch), then the output layer; k: the 16-wide states
    bound = dict(depth=2 + 2 * 9, k=16)
    if cls is FeatureTagger:
        assert_paths_agree(batched[1, :5], alone[0], name="padded vs alone", **bound)
    else:
        assert_paths_agree(batched[1], alone[0], name="padded vs alone", **bound)


def test_length_batches_cover_every_index_once():
    lengths = [5, 1, 9, 3, 3, 7, 2]
    assert [i for b in length_batches(lengths, 3) for i in b] == [1, 6, 3, 4, 0, 5, 2]
    shuffled = length_batches(lengths, 3, np.random.default_rng(0))
    assert sorted(i for b in shuffled for i in b) == list(range(7)) and all(len(b) <= 3 for b in shuffled)


def test_static_features_lookup_and_unknown_words():
    vectors = WordVectors(["the", "paris", "Apple"], np.arange(9, dtype=np.float32).reshape(3, 3) + 1)
    static = StaticFeatures(vectors)
    (feats,) = static([["The", "Paris", "Apple", "zzz"]])
    assert feats.shape == (1, 4, 3)
    np.testing.assert_array_equal(feats[0, 0].numpy(), vectors["the"])  # tried lowercased
    np.testing.assert_array_equal(feats[0, 1].numpy(), vectors["paris"])
    np.testing.assert_array_equal(feats[0, 2].numpy(), vectors["Apple"])  # as written first
    assert not feats[0, 3].any()  # unknown: zeros
    assert (static.found, static.missing) == (3, 1) and static.coverage == 0.75
    lower = StaticFeatures(vectors, lowercase=True, casing=True)
    (feats,) = lower([["Apple", "PARIS", "x1"]])
    assert feats.shape == (1, 3, 3 + CASING_DIM) and lower.dim == 3 + CASING_DIM
    np.testing.assert_array_equal(feats[0, 0, :3].numpy(), vectors["Apple"])  # no "apple": falls back to the original
    assert feats[0, :, 3:].tolist() == [[0, 0, 1, 0], [0, 1, 0, 0], [1, 0, 0, 1]]
    assert not feats[0, 2, :3].any()


def _tiny_bilm(seed: int = 0) -> ElmoBiLM:
    torch.manual_seed(seed)
    bilm = ElmoBiLM(TINY)
    with torch.no_grad():
        for p in bilm.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return bilm.eval()


SENTENCES = [["The", "cat", "sat", "."], ["Hi"], ["A", "much", "longer", "sentence", "than", "the", "others", "here"], [],
             ["Paris", "is", "in", "France"], ["x"] * 3]


def test_elmo_features_equal_elmo_embed():
    bilm = _tiny_bilm()
    ref = elmo_embed(bilm, SENTENCES, batch_size=len(SENTENCES))
    exact = ElmoFeatures(bilm, batch_size=2, chunk_size=3, dtype=torch.float32, progress=False)(SENTENCES)
    half = ElmoFeatures(bilm, batch_size=2, chunk_size=3, progress=False)(SENTENCES)
    assert ElmoFeatures(bilm).num_layers == 3 and ElmoFeatures(bilm).dim == 24
    for i, words in enumerate(SENTENCES):
        layers, _ = ref.sentence(i)
        assert exact[i].shape == (3, len(words), 24) and half[i].dtype == torch.float16
        if not words:
            continue
        # other batches and chunks: the biLM's budget (tests/test_elmo.py: character CNN, then
        # 2 LSTM layers per step, the words and 2 markers), k the 28-wide CNN output
        assert_paths_agree(exact[i], layers, depth=2 + 1 + 2 * (len(words) + 2), k=28, name=f"sentence {i} float32")
        # stored as float16: one rounding of each value, relative to its own size (tests/README.md)
        assert_close_to_reference(half[i], layers, scale=magnitude(layers, per_element=True), name=f"sentence {i} float16")


def test_load_bilm_from_run_folder_and_checkpoint(tmp_path):
    torch.manual_seed(0)
    lm = ElmoLanguageModel(TINY, 7, softmax="full")
    save_elmo_lm(lm, tmp_path / "run" / "final", ["<S>", "</S>", "<UNK>", "a", "b", "c", "d"])
    torch.save({"model": lm.state_dict(), "model_config": config_to_options(TINY), "run": {"step": 3}}, tmp_path / "checkpoint.pt")
    expected = lm.bilm.state_dict()
    for path in (tmp_path / "run", tmp_path / "run" / "final", tmp_path / "checkpoint.pt", tmp_path):
        bilm, info = load_bilm(path)
        assert not bilm.training and bilm.config == TINY, info
        for k, v in bilm.state_dict().items():
            torch.testing.assert_close(v, expected[k], atol=0, rtol=0)
    pytest.importorskip("h5py")
    write_bilm_tf(lm.bilm, tmp_path / "tf" / "weights.hdf5", tmp_path / "tf" / "options.json")
    for path in (tmp_path / "tf", tmp_path / "tf" / "weights.hdf5"):
        bilm, info = load_bilm(path)
        assert info["format"] == "bilm-tf options + hdf5"
        for k, v in bilm.state_dict().items():  # the forget-bias shift (- 1, + 1) rounds twice; the rest is exact
            assert_close_to_reference(v, expected[k], scale=expected[k].abs() + 1, name=k)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no biLM here"):
        load_bilm(tmp_path / "empty")
