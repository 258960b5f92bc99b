"""Transformer-XL: relative attention, rel_shift, memories, adaptive embeddings."""

import math

import pytest
import torch

from ctxkit.layers import RelativeMultiHeadAttention, causal_mask, rel_shift, relative_distance_index
from ctxkit.zoo.presets import TRANSFO_XL_PRESETS
from ctxkit.models.transformer_xl.model import AdaptiveEmbedding, TransformerXLConfig, TransformerXLLMHeadModel, TransformerXLModel
from tolerance import assert_close_to_reference, assert_paths_agree, assert_same_function, float64, to64

# Tiny models on a shared CPU only gain synchronisation from a second thread.
pytestmark = pytest.mark.usefixtures("one_thread")


# tests/README.md: tolerances from eps, the magnitude, the depth and the longest reduction k.
# _tiny: embeddings + 3 layers whose longest reduction is the 64-wide FFN.
BODY = dict(depth=4, k=64)


def _tiny(**changes) -> TransformerXLConfig:
    base = TransformerXLConfig(vocab_size=50, d_model=32, n_heads=4, d_inner=64, n_layers=3, mem_len=64, tgt_len=8,
                               dropout=0.0, dropatt=0.0, cutoffs=(10, 30), div_val=2)
    return base.replace(**changes)


@pytest.mark.parametrize("qlen,mlen", [(1, 0), (5, 0), (4, 3), (7, 11), (3, 1)])
def test_rel_shift_matches_direct_relative_scores(qlen, mlen):
    torch.manual_seed(qlen * 31 + mlen)
    klen = qlen + mlen
    q = torch.randn(2, 3, qlen, 8)
    r = torch.randn(3, klen, 8)  # row c encodes distance klen - 1 - c
    shifted = rel_shift(q @ r.transpose(-2, -1))
    direct = torch.einsum("bhid,hijd->bhij", q, r[:, relative_distance_index(qlen, klen)])
    valid = causal_mask(qlen, klen)  # rel_shift is exact where key j is not in the future of query i
    assert valid.sum() == qlen * mlen + qlen * (qlen + 1) // 2
    # 8-term dot products (GEMM vs einsum): equal in float64 up to its bound, each float32 side near
    # that; the scale of a dot product's rounding is sum |q_d r_d|, per element (tests/README.md)
    q64, r64 = q.double(), r.double()
    shifted64 = rel_shift(q64 @ r64.transpose(-2, -1))
    direct64 = torch.einsum("bhid,hijd->bhij", q64, r64[:, relative_distance_index(qlen, klen)])
    terms = rel_shift(q64.abs() @ r64.abs().transpose(-2, -1))
    bound = dict(k=8, scale=terms[..., valid])
    assert_close_to_reference(shifted64[..., valid], direct64[..., valid], name="rel_shift float64", **bound)
    assert_same_function(shifted[..., valid], direct[..., valid], direct64[..., valid], name="relative scores",
                         labels=("rel_shift", "direct"), **bound)
    # And the distance is really i + mlen - j.
    for i in range(qlen):
        for j in range(i + mlen + 1):
            expected = (q64[..., i, :] * r64[:, klen - 1 - (i + mlen - j)]).sum(-1)
            assert_close_to_reference(shifted[..., i, j], expected, k=8, scale=terms[..., i, j], name=f"score of query {i}, key {j}")


@pytest.mark.parametrize("mlen", [0, 5])
def test_relative_attention_fast_equals_direct(mlen):
    torch.manual_seed(mlen)
    attn = RelativeMultiHeadAttention(24, 3).eval()
    torch.nn.init.normal_(attn.u)
    torch.nn.init.normal_(attn.v)
    x = torch.randn(2, 6, 24)
    memory = torch.randn(2, mlen, 24) if mlen else None
    pos = torch.randn(6 + mlen, 24)
    mask = causal_mask(6, 6 + mlen)
    fast, w_fast = attn(x, pos, memory, mask, need_weights=True)
    direct, w_direct = attn(x, pos, memory, mask, need_weights=True, direct=True)
    attn64, (x64, pos64, memory64) = float64(attn), to64((x, pos, memory))
    fast64, w_fast64 = attn64(x64, pos64, memory64, mask, need_weights=True)
    direct64, w_direct64 = attn64(x64, pos64, memory64, mask, need_weights=True, direct=True)
    # one attention block whose longest reduction is the 24-wide projection (tests/README.md)
    assert_close_to_reference(fast64, direct64, depth=2, k=24, name="output float64")
    assert_same_function(fast, direct, direct64, depth=2, k=24, name="output", labels=("fast", "direct"))
    assert_close_to_reference(w_fast64, w_direct64, depth=2, k=24, name="weights float64")
    assert_same_function(w_fast, w_direct, w_direct64, depth=2, k=24, name="weights", labels=("fast", "direct"))
    # The batched (batch, 1, q, k) mask form gives the same.
    again, _ = attn(x, pos, memory, mask[None, None].expand(2, 1, -1, -1))
    torch.testing.assert_close(again, fast)


