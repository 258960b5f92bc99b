"""Transformer encoder-decoder: learns a synthetic copy task (>= 90 % exact, greedy and beam),
cached decoding equals uncached, and the inverse-square-root schedule."""

import pytest
import torch

from ctxkit.decoding import GenerationConfig, generate
from ctxkit.zoo.presets import Seq2SeqConfig
from ctxkit.models.seq2seq.model import TransformerSeq2Seq
from tolerance import assert_paths_agree

PAD, BOS, EOS = 0, 1, 2
# Width 32 learns the 13-symbol copy task as surely as 64 did, at about half the CPU time.
CONFIG = Seq2SeqConfig(2, 2, 32, 4, 64, vocab_size=16, max_position=32, dropout=0.0, attention_dropout=0.0)


def _copy_batch(n, g):
    """Random symbol strings (ids 3..15, length 3..8); the target is the source itself."""
    lengths = torch.randint(3, 9, (n,), generator=g)
    src = torch.full((n, 8), PAD)
    tgt = torch.full((n, 10), PAD)
    for i, length in enumerate(lengths.tolist()):
        seq = torch.randint(3, 16, (length,), generator=g)
        src[i, :length] = seq
        tgt[i, : length + 2] = torch.cat([torch.tensor([BOS]), seq, torch.tensor([EOS])])
    return src, tgt


def _decode(model, src, **kw):
    out = generate(model.bind(src), torch.full((src.size(0), 1), BOS), config=GenerationConfig(max_new_tokens=10, eos_token_id=EOS, pad_token_id=PAD, **kw))
    return [row[1:].tolist()[: row[1:].tolist().index(EOS)] if EOS in row[1:].tolist() else row[1:].tolist() for row in out]


@pytest.fixture(scope="module")
def trained():
    from ctxkit.training.optim import inverse_sqrt_warmup

    torch.manual_seed(0)
    model = TransformerSeq2Seq(CONFIG)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3, betas=(0.9, 0.98), weight_decay=0.0)
    loss = _train_copy(model, opt, 400, inverse_sqrt_warmup(opt, 40))
    return model.eval(), loss


# A training outcome, not a trajectory: BLAS kernels and thread counts change the rounding, so
# the weights after training differ from machine to machine. Observed for the Transformer
# (400 steps): 97.5-100 % exact greedy and 95-100 % beam under 1 and 2 threads and with other
# torch seeds (350 steps had left one seed at 92.5 % beam); for the RNN (200 steps of 128):
# greedy 99-100 %, beam 95-100 %. 90 % leaves room; chance is (1/13)^length.
EXACT = 0.9


def _train_copy(model, opt, steps, sched=None, batch_size=64) -> float:
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        src, tgt = _copy_batch(batch_size, g)
        loss = model(src, tgt, label_smoothing=0.0)["loss"]
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if sched is not None:
            sched.step()
    return loss.item()


def _exact(predicted, gold) -> float:
    return sum(p == g for p, g in zip(predicted, gold)) / len(gold)


def test_copy_task_learned(trained):
    model, last_loss = trained
    src, _ = _copy_batch(200, torch.Generator().manual_seed(123))  # unseen strings
    gold = [row[row != PAD].tolist() for row in src]
    with torch.no_grad():
        greedy, beam = _exact(_decode(model, src), gold), _exact(_decode(model, src[:40], num_beams=4), gold[:40])
    assert greedy >= EXACT and beam >= EXACT, f"exact copies: greedy {greedy:.3f}, beam {beam:.3f} (final loss {last_loss:.4f})"


def test_cached_decoding_equals_full_decoding(trained):
    model, _ = trained
    src, tgt = _copy_batch(5, torch.Generator().manual_seed(7))
    with torch.no_grad():
        memory, mask = model.encode(src, (src != PAD).long()), (src != PAD).long()
        full = model.decode(tgt[:, :6], memory, mask)
        cache = model.new_cache(5, 16)
        steps = [model.decode(tgt[:, j : j + 1], memory, mask, cache=cache) for j in range(6)]
    # One decoder pass vs step by step: the same function, its sums in another order (the
    # longest reduction is the FFN's 64-wide input).
    assert_paths_agree(torch.cat(steps, 1), full, depth=4, k=64, name="cached decoding logits")
    # The memory's cross-attention keys/values projected once give the same logits.
    with torch.no_grad():
        kv = model.decoder.project_memory(memory)
        cache = model.new_cache(5, 16)
        reused = [model.decode(tgt[:, j : j + 1], memory, mask, cache=cache, memory_kv=kv) for j in range(6)]
    assert_paths_agree(torch.cat(reused, 1), full, depth=4, k=64, name="logits with projected memory")


def test_label_smoothing_and_schedule():
    from ctxkit.training.optim import inverse_sqrt_warmup

    torch.manual_seed(0)
    model = TransformerSeq2Seq(CONFIG)
    src, tgt = _copy_batch(8, torch.Generator().manual_seed(1))
    plain, smooth = model(src, tgt, label_smoothing=0.0)["loss"], model(src, tgt, label_smoothing=0.1)["loss"]
    assert plain.item() != smooth.item()
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = inverse_sqrt_warmup(opt, 4)
    lrs = []
    for _ in range(16):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert lrs[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert lrs[15] == pytest.approx((4 / 16) ** 0.5)


def test_rnn_attention_baseline_learns_copy_and_caches(tmp_path):
    from ctxkit.zoo.presets import RNNSeq2SeqConfig
    from ctxkit.models.seq2seq.model import RNNSeq2Seq, load_seq2seq, save_seq2seq

    torch.manual_seed(0)
    model = RNNSeq2Seq(RNNSeq2SeqConfig(embed_size=32, hidden_size=64, attention_size=64, vocab_size=16, max_position=32, dropout=0.0))
    # 200 steps of 128 strings rather than 400 of 64: the same strings seen, a quarter less CPU
    # (much of an RNN step is per-time-step overhead that does not grow with the batch).
    loss = _train_copy(model, torch.optim.Adam(model.parameters(), lr=3e-3), 200, batch_size=128)
    model.eval()
    src, _ = _copy_batch(200, torch.Generator().manual_seed(123))
    gold = [row[row != PAD].tolist() for row in src]
    with torch.no_grad():
        greedy, beam = _exact(_decode(model, src), gold), _exact(_decode(model, src[:20], num_beams=3), gold[:20])
        assert greedy >= EXACT and beam >= EXACT, (greedy, beam, loss)
        # Step-by-step decoding with the recurrent state equals one pass over the targets.
        _, tgt = _copy_batch(4, torch.Generator().manual_seed(5))
        memory, mask = model.encode(src[:4]), (src[:4] != PAD).long()
        full = model.decode(tgt[:, :5], memory, mask)
        state = model.new_cache(4, 16)
        steps = torch.cat([model.decode(tgt[:, j : j + 1], memory, mask, cache=state) for j in range(5)], 1)
    # Recurrent state carried over 5 steps: 5 chained blocks of 96-term sums (input + hidden).
    assert_paths_agree(steps, full, depth=5, k=96, name="RNN cached decoding logits")
    save_seq2seq(model, tmp_path)
    again = load_seq2seq(tmp_path)
    assert type(again) is RNNSeq2Seq
    with torch.no_grad():
        assert_paths_agree(again.decode(tgt[:, :5], again.encode(src[:4]), mask), full, depth=5, k=96, name="reloaded model")
