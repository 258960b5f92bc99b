"""Building blocks: attention scoring functions, masks, positions, Transformer layers."""

import math

import pytest
import torch
from torch import nn

from ctxkit.layers import (
    AdditiveAttention,
    AddNorm,
    DotProductAttention,
    MultiHeadAttention,
    SinusoidalPositionalEncoding,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
    causal_mask,
    masked_softmax,
    padding_mask,
    scaled_dot_product_attention,
    sinusoidal_table,
)
from tolerance import assert_close_to_reference, assert_paths_agree, assert_same_function, float64

# tests/README.md: formulas are checked against their float64 evaluation, with bounds from eps,
# the magnitude, the depth and the reduction length k; softmax outputs take their logits' size
# as the scale (a probability's error is at most half its logits' error).


def test_masked_softmax_zeroes_masked_and_handles_empty_rows():
    scores = torch.tensor([[1.0, 2.0, 3.0], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[True, True, False], [False, False, False]])
    w = masked_softmax(scores, mask)
    exact = torch.tensor([1 / (1 + math.e), math.e / (1 + math.e), 0.0], dtype=torch.float64)
    assert_close_to_reference(w[0], exact, scale=2.0, depth=2, k=2, name="softmax of 1, 2")
    assert torch.equal(w[1], torch.zeros(3))  # fully masked row: zeros, not NaN


def test_causal_mask_with_cache_offset():
    assert torch.equal(causal_mask(3), torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]]).bool())
    # 2 new queries after 3 cached keys: query 0 is position 3, sees keys 0..3.
    assert torch.equal(causal_mask(2, 5), torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]).bool())


def test_additive_attention_matches_formula():
    att = AdditiveAttention(query_size=3, key_size=4, hidden_size=5)
    q, k, v = torch.randn(2, 1, 3), torch.randn(2, 6, 4), torch.randn(2, 6, 7)
    mask = torch.ones(2, 1, 6, dtype=torch.bool)
    mask[1, :, 4:] = False
    out, w = att(q, k, v, mask)
    att64 = float64(att)
    out64, w64 = att64(q.double(), k.double(), v.double(), mask)

    def formula(att, q, k, v, b, n):
        scores = torch.stack([att.w_v(torch.tanh(att.w_q(q[b, 0]) + att.w_k(k[b, j]))).squeeze() for j in range(n)])
        return scores, scores.softmax(0), scores.softmax(0) @ v[b, :n]

    for b in range(2):
        n = 6 if b == 0 else 4
        _, ref_w, ref_out = formula(att, q, k, v, b, n)
        scores64, ref_w64, ref_out64 = formula(att64, q.double(), k.double(), v.double(), b, n)
        weights = dict(scale=scores64.abs().max().item(), depth=3, k=6)  # scores: 2 GEMMs, tanh, 1 GEMM
        assert_close_to_reference(w64[b, 0, :n], ref_w64, name="weights float64", **weights)
        assert_same_function(w[b, 0, :n], ref_w, ref_w64, name="weights", **weights)
        assert_close_to_reference(out64[b, 0], ref_out64, depth=4, k=6, name="output float64")
        assert_same_function(out[b, 0], ref_out, ref_out64, depth=4, k=6, name="output")
    assert w[1, 0, 4:].abs().max() == 0


@pytest.mark.parametrize("scaled", [True, False])
def test_dot_product_attention(scaled):
    q, k, v = torch.randn(2, 3, 8), torch.randn(2, 5, 8), torch.randn(2, 5, 4)
    out, w = DotProductAttention(scaled=scaled)(q, k, v)
    scores = q @ k.transpose(1, 2) / (math.sqrt(8) if scaled else 1.0)
    out64, w64 = DotProductAttention(scaled=scaled)(q.double(), k.double(), v.double())
    scores64 = q.double() @ k.double().transpose(1, 2) / (math.sqrt(8) if scaled else 1.0)
    weights = dict(scale=scores64.abs().max().item(), depth=2, k=8)
    assert_close_to_reference(w64, scores64.softmax(-1), name="weights float64", **weights)
    assert_same_function(w, scores.softmax(-1), scores64.softmax(-1), name="weights", **weights)
    assert_close_to_reference(out64, scores64.softmax(-1) @ v.double(), depth=3, k=8, name="output float64")
    assert_same_function(out, scores.softmax(-1) @ v, scores64.softmax(-1) @ v.double(), depth=3, k=8, name="output")