def test_shared_u_v_across_layers():
    model = TransformerXLModel(_tiny(untie_r=False))
    assert all(layer.self_attn.u is model.u and layer.self_attn.v is model.v for layer in model.layers)
    n_unique = sum(p.numel() for p in model.parameters())
    untied = TransformerXLModel(_tiny(untie_r=True))
    assert sum(p.numel() for p in untied.parameters()) - n_unique == 2 * 2 * 32  # 3 layers' u, v vs one pair


@pytest.mark.parametrize("pre_lnorm", [False, True])
def test_segments_with_memory_equal_one_pass(pre_lnorm):
    torch.manual_seed(0)
    model = TransformerXLModel(_tiny(pre_lnorm=pre_lnorm)).eval()
    ids = torch.randint(0, 50, (2, 20))
    full, _ = model(ids)  # one pass, causal mask over the whole sequence
    mems, outs = None, []
    for start in range(0, 20, 6):  # segments of 6, 6, 6, 2
        h, mems = model(ids[:, start:start + 6], mems)
        outs.append(h)
    assert mems[0].shape == (2, 20, 32)
    for start, h in zip(range(0, 20, 6), outs):
        assert_paths_agree(h, full[:, start:start + h.size(1)], name=f"segment at {start} vs one pass", **BODY)


