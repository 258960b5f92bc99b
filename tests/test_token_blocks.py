"""Token blocks and prefix tokenizing: inference over many single texts without per-text objects.

* ``TokenBlock.batch`` equals ``collate`` of the same features, and ``predict`` over a block
  equals ``predict`` over the feature dicts;
* ``encode_ids``, which tokenizes only a prefix of a long text (``ctxkit.tokenizers.bulk``),
  gives exactly the whole text's truncated ids: on real text (SST-2 lines, the Wikipedia
  extract) and on generated texts with accents, combining marks, Greek final sigma, Chinese
  characters, control characters and literal special tokens; the prefixes really are shorter;
* a text task's outputs through blocks equal its outputs through feature dicts.
"""

import lzma
import random

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkit.data.batching import collate
from ctxkit.data.blocks import TokenBlock
from ctxkit.tokenizers import WordPieceTokenizer
from ctxkit.tokenizers.bulk import PrefixBudget, capped_ids, cuts_at_spaces


@pytest.fixture(scope="module")
def tok(minilm_dir):
    return WordPieceTokenizer.from_dir(minilm_dir)


def _truncated(tok, texts, limit):
    return [e.input_ids for e in tok.encode_batch(texts, max_length=limit, truncation="longest_first", padding=None)]


def test_block_batches_equal_collate_of_the_features():
    rng = random.Random(0)
    rows = [[2] + [rng.randrange(5, 30000) for _ in range(rng.randrange(0, 60))] + [3] for _ in range(50)]
    block = TokenBlock.from_ids(rows)
    assert block.ids.shape == (50, max(map(len, rows))) and block.ids.dtype == np.int32
    assert block.rows() == rows
    feats = [{"input_ids": r, "token_type_ids": [0] * len(r), "attention_mask": [1] * len(r)} for r in rows]
    for idx in ([0], [3, 1, 4, 1, 5], list(range(49, -1, -7)), list(range(50))):
        want = collate([feats[i] for i in idx])
        got = block.batch(idx)
        assert set(got) == set(want)
        for key in want:
            assert got[key].dtype == np.int64 and torch.equal(torch.from_numpy(got[key]), want[key]), key
    wide = TokenBlock.from_ids(rows[:2], width=100)
    assert wide.ids.shape == (2, 100) and wide.rows() == rows[:2]
    with pytest.raises(ValueError, match="ids must be"):
        TokenBlock(np.zeros((3, 4), np.int32), np.zeros(2, np.int64))


def test_predict_over_a_block_equals_predict_over_the_features():
    from ctxkit.heads.classification import EncoderWithHead, SequenceClassificationHead
    from ctxkit.models import BertModel, get_preset
    from ctxkit.training import featurized_ahead, predict

    torch.manual_seed(0)
    cfg = get_preset("bert_2_128_2").config
    model = EncoderWithHead(BertModel(cfg), SequenceClassificationHead(cfg.hidden_size, 3), cls_only=True).eval()
    rng = random.Random(1)
    rows = [[2] + [rng.randrange(5, 1000) for _ in range(rng.randrange(1, 40))] + [3] for _ in range(45)]
    feats = [{"input_ids": r, "token_type_ids": [0] * len(r), "attention_mask": [1] * len(r)} for r in rows]
    whole = predict(model, feats, batch_size=8, device="cpu")
    by_block = predict(model, TokenBlock.from_ids(rows), batch_size=8, device="cpu")
    # Same batches, same tensors, same process: the very same numbers.
    assert len(by_block) == 45 and all(np.array_equal(a, b) for a, b in zip(by_block, whole))
    chunked = predict(model, featurized_ahead(TokenBlock.from_ids, rows, 16), batch_size=8, device="cpu", total=45)
    for a, b in zip(chunked, whole):  # other batches: rounding may differ, fp32 against the outputs' scale
        assert np.allclose(a, b, rtol=0, atol=1e-5 * max(1.0, float(np.abs(b).max())))


def _sst2_lines(shared_data, n, words):
    sentences = [line.split("\t")[0] for line in (shared_data / "glue" / "SST-2" / "train.tsv").read_text().splitlines()[1:]]
    lines, current, i = [], [], 0
    while len(lines) < n:
        current += sentences[i].split()
        i += 1
        if len(current) >= words:
            lines.append(" ".join(current))
            current = []
    return lines


def _wiki_lines(shared_data, n):
    text = lzma.open(shared_data / "wikipedia-en-extract" / "AA" / "wiki_00.xz", "rt", encoding="utf-8").read()
    return [line for line in text.splitlines() if len(line) > 40 and not line.startswith("<")][:n]


