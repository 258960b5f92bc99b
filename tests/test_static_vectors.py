"""Context-free word vectors: file formats, similarity queries, word2vec / fastText training, bag classifier, CLI."""

import argparse
import ctypes
import gzip
import lzma

import numpy as np
import pytest
import torch

from ctxkit.models.static.bag import BagOfEmbeddingsClassifier
from ctxkit.models.static.vectors import WordVectors, char_ngrams, fasttext_hash, ngram_buckets
from ctxkit.models.static.io import guess_format, read_corpus, read_vectors, write_vectors
from ctxkit.pretraining.word2vec import (
    NegativeSamplingModel,
    UnigramSampler,
    _cbow_examples,
    _skipgram_examples,
    build_vocab,
    keep_probabilities,
    train_word2vec,
)
from ctxkit.tasks.bag_classifier import train_bag_classifier
from ctxkit.cli.static import add_static_parsers
from ctxkit.data.glue import read_sst2
from tolerance import assert_close_to_reference, assert_paths_agree

# ---------------------------------------------------------------------------- helpers


def _tricky_vectors():
    rng = np.random.default_rng(0)
    words = ["the", ",", "café", "naïve", "日本", "x-ray", "don't", "a\u00a0b"]  # last holds a non-breaking space
    matrix = rng.normal(0, 1, (len(words), 7)).astype(np.float32)
    matrix[0, :3] = [1e-38, -3.4e38, 1.0 / 3.0]  # extremes and a value with no short decimal form
    matrix[1] = 0.0
    return words, matrix


def _topic_corpus(n_sentences=1500, seed=0, prefix=("a", "b")):
    """Two disjoint topic vocabularies plus shared function words: topic words only co-occur within their topic."""
    rng = np.random.default_rng(seed)
    topics = [[f"{p}{i:02d}" for i in range(20)] for p in prefix]
    shared = ["the", "of", "and"]
    sentences = []
    for _ in range(n_sentences):
        words = list(rng.choice(topics[rng.integers(2)], 6)) + list(rng.choice(shared, 2))
        rng.shuffle(words)
        sentences.append([str(w) for w in words])
    return sentences, topics


def _within_minus_across(vectors, topics):
    unit = vectors.unit_vectors
    a, b = ([vectors.index[w] for w in t] for t in topics)
    iu = np.triu_indices(len(a), 1)
    within = np.mean([(unit[a] @ unit[a].T)[iu].mean(), (unit[b] @ unit[b].T)[iu].mean()])
    across = (unit[a] @ unit[b].T).mean()
    return float(within), float(across)


def _parser():
    parser = argparse.ArgumentParser(prog="ctxkit")
    add_static_parsers(parser.add_subparsers(dest="verb", required=True))
    return parser


def _run(argv):
    args = _parser().parse_args(argv)
    return args.func(args)


# ---------------------------------------------------------------------------- formats


@pytest.mark.parametrize("name,fmt", [("v.txt", "glove"), ("v.vec", "word2vec"), ("v.bin", "word2vec-binary"),
                                      ("v.txt.gz", "glove"), ("v.vec.xz", "word2vec"), ("v.npz", "npz")])
def test_round_trip_is_bit_exact(tmp_path, name, fmt):
    words, matrix = _tricky_vectors()
    path = write_vectors(tmp_path / name, words, matrix, progress=False)
    assert guess_format(path) == fmt
    got_words, got, _ = read_vectors(path, progress=False)
    assert got_words == words
    assert got.dtype == np.float32 and np.array_equal(got, matrix)


def test_file_layouts_match_the_standard_formats(tmp_path):
    words, matrix = ["a", "bb"], np.array([[0.5, -1.0], [2.0, 0.25]], np.float32)
    write_vectors(tmp_path / "v.txt", words, matrix, progress=False)
    assert (tmp_path / "v.txt").read_text() == "a 0.5 -1\nbb 2 0.25\n"
    write_vectors(tmp_path / "v.vec", words, matrix, decimals=6, progress=False)
    assert (tmp_path / "v.vec").read_text() == "2 2\na 0.500000 -1.000000\nbb 2.000000 0.250000\n"
    write_vectors(tmp_path / "v.bin", words, matrix, progress=False)
    raw = (tmp_path / "v.bin").read_bytes()
    assert raw == b"2 2\na " + matrix[0].astype("<f4").tobytes() + b"\nbb " + matrix[1].astype("<f4").tobytes() + b"\n"
    # Google's reader tolerates vectors without the trailing newline; so must we.
    (tmp_path / "nonl.bin").write_bytes(raw.replace(b"\nbb ", b"bb ")[:-1])
    assert np.array_equal(read_vectors(tmp_path / "nonl.bin", progress=False)[1], matrix)


