"""Pretraining data: corpus reading, sentence splitting, NSP instances, shards on disk."""

import argparse
import filecmp
import json
import lzma
import math
import random
import re
import shutil

import pytest

from ctxkit.pretraining import (
    PretrainDataset,
    ShardError,
    build_shards,
    create_instances,
    read_documents,
    split_sentences,
    train_vocab,
)
from ctxkit.cli.pretraining import add_commands
from ctxkit.tokenizers import WordPieceTokenizer


@pytest.fixture(scope="module")
def wiki00(shared_data):
    return shared_data / "wikipedia-en-extract" / "AA" / "wiki_00.xz"


# ---------------------------------------------------------------- documents


def test_read_documents_wikiextractor_counts_bodies(wiki00):
    docs = list(read_documents(wiki00))
    # Independent count: a regex over the whole decompressed file; body = after the title line.
    with lzma.open(wiki00, "rt", encoding="utf-8") as fh:
        text = fh.read()
    blocks = re.findall(r"^<doc [^\n]*>\n[^\n]*\n(.*?)^</doc>$", text, flags=re.S | re.M)
    assert len(blocks) == text.count("\n<doc ") + 1 == 1530
    expected = sum(1 for body in blocks if body.strip())
    assert len(docs) == expected == 620
    assert all(docs) and all(line and line == line.strip() for doc in docs for line in doc)
    # First non-empty document is "Jarred Shaw": the title line is gone, the body starts.
    assert docs[0][0].startswith("Jarred Shaw (born September 28, 1990)")
    assert docs[0][1] == "Professional career."
    assert sum(len(d) for d in docs) == sum(1 for b in blocks for line in b.splitlines() if line.strip())