def test_sdpa_path_equals_eager_path_with_padding_and_causal_masks():
    q, k, v = torch.randn(3, 4, 7, 16), torch.randn(3, 4, 7, 16), torch.randn(3, 4, 7, 16)
    lengths = torch.tensor([7, 5, 2])
    keep = torch.arange(7)[None, :] < lengths[:, None]
    for mask in (padding_mask(keep), padding_mask(keep) & causal_mask(7)):
        fast, none = scaled_dot_product_attention(q, k, v, mask)
        eager, w = scaled_dot_product_attention(q, k, v, mask, need_weights=True)
        eager64, _ = scaled_dot_product_attention(q.double(), k.double(), v.double(), mask, need_weights=True)
        assert none is None
        assert_same_function(fast, eager, eager64, depth=3, k=16, name="sdpa vs eager")  # scores, softmax, mix
        # a softmax sums to one up to its own normalisation's rounding (7 keys), whatever its logits' errors
        assert_close_to_reference(w.sum(-1), torch.ones(3, 4, 7, dtype=torch.float64), scale=1.0, depth=2, k=7,
                                  name="sum of the weights")
        assert w[2, :, :, 2:].abs().max() == 0  # padding keys get no weight


def test_multi_head_attention_equals_per_head_definition():
    mha = MultiHeadAttention(embed_dim=12, num_heads=3).eval()
    x = torch.randn(2, 5, 12)
    out, w = mha(x, need_weights=True)
    mha64 = float64(mha)
    out64, w64 = mha64(x.double(), need_weights=True)

    def definition(mha, x):
        heads, weights, logits = [], [], []
        for h in range(3):
            rows = slice(4 * h, 4 * h + 4)
            qh = x @ mha.q_proj.weight[rows].T + mha.q_proj.bias[rows]
            kh = x @ mha.k_proj.weight[rows].T + mha.k_proj.bias[rows]
            vh = x @ mha.v_proj.weight[rows].T + mha.v_proj.bias[rows]
            logits.append(qh @ kh.transpose(1, 2) / 2.0)  # sqrt(head_dim=4) = 2
            weights.append(logits[-1].softmax(-1))
            heads.append(weights[-1] @ vh)
        return mha.out_proj(torch.cat(heads, -1)), torch.stack(weights, 1), torch.stack(logits, 1)

    ref, att, _ = definition(mha, x)
    ref64, att64, logits64 = definition(mha64, x.double())
    weights = dict(scale=logits64.abs().max().item(), depth=2, k=12)  # projections, then scores
    assert_close_to_reference(w64, att64, name="weights float64", **weights)
    assert_same_function(w, att, att64, name="weights", **weights)
    assert_close_to_reference(out64, ref64, depth=4, k=12, name="output float64")
    assert_same_function(out, ref, ref64, depth=4, k=12, name="output")
    fast, _ = mha(x)
    assert_close_to_reference(fast, ref64, depth=4, k=12, name="sdpa output")


def test_multi_head_cross_attention_other_width():
    mha = MultiHeadAttention(8, 2, key_dim=6).eval()
    out, w = mha(torch.randn(2, 3, 8), torch.randn(2, 4, 6), need_weights=True)
    assert out.shape == (2, 3, 8) and w.shape == (2, 2, 3, 4)
    with pytest.raises(ValueError, match="not divisible"):
        MultiHeadAttention(10, 3)


def test_sinusoidal_table_formula():
    table = sinusoidal_table(50, 16)
    i, j = 7, 3
    # computed in float64 and rounded once to float32: within eps/2 of the exact value
    exact = torch.tensor([math.sin(i / 10000 ** (2 * j / 16)), math.cos(i / 10000 ** (2 * j / 16))], dtype=torch.float64)
    assert_close_to_reference(table[i, 2 * j:2 * j + 2], exact, scale=1.0, name="sin, cos")
    assert torch.equal(table[0, 1::2], torch.ones(8))
    enc = SinusoidalPositionalEncoding(16, max_len=50)
    assert torch.equal(enc(5, offset=7), table[7:12])
    with pytest.raises(ValueError, match="exceeds"):
        enc(51)
    assert "table" not in enc.state_dict()  # fixed, so never saved