def test_lossy_decimals_and_format_sniffing(tmp_path):
    words, matrix = _tricky_vectors()
    matrix = np.clip(matrix, -5, 5)
    write_vectors(tmp_path / "w2v.txt", words, matrix, format="word2vec", decimals=6, progress=False)
    assert guess_format(tmp_path / "w2v.txt") == "word2vec"
    vectors = WordVectors.load(tmp_path / "w2v.txt", progress=False)
    assert vectors.words == words and np.abs(vectors.vectors - matrix).max() <= 5e-7
    assert WordVectors.load(tmp_path / "w2v.txt", progress=False, max_words=3).words == words[:3]


def test_npz_keeps_subwords_counts_and_meta(tmp_path):
    rng = np.random.default_rng(1)
    vectors = WordVectors(["a", "b"], rng.normal(size=(2, 4)), counts=[5, 3], ngram_vectors=rng.normal(size=(11, 4)),
                          minn=2, maxn=4, meta={"model": "skipgram"})
    back = WordVectors.load(vectors.save(tmp_path / "v.npz", progress=False), progress=False)
    assert back.words == ["a", "b"] and np.array_equal(back.vectors, vectors.vectors)
    assert np.array_equal(back.ngram_vectors, vectors.ngram_vectors) and (back.minn, back.maxn) == (2, 4)
    assert back.counts.tolist() == [5, 3] and back.meta == {"model": "skipgram"}
    assert np.array_equal(back["zzz"], vectors["zzz"])


@pytest.mark.parametrize("name,content,line,reason", [
    ("g.txt", "a 1 2 3\nb 1 2\n", 2, "wrong number of values"),
    ("g.txt", "a 1 2 3\nb 1 x 3\n", 2, "non-numeric value"),
    ("g.txt", "a 1 2\nb 1 nan\n", 2, "non-finite value"),
    ("g.txt", "a 1 2\n\nb 1 2\n", 2, "empty line"),
    ("g.txt", "a 1 2\nb 1 2\na 3 4\n", 3, "duplicate word"),
    ("w.vec", "3 2\na 1 2\nb 3 4\n", 1, "header count mismatch"),
    ("w.vec", "1 2\na 1 2\nb 3 4\n", 3, "more vectors than the header's count"),
    ("w.vec", "2 3\na 1 2 3\nb 1 2\n", 3, "wrong number of values"),
    ("w.vec", "two 3\na 1 2 3\n", 1, "bad header"),
    ("g.txt", b"a 1 2\n\xff 1 2\n", 2, "invalid UTF-8"),
])
def test_malformed_text_files_name_file_and_line(tmp_path, name, content, line, reason):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ValueError) as err:
        WordVectors.load(path, format="word2vec" if name.endswith(".vec") else "glove", progress=False)
    assert str(err.value).startswith(f"{path}:{line}: ") and reason in str(err.value)


def test_malformed_binary_names_file_and_record(tmp_path):
    good = b"2 3\na " + np.ones(3, "<f4").tobytes() + b"\nb " + np.ones(3, "<f4").tobytes() + b"\n"
    (tmp_path / "short.bin").write_bytes(good[:-5])
    with pytest.raises(ValueError, match=r"short\.bin:record 2 \(byte \d+\): truncated vector"):
        WordVectors.load(tmp_path / "short.bin", progress=False)
    (tmp_path / "count.bin").write_bytes(good.replace(b"2 3", b"3 3", 1))
    with pytest.raises(ValueError, match=r"count\.bin:record 3 .*truncated file"):
        WordVectors.load(tmp_path / "count.bin", progress=False)
    (tmp_path / "nan.bin").write_bytes(good.replace(np.ones(3, "<f4").tobytes(), np.full(3, np.nan, "<f4").tobytes(), 1))
    with pytest.raises(ValueError, match=r"nan\.bin:record 1 .*non-finite"):
        WordVectors.load(tmp_path / "nan.bin", progress=False)


def test_words_with_spaces_cannot_be_written(tmp_path):
    with pytest.raises(ValueError, match="split on whitespace"):
        write_vectors(tmp_path / "v.txt", ["new york"], np.ones((1, 2)), progress=False)