@pytest.mark.parametrize("limit", [16, 128])
def test_prefix_tokenizing_gives_the_whole_texts_truncated_ids_on_real_text(tok, shared_data, limit):
    texts = _sst2_lines(shared_data, 300, 150) + _wiki_lines(shared_data, 700)
    want = _truncated(tok, texts, limit)
    for _ in range(3):  # the budget adapts between calls; the ids never change
        assert tok.encode_ids(texts, limit) == want
    block = tok.encode_block(texts, limit)
    assert block.rows() == want and block.ids.shape[1] == max(map(len, want))


def test_prefixes_are_shorter_and_short_ones_are_redone(shared_data, tok):
    """What the encoder is given: long texts cut at a space near the budget, and the texts
    whose prefix fell short tokenized again whole."""
    texts = _sst2_lines(shared_data, 200, 150)
    seen = []
    backend = tok._tok

    def encode(inputs):
        seen.append(list(inputs))
        return backend.encode_batch(inputs)

    want = _truncated(tok, texts, 129)  # (turns the backend's truncation off when done: set it after)
    backend.enable_truncation(129)
    try:
        budget = PrefixBudget(5.0)
        rows = capped_ids(encode, texts, 129, 127, budget)
        assert rows == want
        first = seen[0]
        assert all(a == b[:len(a)] and (len(a) < len(b)) == (len(b) > 635) for a, b in zip(first, texts))
        assert sum(len(a) for a in first) < 0.8 * sum(len(b) for b in texts)
        redone = seen[1] if len(seen) > 1 else []
        assert all(t in texts for t in redone)  # whole texts
        # A budget far too small: every prefix falls short, every text is redone, the ids hold.
        tiny = PrefixBudget(2.0)
        seen.clear()
        assert capped_ids(encode, texts, 129, 127, tiny) == want
        assert seen[1] == texts and tiny.chars_per_token == pytest.approx(2.2)
    finally:
        backend.no_truncation()


_ALPHABET = st.sampled_from(list("abcσςΣΑΒΓ  \t\n\u00a0.,!?'-") + ["é", "e\u0301", "\u0301", "東京", "\u3000", "\x00",
                                                                   "\x07", "[MASK]", "[SEP]", "unaffable", "ÄÖÜß", "ﬁ"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(_ALPHABET, min_size=0, max_size=60).map("".join), min_size=1, max_size=12), st.integers(5, 24))
def test_prefix_tokenizing_is_exact_on_generated_texts(tok, texts, limit):
    assert tok.encode_ids(texts, limit) == _truncated(tok, texts, limit)
    budget = PrefixBudget(2.0)  # the tightest budget: the most cuts
    front, back = tok._special_ends()
    with tok._lock:
        tok._tok.enable_truncation(limit + 1)
        try:
            rows = capped_ids(tok._tok.encode_batch, texts, limit + 1, limit + 1 - front - back, budget)
        finally:
            tok._tok.no_truncation()
    assert rows == [e.input_ids for e in tok.encode_batch(texts, max_length=limit + 1, truncation="longest_first", padding=None)]


def test_only_berts_pipeline_is_cut(tok):
    from tokenizers import pre_tokenizers

    assert cuts_at_spaces(tok._tok)
    other = WordPieceTokenizer(tok._tok.__class__.from_str(tok._tok.to_str()))
    other._tok.pre_tokenizer = pre_tokenizers.Metaspace()
    assert not cuts_at_spaces(other._tok) and other._prefix_budget() is None
    texts = ["a long text of many words " * 20]
    assert other.encode_ids(texts, 12) == _truncated(other, texts, 12)


def test_text_task_outputs_through_blocks_equal_feature_dicts(tok, shared_data, caplog):
    from ctxkit.data.glue import TextExample
    from ctxkit.heads.classification import EncoderWithHead, SequenceClassificationHead
    from ctxkit.models import BertModel, get_preset
    from ctxkit.tasks.text import GlueClassificationTask
    from ctxkit.training import predict

    torch.manual_seed(0)
    cfg = get_preset("bert_2_128_2").config
    model = EncoderWithHead(BertModel(cfg), SequenceClassificationHead(cfg.hidden_size, 2), cls_only=True).eval()
    task = GlueClassificationTask("SST-2", max_length=32)
    examples = [TextExample(t, None, None, "") for t in _sst2_lines(shared_data, 40, 30) + ["short one .", "x"]]
    import logging

    with caplog.at_level(logging.WARNING, logger="ctxkit"):
        via_blocks = task._outputs(model, tok, examples, 16, "cpu")
    said = caplog.text
    via_dicts = np.stack(predict(model, task.featurize(tok, examples, train=False), 16, "cpu"))
    assert via_blocks.shape == (42, 2) and np.array_equal(via_blocks, via_dicts)
    cut = sum(len(r) > 32 for r in _truncated(tok, [e.text for e in examples], 10_000))
    assert cut >= 30 and said.count("truncated") == 1 and f"truncated {cut} of 42 inputs to max_length=32" in said
    assert tok.encode_block([e.text for e in examples], 32).truncated == cut