def test_add_norm_post_and_pre():
    x = torch.randn(2, 3, 4)
    f = nn.Linear(4, 4)
    post, pre = AddNorm(4, norm_first=False).eval(), AddNorm(4, norm_first=True).eval()
    x64, f64 = x.double(), float64(f)
    post_ref64 = nn.functional.layer_norm(x64 + f64(x64), (4,), eps=1e-5)
    pre_ref64 = x64 + f64(nn.functional.layer_norm(x64, (4,), eps=1e-5))
    # LayerNorm divides its input's rounding (at the input's size) by the standard deviation of
    # 4 values, which can be small: per row, the scale is max |input| / std
    summed = x64 + f64(x64)
    post_bound = dict(depth=2, k=4, scale=summed.abs().amax(-1, keepdim=True) / summed.std(-1, unbiased=False, keepdim=True))
    assert_close_to_reference(float64(post)(x64, f64), post_ref64, name="post-norm float64", **post_bound)
    assert_same_function(post(x, f), nn.functional.layer_norm(x + f(x), (4,), eps=1e-5), post_ref64, name="post-norm", **post_bound)
    assert_close_to_reference(float64(pre)(x64, f64), pre_ref64, depth=2, k=4, name="pre-norm float64")
    assert_same_function(pre(x, f), x + f(nn.functional.layer_norm(x, (4,), eps=1e-5)), pre_ref64, depth=2, k=4, name="pre-norm")


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_padded_equals_unpadded(norm_first):
    enc = TransformerEncoder(2, 16, 4, 32, norm_first=norm_first).eval()
    a, b = torch.randn(1, 6, 16), torch.randn(1, 3, 16)
    batch = torch.cat([a, torch.cat([b, torch.randn(1, 3, 16)], 1)])
    keep = torch.tensor([[1] * 6, [1] * 3 + [0] * 3])
    out = enc(batch, mask=padding_mask(keep), output_hidden_states=True).hidden_states
    alone_a = enc(a, output_hidden_states=True).hidden_states
    alone_b = enc(b, output_hidden_states=True).hidden_states
    assert len(out) == 3
    for depth, (full, ra, rb) in enumerate(zip(out, alone_a, alone_b), start=1):  # the input, then 2 layers
        assert_paths_agree(full[0], ra[0], depth=depth, k=32, name=f"hidden state {depth - 1}, row 0")
        assert_paths_agree(full[1, :3], rb[0], depth=depth, k=32, name=f"hidden state {depth - 1}, padded row 1")


def test_encoder_layer_attention_weights_and_dropout_in_training():
    layer = TransformerEncoderLayer(16, 4, 32, dropout=0.5)
    x = torch.randn(2, 5, 16)
    layer.eval()
    y1, w = layer(x, need_weights=True)
    y2, _ = layer(x)
    assert_paths_agree(y1, y2, k=32, name="eager vs sdpa layer")  # one layer: its longest reduction is the FFN
    assert w.shape == (2, 4, 5, 5)
    layer.train()
    assert not torch.allclose(layer(x)[0], y2)


def test_decoder_layer_is_causal_and_uses_memory():
    dec = TransformerDecoderLayer(16, 4, 32, memory_dim=8).eval()
    x, mem = torch.randn(1, 5, 16), torch.randn(1, 7, 8)
    out, self_w, cross_w = dec(x, mem, need_weights=True)
    assert torch.equal(self_w[0, 0] > 0, causal_mask(5))  # no weight on the future
    x2 = x.clone()
    x2[0, 4] += 1.0  # changing the last target token leaves earlier outputs unchanged
    out2, _, _ = dec(x2, mem)
    assert_paths_agree(out[0, :4], out2[0, :4], k=32, name="outputs before the changed token")
    assert not torch.allclose(out[0, 4], out2[0, 4])
    mem2 = mem.clone()
    mem2[0, 0] += 1.0
    assert not torch.allclose(dec(x, mem2)[0], out)  # cross-attention reads the memory
    keep = torch.tensor([[1, 1, 1, 1, 0, 0, 0]])
    _, _, cw = dec(x, mem, memory_mask=padding_mask(keep), need_weights=True)
    assert cw[..., 4:].abs().max() == 0


def test_ffn_gelu_epilogue_is_tanh_gelu_in_inference_and_plain_in_training():
    """The fused fc1 + tanh GELU (one GEMM on CUDA) equals the spelled-out tanh form, is
    within tanh-vs-erf distance of BERT's erf FFN, and never runs where gradients flow."""
    import torch.nn.functional as F

    from ctxkit.fast import enable_gelu_epilogue
    from ctxkit.layers.ffn import PositionwiseFFN

    torch.manual_seed(0)
    ffn = PositionwiseFFN(16, 64, "gelu")
    x = torch.randn(3, 7, 16)
    erf = ffn(x)
    assert enable_gelu_epilogue(ffn) == 1
    with torch.no_grad():
        fused = ffn(x)
        tanh = ffn.fc2(F.gelu(ffn.fc1(x), approximate="tanh"))
    assert_paths_agree(fused, tanh, depth=2, k=64, name="fused vs spelled-out tanh GELU")  # fc1, GELU, fc2
    assert 0 < (fused - erf).abs().max() < 1e-2  # a different function, but a close one
    assert torch.equal(ffn(x), erf)  # grad enabled: the exact erf path, differentiable
    ffn(x).sum().backward()
    assert ffn.fc1.weight.grad is not None