# ---------------------------------------------------------------------------- queries


def test_nearest_neighbours_by_cosine():
    angles = {"w0": 0, "w10": 10, "w30": 30, "w90": 90, "w180": 180}
    rad = np.radians(list(angles.values()))
    # Lengths differ on purpose: cosine must ignore them.
    vectors = WordVectors(list(angles), np.stack([np.cos(rad), np.sin(rad)], 1) * np.arange(1, 6)[:, None])
    got = vectors.most_similar("w0", k=4)
    assert [w for w, _ in got] == ["w10", "w30", "w90", "w180"]
    # cosines of 2-d vectors: a dot product and two norms, at the size of unit vectors (tests/README.md)
    cosine = dict(dtype=np.float32, scale=1.0, depth=2, k=2)
    assert_close_to_reference(np.array([c for _, c in got]), np.cos(np.radians([10, 30, 90, 180])), name="cosines", **cosine)
    assert [w for w, _ in vectors.most_similar(np.array([0.0, 1.0]), k=2)] == ["w90", "w30"]
    assert [w for w, _ in vectors.most_similar("w0", k=10, exclude=["w10"], restrict=3)] == ["w30"]
    assert_close_to_reference(np.float32(vectors.similarity("w0", "w90")), np.float64(0.0), name="orthogonal", **cosine)
    with pytest.raises(KeyError, match="w45"):
        vectors.most_similar("w45")


def test_analogy_3cosadd_on_hand_built_vectors():
    # axes: royalty, male, female, capital-of, france, italy
    table = {
        "king": [1, 1, 0, 0, 0, 0], "queen": [1, 0, 1, 0, 0, 0], "man": [0, 1, 0, 0, 0, 0],
        "woman": [0, 0, 1, 0, 0, 0], "prince": [0.8, 1, 0, 0, 0, 0.3],
        "paris": [0, 0, 0, 1, 1, 0], "rome": [0, 0, 0, 1, 0, 1], "france": [0, 0, 0, 0, 1, 0],
        "italy": [0, 0, 0, 0, 0, 1],
    }
    vectors = WordVectors(list(table), np.array(list(table.values()), np.float32))
    answers = vectors.analogy("man", "king", "woman", k=3)
    assert answers[0][0] == "queen"
    assert {"man", "king", "woman"}.isdisjoint(w for w, _ in answers)
    # cos(unit(king) - unit(man) + unit(woman), queen) worked out by hand
    q = np.array([1, 1, 0, 0, 0, 0]) / np.sqrt(2) - np.array([0, 1, 0, 0, 0, 0]) + np.array([0, 0, 1, 0, 0, 0])
    # unit vectors, their sum, then a cosine: 3 steps over 6 dimensions
    assert_close_to_reference(np.float32(answers[0][1]), q @ np.array([1, 0, 1, 0, 0, 0]) / np.sqrt(2) / np.linalg.norm(q),
                              dtype=np.float32, scale=1.0, depth=3, k=6, name="3CosAdd score")
    assert vectors.analogy("france", "paris", "italy", k=1)[0][0] == "rome"


# ---------------------------------------------------------------------------- fastText sub-words


def test_fasttext_hash_and_ngrams():
    assert fasttext_hash("a") == 0xE40C292C and fasttext_hash("foobar") == 0xBF9CF968  # FNV-1a test vectors
    expect = 2166136261
    for byte in "<é>".encode():  # fastText casts bytes to int8_t before xor
        expect = ((expect ^ (ctypes.c_int8(byte).value & 0xFFFFFFFF)) * 16777619) % 2**32
    assert fasttext_hash("<é>") == expect
    assert char_ngrams("where", 3, 3) == ["<wh", "whe", "her", "ere", "re>"]
    assert len(char_ngrams("where", 3, 6)) == 5 + 4 + 3 + 2
    assert char_ngrams("日本", 3, 4) == ["<日本", "<日本>", "日本>"]  # n counts characters, not bytes
    assert ngram_buckets("where", 3, 3, 97) == [fasttext_hash(g) % 97 for g in ["<wh", "whe", "her", "ere", "re>"]]


