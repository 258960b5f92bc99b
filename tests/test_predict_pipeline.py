"""predict()'s pipeline: chunked features (tokenized ahead by a helper thread) give the
outputs of one list, batches collated ahead keep their order and errors, and the faster
collate pads exactly as padded Python lists did."""

import threading

import numpy as np
import pytest
import torch

from ctxkit.data.batching import collate
from ctxkit.heads.classification import EncoderWithHead, SequenceClassificationHead
from ctxkit.models import BertModel, get_preset
from ctxkit.training import featurized_ahead, predict
from ctxkit.training.predict import _ahead


def _model():
    torch.manual_seed(0)
    cfg = get_preset("bert_2_128_2").config
    return EncoderWithHead(BertModel(cfg), SequenceClassificationHead(cfg.hidden_size, 3)).eval()


def _features(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(3, 40, (1,), generator=g))
        ids = [2] + torch.randint(5, 1000, (length - 2,), generator=g).tolist() + [3]
        out.append({"input_ids": ids, "token_type_ids": [0] * length, "attention_mask": [1] * length})
    return out


def test_chunks_give_the_outputs_of_one_list():
    model, feats = _model(), _features(70)
    whole = predict(model, feats, batch_size=8, device="cpu")
    seen = []

    def featurize(part):  # what a task's featurize does, on "examples" that are feature dicts
        seen.append(threading.current_thread().name)
        return list(part)

    chunked = predict(model, featurized_ahead(featurize, feats, 16), batch_size=8, device="cpu", total=len(feats))
    assert len(chunked) == len(whole) == 70 and len(seen) == 6  # 2, then 16 at a time
    assert all(name.startswith("ctxkit-featurize") for name in seen)
    # Batches differ (sorted per chunk), so rounding may too: fp32 against float64 scale.
    for a, b in zip(chunked, whole):
        assert a.shape == (3,) and np.allclose(a, b, rtol=0, atol=1e-5 * max(1.0, float(np.abs(b).max())))
    # Different inputs, different outputs: the order is the input order, not the batch order.
    assert float(np.abs(whole[0] - whole[1]).max()) > 1e-4


def test_ahead_keeps_order_and_raises_the_producers_error():
    assert list(_ahead(iter(range(100)), depth=3)) == list(range(100))

    def broken():
        yield 1
        yield 2
        raise ValueError("bad batch 3")

    got = []
    with pytest.raises(ValueError, match="bad batch 3"):
        for item in _ahead(broken(), depth=2):
            got.append(item)
    assert got == [1, 2]
    # A consumer that stops early stops the producer (no thread left behind).
    before = threading.active_count()
    for item in _ahead(iter(range(10_000)), depth=2):
        if item == 3:
            break
    assert threading.active_count() <= before


@pytest.mark.parametrize("multiple_of", [1, 8])
def test_collate_pads_like_python_lists(multiple_of):
    feats = _features(33, seed=1) + [{"input_ids": [7], "token_type_ids": [1], "attention_mask": [1]}]
    for f in feats:
        f["labels"] = list(range(len(f["input_ids"])))
    out = collate(feats, multiple_of=multiple_of)
    longest = max(len(f["input_ids"]) for f in feats)
    longest = -(-longest // multiple_of) * multiple_of
    for key, pad in (("input_ids", 0), ("token_type_ids", 0), ("attention_mask", 0), ("labels", -100)):
        want = torch.tensor([f[key] + [pad] * (longest - len(f[key])) for f in feats], dtype=torch.long)
        assert out[key].dtype == torch.long and torch.equal(out[key], want)


def test_single_text_features_written_not_read_equal_the_encodings(minilm_dir):
    """A text task's features of single texts write the mask and segment ids (ones and
    zeros) instead of reading them from each encoding: they equal what the encodings hold,
    for short, overlong and empty-ish texts, and pairs still read theirs."""
    from ctxkit.data.glue import TextExample
    from ctxkit.tasks.text import GlueClassificationTask
    from ctxkit.tokenizers import WordPieceTokenizer

    tok = WordPieceTokenizer.from_dir(minilm_dir)
    assert tok.single_segment_is_zero()
    texts = ["a fine film .", "word " * 300, "!", "Ünïcode façade — naïve café 東京"]
    task = GlueClassificationTask("SST-2")
    feats = task.featurize(tok, [TextExample(t, None, 1, "") for t in texts], train=False)
    encs = tok.encode_batch(texts, None, max_length=task.max_length, truncation="longest_first", padding=None)
    assert [len(f["input_ids"]) for f in feats] == [6, 128, 3, len(encs[3])]
    for f, e in zip(feats, encs):
        assert f == {"input_ids": e.input_ids, "token_type_ids": e.token_type_ids, "attention_mask": e.attention_mask, "labels": 1}
    pairs = task.featurize(tok, [TextExample("a b", "c d e", 0, "")], train=False)
    assert pairs[0]["token_type_ids"] == [0, 0, 0, 0, 1, 1, 1, 1]


@pytest.mark.parametrize("limit", [5, 8, 128])
def test_encode_ids_cut_like_truncation_without_reading_the_cut_off_pieces(minilm_dir, limit, caplog):
    """``encode_ids`` tokenizes with room for one token more and drops it: the ids equal
    ``encode_batch(..., truncation="longest_first")`` for texts just under, at and over the
    limit (content of limit - 3 ... limit + 1 tokens), and one warning counts the cut texts."""
    import logging

    from ctxkit.tokenizers import WordPieceTokenizer

    tok = WordPieceTokenizer.from_dir(minilm_dir)
    assert tok._special_ends() == (1, 1)
    words = "the cat sat on a mat and then it ran off to the big red barn".split()
    texts = [" ".join((words * 20)[:n]) for n in range(max(0, limit - 5), limit + 2)]
    texts += ["", "unaffable " * (limit + 3), "Ünïcode façade — naïve café 東京 " * 9]
    expected = [e.input_ids for e in tok.encode_batch(texts, max_length=limit, truncation="longest_first", padding=None)]
    with caplog.at_level(logging.WARNING, logger="ctxkit"):
        got = tok.encode_ids(texts, limit)
    assert got == expected
    over = sum(len(e) > limit for e in tok.encode_batch(texts, max_length=10_000, truncation="longest_first", padding=None))
    assert over >= 3 and f"truncated {over} of {len(texts)} inputs to max_length={limit}" in caplog.text
    with pytest.raises(TypeError):
        tok.encode_ids("one string", limit)


def test_collector_paused_nests_shares_one_pause_between_threads_and_restores():
    import gc

    from ctxkit.core.collector import collector_paused

    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer block still runs
    assert gc.isenabled()
    inside, leave = threading.Event(), threading.Event()

    def other():
        with collector_paused():
            inside.set()
            leave.wait(5)

    thread = threading.Thread(target=other)
    with collector_paused():
        thread.start()
        assert inside.wait(5)
    assert not gc.isenabled()  # this block ended first: the other thread's pause goes on
    leave.set()
    thread.join(5)
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # off before, off after
    finally:
        gc.enable()
