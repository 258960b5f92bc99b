"""Sparse Transformer attention (layers/sparse_attention.py): the masks are the paper's sets,
the block-sparse kernel computes dense attention under that mask, its block masks really
skip tiles, and MultiHeadAttention takes a pattern as its mask."""

import importlib.util
import math

import pytest
import torch
from tolerance import assert_close_to_reference, assert_paths_agree

from ctxkit.core.errors import UserError
from ctxkit.layers import MultiHeadAttention, SparsePattern, TransformerEncoderLayer, flex_attention_available
from ctxkit.layers import sparse_attention as sa

needs_flex = pytest.mark.skipif(not flex_attention_available(), reason=f"FlexAttention needs torch >= {sa.FLEX_MIN_TORCH}")


def paper_sets(kind: str, l: int, c: int, causal: bool, i: int, n: int) -> set:
    """A1 ∪ A2 of query i by enumeration, written from the paper's definitions."""
    out = set()
    for j in range(n):
        if kind == "strided":
            a1 = 0 <= i - j < l if causal else abs(i - j) < l
            a2 = (i - j) % l == 0
        else:
            a1 = j // l == i // l
            a2 = j % l in range(l - c, l)
        if (a1 or a2) and (j <= i or not causal):
            out.add(j)
    return out


def reference(q, k, v, mask):
    """softmax(q k^T / sqrt(d), masked) v in float64."""
    s = q.double() @ k.double().transpose(-1, -2) / math.sqrt(q.size(-1))
    return s.masked_fill(~mask, float("-inf")).softmax(-1) @ v.double()


def dense_kernel(q, k, v, part, need_lse):
    """A stand-in for FlexAttention with gradients on CPU: dense attention under the part's
    own mask, with its log-sum-exp (-inf, and zero output, on rows with no key)."""
    m = part.dense()
    s = (q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))).masked_fill(~m, torch.finfo(q.dtype).min)
    any_key = m.any(-1)
    out = torch.where(any_key[:, None], s.softmax(-1), 0.0) @ v
    lse = torch.where(any_key, s.logsumexp(-1), float("-inf"))
    return out, (lse if need_lse else None)


CASES = [  # kind, stride, summary, causal, seq_len, block_size: lengths off the tile size, several strides
    ("strided", 4, None, True, 37, 8),
    ("strided", 3, None, False, 64, 16),
    ("fixed", 4, 2, True, 37, 8),
    ("fixed", 6, 1, False, 29, 8),
]


@pytest.mark.parametrize("kind", ["strided", "fixed"])
@pytest.mark.parametrize("causal", [True, False])
def test_masks_are_the_papers_sets(kind, causal):
    for l, n in [(1, 5), (3, 10), (4, 17), (7, 30)]:
        for c in ([None] if kind == "strided" else [1, l]):
            p = SparsePattern(kind, l, causal=causal, summary=c)
            dense = p.dense(n)
            for i in range(n):
                assert set(dense[i].nonzero().flatten().tolist()) == paper_sets(kind, l, p.summary, causal, i, n), (p, i)
            # Rows of a decoding step (queries after a cache) are the full mask's last rows.
            assert torch.equal(p.dense(3, past=n - 3), dense[n - 3:])


def test_pattern_arguments_are_checked():
    assert SparsePattern("fixed", 128).summary == 8  # the paper's c = 8 for l = 128
    for bad in [dict(kind="sliding", stride=4), dict(kind="strided", stride=0), dict(kind="strided", stride=4, summary=2),
                dict(kind="fixed", stride=4, summary=5), dict(kind="fixed", stride=4, block_size=0)]:
        with pytest.raises(UserError):
            SparsePattern(**bad)


@needs_flex
@pytest.mark.parametrize("kind, stride, summary, causal, n, block", CASES)
def test_kernel_is_dense_attention_under_the_mask(kind, stride, summary, causal, n, block):
    p = SparsePattern(kind, stride, causal=causal, summary=summary, block_size=block)
    g = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(2, 3, n, 8, generator=g) for _ in range(3))
    ref = reference(q, k, v, p.dense(n))
    bound = dict(depth=3, k=max(8, n))  # scores (8 terms), softmax and mix (n terms)
    assert_close_to_reference(p.attend(q.double(), k.double(), v.double()), ref, **bound, name="float64")
    if causal:  # float32 too (each new dtype costs the CPU reference path a trace: two cases only)
        assert_close_to_reference(p.attend(q, k, v), ref, **bound, name="float32")