def test_oov_vector_is_mean_of_ngram_buckets():
    rng = np.random.default_rng(0)
    ngrams = rng.normal(size=(50, 6)).astype(np.float32)
    vectors = WordVectors(["in"], np.ones((1, 6)), ngram_vectors=ngrams, minn=3, maxn=6)
    grams = char_ngrams("xyzzy", 3, 6)
    assert len(grams) == 14
    rows = ngrams[[fasttext_hash(g) % 50 for g in grams]]
    expect = rows.astype(np.float64).mean(axis=0)
    assert "xyzzy" not in vectors and vectors.has_vector("xyzzy")
    # a mean of 14 float32 rows, at the size of its terms (tests/README.md)
    assert_close_to_reference(vectors["xyzzy"], expect, k=14, scale=float(np.abs(rows).max()), name="mean of the n-gram rows")
    assert np.array_equal(vectors["in"], np.ones(6, np.float32))  # in-vocabulary words keep their row
    with pytest.raises(KeyError):
        WordVectors(["in"], np.ones((1, 6)))["xyzzy"]


# ---------------------------------------------------------------------------- training pieces


def test_negative_sampling_distribution_is_count_to_the_075():
    counts = np.array([10_000, 1_000, 100, 10, 1])
    sampler = UnigramSampler(counts)
    expect = counts ** 0.75 / (counts ** 0.75).sum()
    np.testing.assert_allclose(sampler.probs, expect, rtol=1e-12)
    draws = sampler.sample((400, 1000), np.random.default_rng(0))
    assert draws.shape == (400, 1000) and draws.dtype == np.int64
    freq = np.bincount(draws.ravel(), minlength=len(counts)) / draws.size
    np.testing.assert_allclose(freq, expect, atol=0.004)  # binomial sd <= 8e-4 at n = 400k
    assert freq[0] < 0.85 < counts[0] / counts.sum()  # flatter than the raw unigram distribution


def test_subsampling_keeps_rare_words_and_thins_frequent_ones():
    counts = np.array([1_000_000, 10_000, 100])  # shares ~0.990, ~0.0099, ~0.0001
    keep = keep_probabilities(counts, 1e-3)
    f = counts / counts.sum()
    np.testing.assert_allclose(keep[:2], (np.sqrt(f[:2] / 1e-3) + 1) * 1e-3 / f[:2])
    assert keep[0] == pytest.approx(0.0328, abs=1e-3) and keep[2] == 1.0
    assert np.all(keep_probabilities(counts, 0) == 1.0)