def test_read_documents_blank_file_and_errors(tmp_path, shared_data):
    p = tmp_path / "c.txt"
    p.write_text("a one.\n  a two.  \n\n\n b one.\n\nc one.\n", encoding="utf-8")
    assert list(read_documents(p)) == [["a one.", "a two."], ["b one."], ["c one."]]
    assert list(read_documents(p, format="file")) == [["a one.", "a two.", "b one.", "c one."]]
    book = shared_data / "gutenberg-nltk" / "austen-emma.txt.xz"
    assert len(list(read_documents(book, format="file"))) == 1
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\n\nstill fine\nbroken \xff here\n")
    with pytest.raises(ValueError, match=r"bad\.txt:4: invalid UTF-8"):
        list(read_documents(bad))
    unclosed = tmp_path / "w.txt"
    unclosed.write_text('<doc id="1" url="u" title="T">\nT\nbody\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"w\.txt: ends inside a <doc"):
        list(read_documents(unclosed))
    with pytest.raises(ValueError, match="format must be"):
        list(read_documents(p, format="json"))


def test_split_sentences_hand_cases():
    assert split_sentences("Mr. Smith met Dr. Jones. They talked.") == ["Mr. Smith met Dr. Jones.", "They talked."]
    assert split_sentences("Pi is 3.14 today. The U.S. Army came, e.g. Bravo Company. Done!") == [
        "Pi is 3.14 today.", "The U.S. Army came, e.g. Bravo Company.", "Done!"]
    assert split_sentences('"Stop!" he cried. "Why?" Nobody knew.') == ['"Stop!" he cried.', '"Why?"', "Nobody knew."]
    assert split_sentences("He left in 1990. 2000 was next. is lower.") == ["He left in 1990.", "2000 was next. is lower."]
    assert split_sentences("J. R. R. Tolkien wrote it (see Fig. 2). Really?") == [
        "J. R. R. Tolkien wrote it (see Fig. 2).", "Really?"]
    assert split_sentences("   ") == [] and split_sentences("no end") == ["no end"]


# ---------------------------------------------------------------- instances


def _synthetic(n_docs, n_sents, max_len, seed=0):
    """Documents whose every token id is unique: id = doc * 10**6 + position in the document."""
    rng = random.Random(seed)
    docs = []
    for d in range(n_docs):
        pos, doc = 0, []
        for _ in range(n_sents):
            k = rng.randint(1, max_len)
            doc.append([d * 10**6 + pos + j for j in range(k)])
            pos += k
        docs.append(doc)
    return docs


def _not_last_of_doc(instances):
    """Instances come in document order; a document's last one may be a forced random next."""
    docs = [x.tokens_a[0] // 10**6 for x in instances]
    return [x for x, d, nxt in zip(instances, docs, docs[1:] + [None]) if d == nxt]


def _within_sigmas(k, n, p, sigmas=4.0):
    return abs(k - n * p) <= sigmas * math.sqrt(n * p * (1 - p))


def test_create_instances_pairs_come_from_the_right_places():
    docs = _synthetic(60, 300, 6)
    inst = create_instances(docs, max_seq_len=128, short_seq_prob=0.0, nsp_prob=0.5, rng=random.Random(1))
    assert len(inst) > 500
    for x in inst:
        assert x.tokens_a and x.tokens_b and len(x.tokens_a) + len(x.tokens_b) <= 125
        for seg in (x.tokens_a, x.tokens_b):  # each segment is a contiguous run of one document
            assert seg == list(range(seg[0], seg[0] + len(seg)))
        doc_a, doc_b = x.tokens_a[0] // 10**6, x.tokens_b[0] // 10**6
        if x.is_random_next:
            assert doc_b != doc_a
        else:
            assert doc_b == doc_a
            gap = x.tokens_b[0] - x.tokens_a[-1] - 1
            # B continues A; truncation (front of B) removes at most the chunk's overshoot (< 6).
            assert 0 <= gap <= 5
            if len(x.tokens_a) + len(x.tokens_b) < 125:  # untruncated: exactly adjacent
                assert gap == 0
    # A document's last instance is either a true next that ends the document or a
    # random next forced by a one-sentence chunk: the document's final sentence as A.
    inner = {id(x) for x in _not_last_of_doc(inst)}
    last = [x for x in inst if id(x) not in inner]
    assert len(last) == len(docs)
    for x in last:
        final = docs[x.tokens_a[0] // 10**6][-1]
        assert (x.tokens_a == final) if x.is_random_next else (0 <= final[-1] - x.tokens_b[-1] <= 5)
    # Every other instance drew a fair coin (so did every true-next last one: by Wald's
    # identity the forced ones must be left out, not the whole last instance).
    draws = [x for x in inst if not (x.is_random_next and id(x) not in inner)]
    n_random = sum(x.is_random_next for x in draws)
    assert _within_sigmas(n_random, len(draws), 0.5), (n_random, len(draws))
    # Deterministic given the seed, different for another seed.
    same = [create_instances(docs, 128, 0.0, 0.5, random.Random(1)), create_instances(docs, 128, 0.0, 0.5, random.Random(2))]
    assert same[0] == inst and same[1] != inst


def test_create_instances_short_target_share():
    # One-token sentences make a chunk stop exactly at its target, so for true-next pairs
    # len(A) + len(B) == target: max_seq_len - 3, or with prob. 0.1 uniform in [2, 125].
    docs = _synthetic(40, 3000, 1)
    inst = create_instances(docs, max_seq_len=128, short_seq_prob=0.1, nsp_prob=0.5, rng=random.Random(0))
    assert all(len(x.tokens_a) + len(x.tokens_b) <= 125 for x in inst)
    nexts = [x for x in _not_last_of_doc(inst) if not x.is_random_next]
    short = sum(len(x.tokens_a) + len(x.tokens_b) < 125 for x in nexts)
    assert len(nexts) > 400
    assert _within_sigmas(short, len(nexts), 0.1 * 123 / 124), (short, len(nexts))
    assert min(len(x.tokens_a) + len(x.tokens_b) for x in nexts) >= 2


def test_create_instances_single_document_and_long_sentence():
    long_doc = [[[7] * 1000, [8] * 3, [9] * 2000]]
    inst = create_instances(long_doc, max_seq_len=32, short_seq_prob=0.0, rng=random.Random(0))
    assert inst and all(not x.is_random_next and len(x.tokens_a) + len(x.tokens_b) == 29 for x in inst)
    with pytest.raises(ValueError, match="max_seq_len"):
        create_instances(long_doc, max_seq_len=4)


# ---------------------------------------------------------------- shards


@pytest.fixture(scope="module")
def built(wiki00, minilm_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("shards") / "a"
    meta = build_shards([wiki00], minilm_dir, out, max_seq_len=128, seed=3, workers=2, docs_per_shard=80,
                        limit_docs=200, show_progress=False)
    return out, meta


def test_build_shards_examples_decode_to_bert_pairs(built, wiki00, minilm_dir):
    out, meta = built
    tok = WordPieceTokenizer.from_dir(minilm_dir)
    ds = PretrainDataset(out, verify=True)
    assert meta["num_documents"] == 200 and len(meta["shards"]) == 3
    assert len(ds) == meta["num_instances"] > 500
    assert meta["token_dtype"] == "uint16" and meta["tokenizer"]["vocab_size"] == 30522
    source = "".join(tok.backend.normalizer.normalize_str(line).replace(" ", "")
                     for doc in list(read_documents(wiki00))[:200] for line in doc)
    labels = []
    for i in range(len(ds)):
        ex = ds[i]
        ids, types = ex["input_ids"], ex["token_type_ids"]
        len_a = types.count(0)
        assert len(ids) <= 128 and ex["attention_mask"] == [1] * len(ids)
        assert ids[0] == tok.cls_id and ids[len_a - 1] == tok.sep_id and ids[-1] == tok.sep_id
        assert ids.count(tok.sep_id) == 2 and ids.count(tok.cls_id) == 1
        assert types == [0] * len_a + [1] * (len(ids) - len_a) and 3 <= len_a < len(ids) - 1
        labels.append(ex["next_sentence_label"])
        if i < 100:  # each segment is a piece of the corpus text
            for seg in (ids[1:len_a - 1], ids[len_a:-1]):
                toks = tok.convert_ids_to_tokens(seg)
                if "[UNK]" not in toks:
                    assert "".join(t.removeprefix("##") for t in toks) in source
    assert sum(labels) == meta["num_random_next"] and 0.4 < sum(labels) / len(labels) < 0.75
    assert ds[-1] == ds[len(ds) - 1]
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_build_shards_is_reproducible_for_any_worker_count(built, wiki00, minilm_dir):
    out, _ = built
    again = out.parent / "b"
    build_shards([wiki00], minilm_dir, again, max_seq_len=128, seed=3, workers=1, docs_per_shard=80,
                 limit_docs=200, show_progress=False)
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(p.name for p in again.iterdir()) and len(names) == 10
    _, mismatch, errors = filecmp.cmpfiles(out, again, names, shallow=False)
    assert mismatch == [] and errors == []
    other = out.parent / "c"
    build_shards([wiki00], minilm_dir, other, seed=4, workers=1, docs_per_shard=80, limit_docs=200, show_progress=False)
    assert not filecmp.cmp(out / "shard_00000.tokens.npy", other / "shard_00000.tokens.npy", shallow=False)


def test_damaged_shards_give_clear_errors(built, tmp_path):
    out, _ = built
    broken = tmp_path / "broken"
    shutil.copytree(out, broken)
    victim = broken / "shard_00001.tokens.npy"
    victim.write_bytes(victim.read_bytes()[:-100])
    (broken / "shard_00002.nsp.npy").unlink()
    with pytest.raises(ShardError) as err:
        PretrainDataset(broken)
    msg = str(err.value)
    assert "shard_00001.tokens.npy" in msg and "truncated" in msg and "shard_00002.nsp.npy: missing" in msg
    (broken / "meta.json").unlink()
    with pytest.raises(ShardError, match="meta.json: not found"):
        PretrainDataset(broken)


def test_cli_pretrain_data_and_vocab(wiki00, minilm_dir, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers(dest="verb", required=True))
    args = parser.parse_args(["pretrain-data", str(wiki00), "--tokenizer", "all_minilm_l6_v2", "--out",
                              str(tmp_path / "d"), "--limit-docs", "40", "--workers", "1", "--no-progress",
                              "--max-seq-len", "64"])
    assert args.func(args) == 0
    assert '"num_documents": 40' in capsys.readouterr().out
    ds = PretrainDataset(tmp_path / "d")
    assert ds.meta["max_seq_len"] == 64 and max(len(ds[i]["input_ids"]) for i in range(len(ds))) <= 64

    args = parser.parse_args(["pretrain-vocab", str(wiki00), "--vocab-size", "600", "--out", str(tmp_path / "v"),
                              "--limit-docs", "300", "--no-progress"])
    assert args.func(args) == 0
    tok = WordPieceTokenizer.from_dir(tmp_path / "v")
    assert tok.convert_ids_to_tokens(range(5)) == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    assert 300 < tok.vocab_size <= 600
    # WikiExtractor markup never reaches the vocabulary ("curid" only occurs in <doc url=...>).
    assert "curid" not in tok.get_vocab()


def test_train_vocab_function(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n\n".join(f"the river bank number {i} is muddy.\nthe bank lends money." for i in range(50)),
                      encoding="utf-8")
    tok = train_vocab([corpus], 120, tmp_path / "v", show_progress=False)
    assert tok.convert_ids_to_tokens(range(5)) == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert tok.encode("the bank").tokens == ["[CLS]", "the", "bank", "[SEP]"]
    assert (tmp_path / "v" / "vocab.txt").is_file()


def test_word_tokenize_splits_punctuation_keeps_inner_joins():
    from ctxkit.pretraining.corpus import word_tokenize

    assert word_tokenize('He said: "U.S. rates rose 3.5% in 2019-20, didn\'t they?"') == [
        "He", "said", ":", '"', "U.S", ".", "rates", "rose", "3.5", "%", "in", "2019-20", ",", "didn't", "they", "?", '"']
    assert word_tokenize("Bank BANK", lower=True) == ["bank", "bank"]
    assert word_tokenize("  ") == []


def test_lm_corpus_cli_writes_one_sentence_per_line(wiki00, tmp_path, capsys):
    from ctxkit.pretraining.corpus import split_sentences, word_tokenize

    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers(dest="verb", required=True))
    out = tmp_path / "wiki.txt.xz"
    args = parser.parse_args(["lm-corpus", str(wiki00), "--out", str(out), "--no-progress"])
    assert args.func(args) == 0
    summary = json.loads(capsys.readouterr().out)
    docs = list(read_documents(wiki00))
    with lzma.open(out, "rt", encoding="utf-8") as fh:
        text = fh.read()
    blocks = [b.splitlines() for b in text.strip("\n").split("\n\n")]
    assert summary["documents"] == len(docs) == len(blocks) == 620
    # Document 0, independently: every line's sentences, words joined by single spaces.
    expected = [" ".join(word_tokenize(s)) for line in docs[0] for s in split_sentences(line)]
    assert blocks[0] == [e for e in expected if e]
    assert summary["sentences"] == sum(len(b) for b in blocks)
    assert summary["words"] == sum(len(line.split()) for b in blocks for line in b)
    assert "<doc" not in text and not (tmp_path / "wiki.txt.xz.tmp").exists()