@needs_flex
@pytest.mark.parametrize("kind, stride, summary, causal, n, block", CASES)
def test_reordering_and_merge_keep_gradients(kind, stride, summary, causal, n, block):
    """The layout's gathers, column-major reordering and log-sum-exp merge, differentiated
    (a dense kernel stands in for FlexAttention, which has no CPU backward)."""
    p = SparsePattern(kind, stride, causal=causal, summary=summary, block_size=block)
    g = torch.Generator().manual_seed(1)
    qkv = [torch.randn(1, 2, n, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    w = torch.randn(1, 2, n, 4, generator=g, dtype=torch.float64)
    ours = p.block_mask(n).attend(*qkv, kernel=dense_kernel)
    ref = reference(*qkv, p.dense(n))
    bound = dict(depth=3, k=max(4, n))
    assert_close_to_reference(ours, ref, **bound, name="output")
    for a, b, name in zip(torch.autograd.grad((ours * w).sum(), qkv), torch.autograd.grad((ref * w).sum(), qkv), "qkv"):
        assert_close_to_reference(a, b, depth=4, k=max(4, n), name=f"d{name}")


def tiles_of(part, block: int) -> int:
    """Brute force: tiles of ``part``'s mask holding at least one allowed pair."""
    m = part.dense()
    rows, cols = -(-part.q_len // block) * block, -(-part.kv_len // block) * block
    m = torch.nn.functional.pad(m, (0, cols - part.kv_len, 0, rows - part.q_len))
    return int(m.view(rows // block, block, cols // block, block).any(3).any(1).sum())


@needs_flex
def test_block_masks_are_sparse():
    b = 16
    for p, n in [(SparsePattern("strided", 16, block_size=b), 256), (SparsePattern("fixed", 16, summary=2, block_size=b), 256),
                 (SparsePattern("strided", 12, block_size=b), 300), (SparsePattern("fixed", 20, summary=3, block_size=b), 300),
                 (SparsePattern("strided", 16, causal=False, block_size=b), 256)]:
        layout = p.block_mask(n)
        for part in layout.parts:
            assert part.nonempty_blocks() == tiles_of(part, b), (p, part.name)
        assert layout.nonempty_blocks() < layout.causal_blocks() / 2, p
    t = 256 // b
    # Analytically, with stride = tile size and n = stride^2: strided computes a band of
    # 2t - 1 tiles plus one tile per column; fixed, per query tile q, its own tile and the
    # ceil(q c / b) tiles of the summary keys of the tiles before it.
    assert SparsePattern("strided", b, block_size=b).block_mask(256).nonempty_blocks() == 2 * t - 1 + b
    assert SparsePattern("fixed", b, summary=2, block_size=b).block_mask(256).nonempty_blocks() == sum(
        1 + -(-q * 2 // b) for q in range(t))
    assert SparsePattern("strided", b, block_size=b).block_mask(256).causal_blocks() == t * (t + 1) // 2


@needs_flex
@pytest.mark.parametrize("case", [CASES[0], CASES[2]], ids=["strided", "fixed"])
def test_multihead_attention_takes_a_pattern(case):
    kind, stride, summary, causal, n, block = case  # the shapes of the kernel test: its traces are reused
    torch.manual_seed(0)
    p = SparsePattern(kind, stride, causal=causal, summary=summary, block_size=block)
    mha = MultiHeadAttention(24, 3).double().eval()
    x = torch.randn(2, n, 24, dtype=torch.float64)
    with torch.no_grad():  # FlexAttention itself (no gradient wanted)
        ours, weights = mha(x, mask=p)
        dense, _ = mha(x, mask=p.dense(n))
    assert weights is None
    assert_paths_agree(ours, dense, depth=4, k=n, name="MultiHeadAttention, float64")
    # Training on CPU (the dense fallback, FlexAttention having no CPU backward): the same
    # outputs and gradients as the boolean mask, through a whole encoder layer.
    layer = TransformerEncoderLayer(24, 3, 32, dropout=0.0, attention_dropout=0.0, norm_first=True).double().train()
    x.requires_grad_(True)
    out_p, _ = layer(x, mask=p)
    g_p = torch.autograd.grad(out_p.square().sum(), [x] + list(layer.parameters()))
    out_d, _ = layer(x, mask=p.dense(n))
    g_d = torch.autograd.grad(out_d.square().sum(), [x] + list(layer.parameters()))
    assert_paths_agree(out_p, out_d, depth=5, k=n, name="encoder layer")
    for a, b in zip(g_p, g_d):
        assert_paths_agree(a, b, depth=8, k=2 * n, name="gradient")


@needs_flex
def test_unsupported_uses_are_refused():
    p = SparsePattern("fixed", 4, block_size=8)
    mha = MultiHeadAttention(8, 2, dropout=0.1)
    x = torch.randn(1, 5, 8)
    with pytest.raises(ValueError, match="need_weights"):
        mha.eval()(x, mask=p, need_weights=True)
    with pytest.raises(ValueError, match="attention dropout"):
        mha.train()(x, mask=p)
    with pytest.raises(ValueError, match="self-attention"):
        mha.eval()(x, torch.randn(1, 6, 8), mask=p)
    with pytest.raises(UserError, match="one length"):
        p.attend(torch.randn(1, 1, 5, 4), torch.randn(1, 1, 6, 4), torch.randn(1, 1, 6, 4))


def test_old_torch_gets_a_clear_error(monkeypatch):
    # torch 2.4: the module is missing, and nothing has been loaded from it.
    monkeypatch.setattr(sa, "flex_attention", None)
    monkeypatch.setattr(sa.importlib.util, "find_spec", lambda name, *a: None if "flex_attention" in name else importlib.util.find_spec(name))
    with pytest.raises(UserError, match=r"torch 2\.5"):
        SparsePattern("strided", 4).attend(*(torch.randn(1, 1, 5, 4) for _ in range(3)))