def test_dynamic_window_pairs_stay_in_sentences_and_favour_near_words():
    n, window = 30_000, 5
    ids = np.arange(n, dtype=np.int32)  # token id == position
    sent = (np.arange(n) >= n // 2).astype(np.int32)
    centres, contexts = _skipgram_examples(ids, sent, window, np.random.default_rng(0))
    assert not np.any(sent[centres] != sent[contexts])
    dist = np.abs(centres - contexts)
    assert dist.min() == 1 and dist.max() == window
    share = np.bincount(dist, minlength=window + 1)[1:] / len(dist)
    expect = np.arange(window, 0, -1) / np.arange(window, 0, -1).sum()  # P(distance o) ~ window - o + 1
    np.testing.assert_allclose(share, expect, atol=0.01)
    centres_c, ctx = _cbow_examples(ids, sent, window, np.random.default_rng(0))
    for c, row in zip(centres_c[:50], ctx[:50]):  # same sentence, within the window, never the centre
        row = row[row >= 0]
        assert len(row) and np.all(np.abs(row - c) <= window) and c not in row


@pytest.mark.parametrize("bags", [False, True])
def test_closed_form_sgd_step_matches_autograd(bags):
    torch.manual_seed(0)
    net = NegativeSamplingModel(12, 8, 5)
    with torch.no_grad():
        net.outputs.weight.normal_(0, 0.5)  # zero outputs would hide half the gradient
    rows = torch.tensor([3, 1, 7, 7, 11, 0]) if bags else torch.tensor([3, 1, 7])
    offsets, lengths = (torch.tensor([0, 2, 3]), torch.tensor([2, 1, 3])) if bags else (None, None)
    targets, negatives = torch.tensor([2, 5, 2]), torch.tensor([[1, 2, 7], [5, 0, 0], [3, 4, 6]])  # 2 negatives hit targets
    ref = NegativeSamplingModel(12, 8, 5)
    ref.load_state_dict(net.state_dict())
    loss = ref(rows, offsets, lengths, targets, negatives)
    loss.backward()
    lr = 0.1
    with torch.no_grad():
        expect_in = ref.inputs.weight - lr * ref.inputs.weight.grad.to_dense()
        expect_out = ref.outputs.weight - lr * ref.outputs.weight.grad.to_dense()
    got_loss = net.sgd_step(rows, offsets, lengths, targets, negatives, lr=lr)
    # closed form vs autograd: the same arithmetic in another order, 8-wide dot products, a
    # log-sigmoid, then the update (tests/README.md)
    assert_paths_agree(torch.as_tensor(got_loss, dtype=torch.float32), loss.detach(), depth=3, k=8, name="loss")
    assert_paths_agree(net.inputs.weight.detach(), expect_in, depth=3, k=8, name="input vectors after the step")
    assert_paths_agree(net.outputs.weight.detach(), expect_out, depth=3, k=8, name="output vectors after the step")


def test_corpus_reading_and_vocabulary(tmp_path):
    with lzma.open(tmp_path / "c.txt.xz", "wt", encoding="utf-8") as fh:
        fh.write("The cat sat\n\n  the DOG  \n")
    with gzip.open(tmp_path / "d.txt.gz", "wt", encoding="utf-8") as fh:
        fh.write("the end\n")
    sentences = list(read_corpus([tmp_path / "c.txt.xz", tmp_path / "d.txt.gz"], lowercase=True))
    assert sentences == [["the", "cat", "sat"], ["the", "dog"], ["the", "end"]]
    words, counts = build_vocab(sentences, min_count=1)
    assert words[0] == "the" and counts[0] == 3 and words[1:] == ["cat", "dog", "end", "sat"]
    assert build_vocab(sentences, min_count=2)[0] == ["the"]


# ---------------------------------------------------------------------------- training


@pytest.mark.parametrize("model,optimizer,subwords", [("skipgram", "sgd", False), ("cbow", "sgd", False),
                                                      ("skipgram", "sgd", True), ("cbow", "sgd", True),
                                                      ("skipgram", "sparse_adam", False)])
def test_training_separates_planted_topics(model, optimizer, subwords):
    sentences, topics = _topic_corpus()
    vectors = train_word2vec(sentences, model=model, optimizer=optimizer, subwords=subwords, buckets=5000, dim=24,
                             window=3, min_count=1, epochs=4, subsample=1e-2, batch_size=256, progress=False, seed=1)
    assert len(vectors) == 43 and vectors.dim == 24
    within, across = _within_minus_across(vectors, topics)
    assert within - across > 0.4, (within, across)
    assert vectors.meta["words_per_sec"] > 0 and vectors.meta["train_tokens"] == 1500 * 8
    if subwords:
        assert vectors.ngram_vectors.shape == (5000, 24)


def test_subword_vectors_place_unseen_words_near_their_spelling_relatives():
    sentences, topics = _topic_corpus(prefix=("alpha", "omega"))
    vectors = train_word2vec(sentences, model="skipgram", subwords=True, buckets=20_000, dim=24, window=3,
                             min_count=1, epochs=4, batch_size=256, progress=False)
    for oov, own, other in (("alpha77", 0, 1), ("omega77", 1, 0)):
        assert oov not in vectors
        sims = [[vectors.similarity(oov, w) for w in t] for t in topics]
        assert np.mean(sims[own]) > np.mean(sims[other]) + 0.2


def test_training_is_reproducible_and_validates_arguments():
    sentences, _ = _topic_corpus(300)
    kwargs = dict(dim=8, min_count=1, epochs=1, progress=False, seed=3)
    assert np.array_equal(train_word2vec(sentences, **kwargs).vectors, train_word2vec(sentences, **kwargs).vectors)
    with pytest.raises(ValueError, match="model"):
        train_word2vec(sentences, model="glove", **kwargs)
    with pytest.raises(ValueError, match="min_count"):
        train_word2vec([["rare"]], dim=8, min_count=2, progress=False)


# ---------------------------------------------------------------------------- bag of embeddings


def test_bag_classifier_masks_padding():
    torch.manual_seed(0)
    model = BagOfEmbeddingsClassifier(np.random.default_rng(0).normal(size=(5, 3)), num_classes=2, dropout=0.0).eval()
    # a masked mean over up to 4 rows, then the 3-wide head
    assert_paths_agree(model(torch.tensor([[1, 2, 0, 0]])), model(torch.tensor([[1, 2]])), depth=2, k=4, name="padded vs not")
    assert_paths_agree(model(torch.tensor([[0, 0]])), model.head(torch.zeros(1, 3)), depth=2, k=4, name="all padding")
    assert not model.embedding.weight.requires_grad


def _sentiment_data(n, rng):
    texts, labels = [], []
    for _ in range(n):
        label = int(rng.integers(2))
        words = list(rng.choice([f"n{i}" for i in range(30)], rng.integers(3, 9)))
        words += list(rng.choice([f"pos{i}" if label else f"neg{i}" for i in range(10)], 1))
        rng.shuffle(words)
        texts.append(" ".join(words))
        labels.append(label)
    return texts, labels


def test_bag_classifier_learns_a_separable_task():
    rng = np.random.default_rng(0)
    words = [f"n{i}" for i in range(30)] + [f"pos{i}" for i in range(10)] + [f"neg{i}" for i in range(10)]
    matrix = rng.normal(0, 1, (len(words), 16)).astype(np.float32)
    matrix[30:40, 0] += 4.0  # polarity lives on one axis, buried in noise words
    matrix[40:, 0] -= 4.0
    vectors = WordVectors(words, matrix)
    train = _sentiment_data(800, rng)
    dev = _sentiment_data(200, rng)
    result = train_bag_classifier(vectors, *train, *dev, epochs=8, lr=1e-2, batch_size=32, progress=False)
    assert result.dev_accuracy >= 0.95
    assert result.coverage == 1.0 and len(result.history) == 8
    assert result.history[-1]["train_accuracy"] >= 0.9  # measured with dropout on


# ---------------------------------------------------------------------------- CLI


def test_cli_end_to_end(tmp_path, capsys):
    sentences, topics = _topic_corpus(1200)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(" ".join(s) for s in sentences) + "\n", encoding="utf-8")
    out = tmp_path / "vectors.vec"
    assert _run(["word2vec-train", str(corpus), "--model", "cbow", "--dim", "16", "--window", "3", "--min-count", "1",
                 "--epochs", "3", "--batch-size", "256", "--subsample", "0.01", "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "43 words x 16 dims" in printed and "words/s" in printed
    assert read_vectors(out, progress=False)[1].shape == (43, 16)

    assert _run(["neighbors", str(out), "a03", "-k", "5", "--no-progress"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "a03" and len(lines) == 6
    assert all(line.split()[1].startswith("a") for line in lines[1:])  # neighbours from its own topic
    assert _run(["neighbors", str(out), "nosuchword", "--no-progress"]) == 2
    assert "'nosuchword' is not in the vocabulary" in capsys.readouterr().err

    assert _run(["analogy", str(out), "a01", "a02", "b01", "-k", "3", "--no-progress"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "a01 : a02 :: b01 : ?" and len(lines) == 4

    # fastText-style model saved as .npz answers for an unseen word
    npz = tmp_path / "sub.npz"
    assert _run(["word2vec-train", str(corpus), "--subwords", "--buckets", "3000", "--dim", "8", "--min-count", "1",
                 "--epochs", "1", "--out", str(npz), "--no-progress"]) == 0
    capsys.readouterr()
    assert _run(["neighbors", str(npz), "a99", "-k", "2", "--no-progress"]) == 0
    assert "a99 (not in the vocabulary" in capsys.readouterr().out

    data = tmp_path / "sst"
    data.mkdir()
    rng = np.random.default_rng(0)
    for split, n in (("train", 300), ("dev", 100)):
        rows = ["sentence\tlabel"]
        for _ in range(n):
            label = int(rng.integers(2))
            rows.append(" ".join(rng.choice(topics[label], 5)) + ' "\t' + str(label))  # stray quote, as in SST-2
        (data / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    assert _run(["bag-classifier", str(out), "--data", str(data), "--epochs", "4", "--lr", "0.01", "--no-progress"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("sst-2 dev accuracy: ") and float(last.split()[3]) >= 0.95


def test_cli_reports_malformed_vectors_and_missing_files(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("a 1 2\nb 1\n")
    with pytest.raises(ValueError, match=r"bad\.txt:2: wrong number of values"):
        _run(["neighbors", str(bad), "a", "--no-progress"])
    with pytest.raises(FileNotFoundError):
        _run(["analogy", str(tmp_path / "missing.vec"), "a", "b", "c"])


def test_read_sst2_on_the_real_dev_file(shared_data):
    texts, labels = read_sst2(shared_data / "glue" / "SST-2" / "dev.tsv")
    assert len(texts) == 872 and labels.count(0) == 428 and labels.count(1) == 444
    assert texts[0].startswith("it 's a charming and often affecting journey")