def test_limited_memory_equals_banded_mask_one_layer():
    # With one layer the memory holds embeddings only, so a memory of m states is the
    # same as one pass where the segment starting at s sees keys from s - m on.
    torch.manual_seed(1)
    model = TransformerXLModel(_tiny(n_layers=1, mem_len=4)).eval()
    ids = torch.randint(0, 50, (2, 15))
    seg = 5
    mask = causal_mask(15, 15)
    for i in range(15):
        mask[i, : max(0, (i // seg) * seg - 4)] = False
    full, _ = model(ids, attention_mask=mask)
    mems = None
    for start in range(0, 15, seg):
        h, mems = model(ids[:, start:start + seg], mems)
        assert mems[0].size(1) == 4
        assert_paths_agree(h, full[:, start:start + seg], depth=2, k=64, name=f"segment at {start} vs banded one pass")


def test_causal_future_tokens_do_not_change_outputs():
    torch.manual_seed(2)
    model = TransformerXLModel(_tiny()).eval()
    ids = torch.randint(0, 50, (1, 12))
    changed = ids.clone()
    changed[0, 8] = (ids[0, 8] + 1) % 50
    _, mems = model(ids[:, :4])
    a, _ = model(ids[:, 4:], mems)
    b, _ = model(changed[:, 4:], mems)
    assert_paths_agree(a[:, :4], b[:, :4], name="outputs before the changed token", **BODY)
    assert not torch.allclose(a[:, 4:], b[:, 4:])


def test_no_gradient_into_memory():
    torch.manual_seed(3)
    model = TransformerXLLMHeadModel(_tiny())
    seg1 = torch.randint(0, 25, (2, 6))  # words 0..24 in segment 1, 25..49 in segment 2
    seg2 = torch.randint(25, 50, (2, 6))
    out1 = model(seg1, labels=seg1)
    assert all(not m.requires_grad for m in out1.mems)
    out2 = model(seg2, labels=seg2, mems=out1.mems)
    out2.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    # Rows of the words seen only in segment 1 get nothing: no path through the memory.
    emb0 = model.transformer.word_emb.emb_layers[0].weight.grad
    assert emb0 is None or torch.count_nonzero(emb0) == 0  # cluster 0 = words 0..9, only in segment 1
    emb1 = model.transformer.word_emb.emb_layers[1].weight.grad  # words 10..29
    assert torch.count_nonzero(emb1[: 25 - 10]) == 0
    # Same gradients as feeding the memories in as fresh constants.
    model.zero_grad(set_to_none=True)
    constants = [m.clone() for m in out1.mems]
    model(seg2, labels=seg2, mems=constants).loss.backward()
    for n, p in model.named_parameters():
        if n in grads:
            torch.testing.assert_close(p.grad, grads[n])
        else:
            assert p.grad is None or torch.count_nonzero(p.grad) == 0


def test_memory_length_is_kept():
    model = TransformerXLModel(_tiny(mem_len=5)).eval()
    ids = torch.randint(0, 50, (2, 4))
    _, mems = model(ids)
    assert [m.shape for m in mems] == [(2, 4, 32)] * 3
    _, mems2 = model(ids, mems)
    assert [m.shape for m in mems2] == [(2, 5, 32)] * 3
    torch.testing.assert_close(mems2[1][:, -4:], model(ids, mems)[1][1][:, -4:])
    assert TransformerXLModel(_tiny(mem_len=0))(ids)[1] is None


def test_adaptive_embedding_clusters_use_their_projection():
    torch.manual_seed(4)
    emb = AdaptiveEmbedding(50, 16, 12, cutoffs=(10, 30), div_val=2)
    assert [layer.weight.shape for layer in emb.emb_layers] == [(10, 16), (20, 8), (20, 4)]
    assert [p.weight.shape for p in emb.emb_projs] == [(12, 16), (12, 8), (12, 4)]
    ids = torch.tensor([[0, 9, 10, 29], [30, 49, 5, 31]])
    out = emb(ids)
    assert out.shape == (2, 4, 12)
    for word in ids.flatten().tolist():
        cluster = 0 if word < 10 else 1 if word < 30 else 2
        lo = (0, 10, 30)[cluster]
        expected = emb.emb_projs[cluster].weight @ emb.emb_layers[cluster].weight[word - lo] * math.sqrt(12)
        assert_paths_agree(out[ids == word][0], expected, k=16, name=f"word {word}")  # a 16-term projection
    single = AdaptiveEmbedding(50, 12, 12, cutoffs=(10, 30), div_val=1)
    assert_paths_agree(single(ids), single.emb_layers[0].weight[ids] * math.sqrt(12), name="div_val 1: no projection")
    with pytest.raises(ValueError):
        AdaptiveEmbedding(50, 16, 16, cutoffs=(30, 10))


def test_lm_head_log_probs_and_loss_agree():
    torch.manual_seed(5)
    for cutoffs in ((10, 30), ()):
        model = TransformerXLLMHeadModel(_tiny(cutoffs=cutoffs)).eval()
        ids = torch.randint(0, 50, (2, 7))
        labels = torch.randint(0, 50, (2, 7))
        scored = model(ids, labels=labels)
        log_probs = model(ids).log_probs
        assert log_probs.shape == (2, 7, 50)
        # An error d in a log-probability is a relative error d in the probability, so the sum of
        # probabilities is off by at most the log-probabilities' bound (scale: their magnitude).
        head = dict(depth=5, k=64)  # the body, then the (adaptive) softmax
        assert_close_to_reference(log_probs.exp().sum(-1), torch.ones(2, 7, dtype=torch.float64), scale=log_probs.abs().max().item(),
                                  name="sum of probabilities", **head)
        assert_paths_agree(scored.nll, -log_probs.gather(-1, labels[..., None])[..., 0], name="nll vs log-probabilities", **head)


def test_lm_head_under_bf16_autocast_matches_fp32():
    """The body may run in bf16; the adaptive softmax stays fp32 (it rejects mixed dtypes)."""
    torch.manual_seed(6)
    model = TransformerXLLMHeadModel(_tiny(cutoffs=(10, 30))).eval()
    ids, labels = torch.randint(0, 50, (2, 7)), torch.randint(0, 50, (2, 7))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = model(ids, labels=labels)
    full = model(ids, labels=labels)
    assert low.nll.dtype == torch.float32
    torch.testing.assert_close(low.nll, full.nll, rtol=0.05, atol=0.05)


def test_presets():
    base = TRANSFO_XL_PRESETS["transfo_xl_base_wt103"]
    assert (base.n_layers, base.d_model, base.n_heads, base.d_inner, base.mem_len) == (16, 410, 10, 2100, 150)
    assert base.cutoffs == (20000, 40000, 200000) and base.div_val == 1 and not base.pre_lnorm
    small = TRANSFO_XL_PRESETS["transfo_xl_wt2_small"]
    assert small.d_model == 256 and small.vocab_size == 33278


def _train_copy_task(mem_len: int, steps: int = 300, seed: int = 0, lr: float = 1e-2) -> float:
    """Random length-P patterns repeated; segments shorter than P, so predicting a word
    (= the word P back) needs the memory."""
    torch.manual_seed(seed)
    period, seg, vocab, length = 6, 3, 12, 24
    model = TransformerXLLMHeadModel(TransformerXLConfig(vocab_size=vocab, d_model=32, n_heads=2, d_inner=64, n_layers=1,
                                                         mem_len=mem_len, tgt_len=seg, dropout=0.0, cutoffs=()))
    opt = torch.optim.Adam(model.parameters(), lr=lr)

    def run(batch: int, train: bool) -> float:
        pattern = torch.randint(0, vocab, (batch, period))
        text = pattern.repeat(1, length // period + 1)[:, : length + 1]
        mems, losses = None, []
        for start in range(0, length, seg):
            out = model(text[:, start:start + seg], labels=text[:, start + 1:start + seg + 1], mems=mems)
            mems = out.mems
            if start + 1 >= period:  # targets that repeat an earlier word
                losses.append(out.loss)
        loss = torch.stack(losses).mean()
        if train:
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # as Transformer-XL training does
            opt.step()
        return loss.item()

    for _ in range(steps):
        run(16, True)
    with torch.no_grad():
        return run(64, False)


def test_memory_lets_a_tiny_model_copy_beyond_the_segment():
    with_memory = _train_copy_task(mem_len=6)
    without = _train_copy_task(mem_len=0)
    assert without > 0.8 * math.log(12)  # chance: the source word is never in the segment
    assert with_memory < 0.5
