"""Packed pretraining (issue 37): each batch's sequences one after another in one row of a
fixed width, batches dealt so that their token counts are equal. The same losses and
gradients as the padded batch, one shape for every batch of a run, exact resume."""

import json

import numpy as np
import pytest
import torch

from ctxkit.data.batching import balanced_batch_tokens, balanced_batches
from ctxkit.models import get_preset
from ctxkit.core.errors import UserError
from ctxkit.pretraining.masking import IGNORE_INDEX, MaskingConfig, MaskingIds, MLMCollator, packed_mask_slots
from ctxkit.pretraining.train import PretrainingModel, pretrain
from ctxkit.training import TrainConfig
from ctxkit.training.steps import rows_and_tokens

IDS = MaskingIds(vocab_size=300, mask_id=3, special_ids=frozenset({0, 1, 2, 3}), pad_id=0)


def _lengths(n: int, seed: int = 0) -> list:
    """Like real shards: about half the pairs fill the length, the rest anywhere below it."""
    rng = np.random.default_rng(seed)
    return np.where(rng.random(n) < 0.55, 128, rng.integers(8, 128, n)).tolist()


def _pair(n: int, rng) -> dict:
    """A [CLS] A [SEP] B [SEP] feature of ``n`` tokens."""
    a = max(2, n // 2)
    ids = ([1] + rng.integers(4, 300, a - 2).tolist() + [2] + rng.integers(4, 300, n - a - 1).tolist() + [2])[:n]
    return {"input_ids": ids, "token_type_ids": [0] * a + [1] * (n - a), "attention_mask": [1] * n,
            "next_sentence_label": int(rng.integers(0, 2))}


def test_balanced_batches_deal_each_epoch_into_batches_of_equal_totals():
    lengths = _lengths(1003)
    sizes = np.asarray(lengths)
    first = balanced_batches(lengths, 64, seed=3, epoch=0)
    assert balanced_batches(lengths, 64, seed=3, epoch=0) == first  # a pure function of (seed, epoch): exact resume
    second = balanced_batches(lengths, 64, seed=3, epoch=1)
    assert {tuple(sorted(b)) for b in second} != {tuple(sorted(b)) for b in first}  # other company every epoch
    for epoch in (first, second):
        assert sorted(i for b in epoch for i in b) == list(range(1003))  # every example once
        assert sorted(map(len, epoch)) == [62] * 5 + [63] * 11  # 1003 over 16 batches
    totals = [sorted(int(sizes[b].sum()) for b in epoch) for epoch in (first, second)]
    assert totals[0] == totals[1]  # the same totals every epoch: one row width serves the run
    assert totals[0][-1] - totals[0][0] <= sizes.max()  # within about one example of each other
    shuffled = np.random.default_rng(0).permutation(1003)
    plain = sorted(int(sizes[shuffled[b:b + 64]].sum()) for b in range(0, 64 * 15, 64))
    assert plain[-1] - plain[0] > 3 * (totals[0][-1] - totals[0][0])  # what random batches would need
    filled = [int(sizes[b].sum()) + (64 - len(b)) * int(sizes[b].min()) for b in first]
    assert balanced_batch_tokens(lengths, 64) == (max(filled), min(filled))


@pytest.mark.parametrize("train,slots", [(False, None), (True, None), (True, 24)], ids=["eval", "train", "train-24-slots"])
def test_a_packed_batch_gives_the_padded_losses_and_gradients(train, slots):
    """Attention never crosses a sequence, positions restart with each, the last layer runs at
    [CLS] and the masked tokens only: the packed row computes what the padded batch does
    (float64, so the only difference is the order of a few sums), with the padded batch's
    8 x 6 masked slots or with fewer (the short sequences mask fewer tokens)."""
    torch.manual_seed(0)
    config = get_preset("bert_2_128_2").config.replace(vocab_size=300, max_position=64, dropout=0.0, attention_dropout=0.0)
    model = PretrainingModel(config, max_seq_len=32).double().train(train)
    rng = np.random.default_rng(0)
    features = [_pair(n, rng) for n in (32, 7, 19, 32, 5, 26)]
    masking = MaskingConfig(max_predictions=6)
    padded = MLMCollator(IDS, masking, seed=0, rows=8)(features, key=(0, 0))
    packed = MLMCollator(IDS, masking, seed=0, rows=8, pack_width=160, pack_max_len=32, pack_segments=2,
                         pack_masked=slots)(features, key=(0, 0))
    assert packed["input_ids"].shape == (1, 160) and packed["cu_seqlens"].tolist()[-3:] == [131, 160, 160]
    # Masked per sequence: 4, 1, 2, 4, 1, 3 (15 % of the candidates); the two filler copies none.
    scored = padded["masked_labels"] != IGNORE_INDEX
    assert scored.sum(1).tolist() == [4, 1, 2, 4, 1, 3, 0, 0]
    assert packed["masked_labels"].shape == (1, slots or 48) and packed["masked_rows"].shape == (slots or 48,)
    assert sorted(packed["masked_labels"][0][packed["masked_labels"][0] != IGNORE_INDEX].tolist()) == \
        sorted(padded["masked_labels"][scored].tolist())
    queries, cu_q = packed["query_positions"][0], packed["cu_seqlens_q"].tolist()
    assert len(queries) == 8 + (slots or 48) and cu_q[8:] == [len(queries)] * 3  # no query in the padding
    starts = packed["seq_starts"].tolist()
    assert queries[cu_q[:8]].tolist() == starts  # each sequence's queries begin at its [CLS]
    for i in range(8):  # and stay inside it
        assert all(starts[i] <= q < packed["cu_seqlens"][i + 1] for q in queries[cu_q[i]:cu_q[i + 1]].tolist())
    with pytest.raises(UserError, match="masks 15 tokens, more than its 14 slots"):
        MLMCollator(IDS, masking, seed=0, rows=8, pack_width=160, pack_max_len=32, pack_segments=2, pack_masked=14)(features, key=(0, 0))
    results = []
    for batch in (padded, packed):
        model.zero_grad()
        out = model(**batch)
        out["loss"].backward()
        results.append((out, [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    (a, grads_a), (b, grads_b) = results
    for key in ("loss", "mlm_loss", "nsp_loss", "mlm_acc", "nsp_acc"):
        assert b[key].item() == pytest.approx(a[key].item(), rel=1e-12, abs=1e-12)
    assert len(grads_a) == len(grads_b)
    for ga, gb in zip(grads_a, grads_b):
        torch.testing.assert_close(gb, ga, rtol=1e-9, atol=1e-12 * max(1.0, ga.abs().max().item()))


def test_packed_mask_slots_bound_every_batch_of_every_epoch():
    """The slots come from the lengths alone and hold what any balanced batch masks, epoch
    after epoch; with real-like lengths they are well under the padded batch's 20 a row."""
    lengths = _lengths(2000, seed=4)
    masking = MaskingConfig(max_predictions=20)
    slots = packed_mask_slots(lengths, 64, masking)
    assert slots % 64 == 0 and slots < 0.85 * 64 * 20
    rng = np.random.default_rng(4)
    data = [_pair(n, rng) for n in lengths]
    collator = MLMCollator(IDS, masking, seed=0, rows=64, pack_width=128 * 64, pack_max_len=128, pack_masked=slots)
    most = 0
    for epoch in range(2):
        for j, idx in enumerate(balanced_batches(lengths, 64, seed=9, epoch=epoch)):
            out = collator([data[i] for i in idx], key=(epoch, j))  # raises if a batch masked more than the slots
            most = max(most, int((out["masked_labels"] != IGNORE_INDEX).sum()))
    assert slots - 64 < most <= slots  # the bound is tight: within its rounding
    whole = MaskingConfig(max_predictions=20, whole_word=True)  # may pass its target by part of a word: the cap
    assert packed_mask_slots([128] * 64 + [10] * 64, 64, whole) == -(-(32 * 20 + 32 * 10) // 64) * 64


def test_every_packed_batch_of_a_run_has_one_shape():
    """The width is the most any balanced batch holds, the padding after the sequences is cut
    into a fixed number of segments no longer than a sequence: every batch of two epochs has
    the same shapes (one compile, one CUDA graph), and what it holds is what the data says."""
    rng = np.random.default_rng(1)
    lengths = [min(n, 64) for n in _lengths(203, seed=1)]
    data = [_pair(n, rng) for n in lengths]
    rows = 16
    most, fewest = balanced_batch_tokens(lengths, rows)
    width = -(-most // 16) * 16
    segments = -(-(width - fewest) // 64) + 1
    collator = MLMCollator(IDS, MaskingConfig(max_predictions=6), seed=0, rows=rows, pack_width=width, pack_max_len=64,
                           pack_segments=segments)
    shapes = set()
    for epoch in range(2):
        for j, idx in enumerate(balanced_batches(lengths, rows, seed=0, epoch=epoch)):
            out = collator([data[i] for i in idx], key=(epoch, j))
            shapes.add(tuple((k, tuple(v.shape)) for k, v in sorted(out.items())))
            cu, starts = out["cu_seqlens"].tolist(), out["seq_starts"].tolist()
            assert cu[-1] == width and all(0 <= b - a <= 64 for a, b in zip(cu, cu[1:]))
            real = [lengths[i] for i in idx]
            assert [b - a for a, b in zip(cu, cu[1:])][:len(idx)] == real  # each sequence whole, in order
            assert (out["input_ids"][0, starts] == 1).all()  # each begins with [CLS]
            positions = out["position_ids"][0]
            assert all(positions[s:s + n].tolist() == list(range(n)) for s, n in zip(starts, real))
            rows_seen, tokens = rows_and_tokens(out)  # what the trainer logs
            assert rows_seen == rows and tokens == cu[rows]
            assert (out["input_ids"][0, cu[rows]:] == IDS.pad_id).all()
    assert len(shapes) == 1


def test_packed_pretraining_resumes_exactly(wiki_shards, tmp_path):
    """`--fast reference+pack` on real shards (on a CPU attention runs per sequence): the
    balanced order and the masks come back on resume, so a cut and resumed run logs the same
    losses as an uninterrupted one, bit for bit."""
    import dataclasses

    from ctxkit.zoo import presets

    base = presets.get_preset("bert_2_128_2")
    one_layer = dataclasses.replace(base, config=base.config.replace(num_layers=1))
    masking = MaskingConfig(max_predictions=6)

    def cfg(steps):
        return TrainConfig(batch_size=8, lr=1e-3, warmup_ratio=0.1, device="cpu", progress=False, log_every=1,
                           eval_each_epoch=False, seed=7, epochs=1, max_steps=steps, fast="reference+pack")

    def losses(run):
        records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
        return [r["loss"] for r in records if r.get("event") == "train"], records

    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(presets.PRESETS, "bert_2_128_2", one_layer)
        pretrain(wiki_shards, "bert_2_128_2", tmp_path / "full", cfg(6), masking=masking)
        pretrain(wiki_shards, "bert_2_128_2", tmp_path / "cut", cfg(3), masking=masking)
        torch.manual_seed(99)  # resume must restore the global RNG too
        pretrain(wiki_shards, "bert_2_128_2", tmp_path / "cut", cfg(6), masking=masking, resume=True)
    full, records = losses(tmp_path / "full")
    assert records[0]["fast"] == "pack" and len(full) == 6
    assert losses(tmp_path / "cut")[0] == full
    train = [r for r in records if r.get("event") == "train"]
    assert all(r["seq_per_s"] > 0 and r["tokens_per_s"] > 8 * r["seq_per_s"] for r in train)  # sequences, not rows