def test_compiled_inference_reuses_the_right_fused_projection_per_set():
    """Concatenated projections are cached per set: a [CLS]-only last layer asks for k/v
    while the other layers ask for q/k/v, and a compiled graph (static, then dynamic
    shapes over packed rows) must get each its own concatenation."""
    from ctxkit.fast import fuse_qkv, prepare_inference
    from ctxkit.heads.classification import EncoderWithHead, SequenceClassificationHead
    from ctxkit.layers.attention import PackedSequences
    from ctxkit.models.bert.model import BertModel
    from ctxkit.zoo.presets import get_preset

    torch.manual_seed(0)
    config = get_preset("bert_2_128_2").config.replace(vocab_size=300, dropout=0.0, attention_dropout=0.0)
    model = EncoderWithHead(BertModel(config), SequenceClassificationHead(128, 2, 0.0), cls_only=True).eval()
    fuse_qkv(model)
    # Two rows, one of them padded: packed rows of two lengths. Each row is a symbolic length
    # in the dynamic graph (one attention call per row on the CPU), so rows cost tracing time.
    ids = torch.randint(5, 300, (2, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    with torch.inference_mode():
        expect, expect_padded = model(ids)["logits"], model(ids, mask)["logits"]
        prepare_inference(model)
        assert len(model.encoder.encoder.layers[-1].self_attn._fused_cache) == 2  # q/k/v and k/v
        torch._dynamo.reset()
        # What is checked is what tracing reads from the caches (dynamo + AOTAutograd, as under
        # Inductor); Inductor's C++ codegen adds nothing to that, and test_generate.py runs
        # it on the decoding path that fills the caches this way (StaticDecoder).
        assert torch.allclose(torch.compile(model, backend="aot_eager")(ids)["logits"], expect, atol=1e-5)
        packed = torch.compile(model, dynamic=True, backend="aot_eager")(ids * mask, PackedSequences(mask))["logits"]
        assert torch.allclose(packed, expect_padded, atol=1e-5)


def test_bucketed_packed_batch_gives_the_real_rows_their_own_outputs():
    """GPUEncoder's graph buckets: filler and empty rows added by bucket_batch leave the
    real rows' packed outputs unchanged, and the axes cut back to the caller's shape."""
    from ctxkit.heads.classification import EncoderWithHead, TokenClassificationHead
    from ctxkit.inference.gpu import GPUEncoder, bucket_batch, token_bucket
    from ctxkit.layers.attention import PackedSequences
    from ctxkit.models.bert.model import BertModel
    from ctxkit.zoo.presets import get_preset

    assert [token_bucket(n) for n in (1, 256, 257, 4096, 4097, 6446)] == [256, 256, 512, 4096, 4608, 6656]
    torch.manual_seed(0)
    config = get_preset("bert_2_128_2").config.replace(vocab_size=300, dropout=0.0, attention_dropout=0.0)
    model = EncoderWithHead(BertModel(config), TokenClassificationHead(128, 5, 0.0)).eval()
    ids = torch.randint(5, 300, (3, 12), generator=torch.Generator().manual_seed(1))
    types = torch.randint(0, 2, (3, 12), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    mask[2, 9:] = 0
    b_ids, b_types, b_mask = bucket_batch(ids, types, mask)
    rows, width = b_mask.shape
    assert rows & (rows - 1) == 0 and rows >= 32 and width == 33 and int(b_mask.sum()) == 256
    from ctxkit.inference.gpu import _next_power_of_two

    assert [_next_power_of_two(n) for n in (1, 2, 3, 32, 33, 100, 512)] == [1, 2, 4, 32, 64, 128, 512]
    assert bucket_batch(ids[:, :10], None, mask[:, :10])[2].shape[1] == 33  # widths up to 32 share a graph
    wide = torch.ones(2, 40, dtype=torch.long)
    wide[1, 30:] = 0
    assert bucket_batch(wide, None, wide)[2].shape == (32, 65)
    assert torch.equal(b_mask[:3, :12], mask.bool()) and not b_mask[:3, 12:].any()
    with torch.inference_mode():
        expect = model(ids, PackedSequences(mask), token_type_ids=types)
        got = model(b_ids, PackedSequences(b_mask), token_type_ids=b_types)
    cut = GPUEncoder._cut(got["logits"], rows, width, 3, 12)  # (batch, seq, labels): both axes cut
    assert cut.shape == expect["logits"].shape == (3, 12, 5)
    # the same packed rows in a larger batch (other GEMM shapes): embeddings, 2 layers, the head
    assert_paths_agree(cut, expect["logits"], depth=4, k=512, name="bucketed vs plain packed logits")
