"""ctxkit.fast.decode_kernels / decode_layer: the five-kernel decoding step of a pre-norm layer.

Each kernel is checked against a float64 computation of the same formula, with bounds
derived from the dtype and the magnitudes (tests/tolerance.py): on the CPU through
Triton's interpreter (triton comes with the test extra; for users the ``gpu`` extra), on a
GPU compiled. Without Triton, and for every call the kernels do not serve, the swapped
layer must be the plain layer exactly.
"""

import copy
import math
import os

import pytest
import torch
import torch.nn.functional as F

from ctxkit.fast import FusedDecodeLayer, decode_kernels_available, fuse_decode_layers, why_not_fused
from ctxkit.fast._swap import swap
from ctxkit.layers import KVCache, TransformerEncoderLayer, padding_mask
from ctxkit.layers.ffn import ACTIVATIONS
from tolerance import assert_close_to_reference, assert_same_function, tol

needs_triton = pytest.mark.skipif(not decode_kernels_available(), reason="triton not installed (the gpu extra)")
# CPU tensors go through Triton's interpreter (tests/conftest.py turns it on without a GPU).
DEVICES = (["cpu"] if os.environ.get("TRITON_INTERPRET") == "1" else []) + (["cuda"] if torch.cuda.is_available() else [])


def _kernels():
    from ctxkit.fast import decode_kernels

    return decode_kernels


@needs_triton
def test_layer_and_kernels_agree_on_the_activations():
    from ctxkit.fast.decode_layer import FUSED_ACTIVATIONS

    assert set(FUSED_ACTIVATIONS) == set(_kernels().ACTIVATION_CODES) - {None}
    assert set(FUSED_ACTIVATIONS) <= set(ACTIVATIONS)


def _ln64(x, w, b, eps_):
    x = x.double()
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps_) * w.double() + b.double()


# Activation and a bound on its slope (|f'| <= 1.13 for both GELUs, 1 for ReLU): input
# errors pass through it scaled by at most that.
_ACTS = {None: (lambda t: t, 1.0), "gelu_new": (ACTIVATIONS["gelu_new"], 1.13), "gelu": (F.gelu, 1.13),
         "relu": (F.relu, 1.0)}


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("features", [(100, 72), (40, 600)])
@pytest.mark.parametrize("ln,activation,residual", [(False, None, True), (True, "gelu_new", False), (True, "gelu", False),
                                                    (False, "relu", True), (True, None, False)])
def test_row_linear_matches_float64(device, dtype, features, ln, activation, residual):
    n, k = features
    g = torch.Generator().manual_seed(n + k)
    x = (torch.randn(2, k, generator=g) * 3 + 1).to(dtype)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(dtype)
    b = torch.randn(n, generator=g).to(dtype)
    norm = (torch.rand(k, generator=g) + 0.5, torch.randn(k, generator=g) * 0.1, 1e-5)
    res = torch.randn(2, n, generator=g).to(dtype)
    on = [t.to(device) for t in (x, w, b, res)]
    got = _kernels().row_linear(on[0], on[1], on[2], ln=tuple(t.to(device, dtype) for t in norm[:2]) + (norm[2],) if ln else None,
                                activation=activation, residual=on[3] if residual else None)
    # The reference: what the kernel reads (the LayerNorm output rounded to dtype, as
    # nn.LayerNorm returns it), then the float64 formula.
    inp = _ln64(x, norm[0].to(dtype), norm[1].to(dtype), norm[2]).to(dtype).double() if ln else x.double()
    act, slope = _ACTS[activation]
    pre = inp @ w.double().T + b.double()
    reference = act(pre) + (res.double() if residual else 0)
    # Float32 sums of k products, through the activation's slope, plus one rounding of the
    # result to dtype; in bf16 a LayerNorm output may round the other way (one bf16 unit of
    # an input element, times |w|).
    terms = inp.abs() @ w.double().abs().T + b.double().abs()
    bound = slope * tol(torch.float32, terms, k=k) + tol(dtype, reference.abs() + 1e-30)
    if ln and dtype == torch.bfloat16:
        bound = bound + slope * tol(torch.bfloat16, terms)
    diff = (got.cpu().double() - reference).abs()
    assert got.dtype == dtype and got.shape == (2, n)
    assert (diff <= bound).all(), f"worst error / bound {float((diff / bound).max()):.3g}"


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
def test_row_linear_writes_q_out_and_k_v_into_the_cache(device):
    rows, heads, head_dim, slots, k = 2, 3, 16, 10, 40
    hidden = heads * head_dim
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(rows, k, generator=g), torch.randn(3 * hidden, k, generator=g) / k**0.5, torch.randn(3 * hidden, generator=g)
    kv = torch.zeros(2, rows, heads, slots, head_dim)
    kv_dev, where = kv.to(device), torch.tensor([6], device=device)
    q = _kernels().row_linear(x.to(device), w.to(device), b.to(device), kv=kv_dev, write_index=where, num_heads=heads)
    full = x.double() @ w.double().T + b.double()  # (rows, 3 hidden)
    scale = x.double().abs() @ w.double().abs().T + b.double().abs()
    assert q.shape == (rows, hidden)
    assert_close_to_reference(q.cpu(), full[:, :hidden], scale=scale[:, :hidden], k=k, name="q")
    kv_got = kv_dev.cpu()
    for part in (0, 1):
        want = full[:, (part + 1) * hidden:(part + 2) * hidden].reshape(rows, heads, head_dim)
        assert_close_to_reference(kv_got[part, :, :, 6], want, scale=scale[:, (part + 1) * hidden:(part + 2) * hidden]
                                  .reshape(rows, heads, head_dim), k=k, name=("k", "v")[part])
    untouched = torch.ones(slots, dtype=torch.bool)
    untouched[6] = False
    assert torch.equal(kv_got[:, :, :, untouched], torch.zeros_like(kv_got[:, :, :, untouched]))


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_s", [4, 64])
def test_decode_attention_matches_float64(device, dtype, block_s):
    """Block 4: 10 splits combined, the first split of row 1 wholly masked (left padding),
    splits past the write index empty; slots after it hold NaN that must not be read."""
    rows, heads, head_dim, slots, where = 2, 3, 16, 40, 29
    g = torch.Generator().manual_seed(1)
    kv = torch.randn(2, rows, heads, slots, head_dim, generator=g).to(dtype)
    kv[:, :, :, where + 1:] = float("nan")  # unfilled slots: never read
    q = torch.randn(rows, heads * head_dim, generator=g).to(dtype)
    mask = torch.zeros(rows, slots, dtype=torch.bool)
    mask[:, : where + 1] = True
    mask[1, :5] = False
    counters = torch.zeros(rows * heads, dtype=torch.int32, device=device)
    call = lambda: _kernels().decode_attention(q.to(device), kv.to(device), mask.to(device),  # noqa: E731
                                               torch.tensor([where], device=device), 1 / math.sqrt(head_dim),
                                               block_s=block_s, counters=counters)
    got = call()
    # The last program of each head combined and reset its counter: a second call (a CUDA
    # graph replay) starts from zero again and gives the same result.
    assert torch.equal(counters.cpu(), torch.zeros(rows * heads, dtype=torch.int32))
    assert torch.equal(call(), got)
    qd = q.double().view(rows, heads, 1, head_dim)
    kd, vd = kv[0, :, :, : where + 1].double(), kv[1, :, :, : where + 1].double()
    scores = (qd @ kd.transpose(-1, -2)) / math.sqrt(head_dim)
    weights = scores.masked_fill(~mask[:, None, None, : where + 1], float("-inf")).softmax(-1)
    reference = (weights @ vd).reshape(rows, heads * head_dim)
    # Float32 scores (16 terms), exp and sums over 30 keys, one rounding of the output.
    scale = (weights @ vd.abs()).reshape(rows, -1) + 1e-3
    bound = tol(torch.float32, scale, k=30, depth=3) + tol(dtype, reference.abs())
    diff = (got.cpu().double() - reference).abs()
    assert got.dtype == dtype and not torch.isnan(got).any()
    assert (diff <= bound).all(), f"worst error / bound {float((diff / bound).max()):.3g}"


def _layer(activation="gelu_new", dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    layer = TransformerEncoderLayer(64, 4, 128, dropout=0.1, attention_dropout=0.1, activation=activation, norm_first=True).eval()
    with torch.no_grad():
        for p in layer.parameters():  # biases and norm affines away from 0/1, so a missing one shows
            p.add_(torch.randn_like(p) * 0.1)
    return layer.to(dtype)


def _prefilled(layer, batch, slots, prompt, dtype, device, seed=2):
    """A static cache after ``prompt`` positions (left padding in row 1), plus the inputs of one step."""
    g = torch.Generator().manual_seed(seed)
    cache = KVCache(1, batch, 4, 16, slots, dtype=dtype, device=device)
    attention = torch.ones(batch, prompt, dtype=torch.long)
    if batch > 1:
        attention[1, :3] = 0
    with torch.no_grad():
        layer.to(device)(torch.randn(batch, prompt, 64, generator=g).to(device, dtype), mask=padding_mask(attention.to(device)),
                         cache=cache.layer(0))
    cache.advance(prompt)
    key_mask = torch.zeros(batch, slots, dtype=torch.long)
    key_mask[:, : prompt + 1] = 1
    key_mask[:, :prompt] = attention
    x = torch.randn(batch, 1, 64, generator=g).to(device, dtype)
    return cache, padding_mask(key_mask.to(device)), x


def _step(layer, cache, mask, x, where):
    index = torch.tensor([where], device=x.device)
    cache.set_static(index)
    with torch.no_grad():
        out, _ = layer(x, mask=mask, cache=cache.layer(0))
    cache.set_static(None)
    return out


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,activation", [(torch.float32, "gelu_new"), (torch.float32, "gelu"), (torch.bfloat16, "gelu_new")])
def test_fused_layer_step_is_the_layer(device, dtype, activation):
    """The fused step against the plain layer, both against the layer in float64; the new
    keys and values land in the same cache slot."""
    plain = _layer(activation, dtype).to(device)
    fused = copy.deepcopy(plain)
    assert fuse_decode_layers(fused, interpret_on_cpu=True) == 1 and type(fused) is FusedDecodeLayer
    fused.max_rows = 2
    reference = _layer(activation, torch.float64).to(device)
    reference.load_state_dict({k: v.double() for k, v in plain.state_dict().items()})
    cache_f, mask, x = _prefilled(fused, 2, 16, 7, dtype, device)
    cache_p, _, _ = _prefilled(plain, 2, 16, 7, dtype, device)  # the same prompt pass (same code): the same cache
    cache_r = KVCache(1, 2, 4, 16, 16, dtype=torch.float64, device=device)
    cache_r.kv[0].copy_(cache_p.kv[0].double())  # float64 reads what the others read
    caches = (cache_f, cache_p, cache_r)
    outs = [_step(fused, cache_f, mask, x, 7), _step(plain, cache_p, mask, x, 7), _step(reference, cache_r, mask, x.double(), 7)]
    ours, theirs, ref = (o.cpu() for o in outs)
    # Two LayerNorms and four products of up to 128 terms, chained: depth 4 with the longest k.
    assert_same_function(ours, theirs, ref, dtype=dtype, k=128, depth=4, name="layer output",
                         labels=("fused decode step", "TransformerEncoderLayer"))
    for part, name in ((0, "key"), (1, "value")):
        assert_same_function(caches[0].kv[0][part, :, :, 7].cpu(), caches[1].kv[0][part, :, :, 7].cpu(),
                             caches[2].kv[0][part, :, :, 7].cpu(), dtype=dtype, k=64, depth=2, name=f"cached {name}")


def test_fallback_is_the_plain_layer_exactly():
    """Without the interpreter flag a CPU step (and any prompt pass) runs the parent's code:
    bit-identical, whether or not triton is installed."""
    plain = _layer()
    fused = copy.deepcopy(plain)
    swap(fused, FusedDecodeLayer)
    for model in (plain, fused):
        cache, mask, x = _prefilled(model, 2, 16, 7, torch.float32, "cpu")
        model._out = _step(model, cache, mask, x, 7)
        model._kv = cache.kv[0].clone()
    assert torch.equal(plain._out, fused._out) and torch.equal(plain._kv, fused._kv)


def test_swap_keeps_parameters_and_refuses_what_it_cannot_fuse():
    layer = _layer()
    state = {k: v.clone() for k, v in layer.state_dict().items()}
    params = [id(p) for p in layer.parameters()]
    expected = 1 if decode_kernels_available() else 0
    assert fuse_decode_layers(layer) == expected and fuse_decode_layers(layer) == expected  # idempotent
    assert [id(p) for p in layer.parameters()] == params
    assert layer.state_dict().keys() == state.keys() and all(torch.equal(state[k], v) for k, v in layer.state_dict().items())
    post_norm = TransformerEncoderLayer(64, 4, 128, norm_first=False)
    assert "post-norm" in why_not_fused(post_norm)
    odd_heads = TransformerEncoderLayer(60, 5, 128, norm_first=True)
    assert "power of two" in why_not_fused(odd_heads)
    assert fuse_decode_layers(torch.nn.Sequential(post_norm, odd_heads)) == 0
    assert type(post_norm) is TransformerEncoderLayer


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" or not decode_kernels_available(),
                    reason="Triton's interpreter (CPU) with triton installed")
@pytest.mark.usefixtures("triton_interpreter")
def test_greedy_decoding_with_fused_layers_is_the_plain_loop():
    """End to end on the CPU through the interpreter: a GPT-2 decoding over the static
    cache with every layer fused gives the eager loop's greedy tokens."""
    from ctxkit.decoding import GenerationConfig, generate, left_pad
    from ctxkit.decoding.static_decode import static_generate
    from ctxkit.models.gpt2.model import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(num_layers=2, hidden_size=64, num_heads=4, vocab_size=97, max_position=64,
                                       ffn_size=128)).eval()
    ids, mask = left_pad([[5, 17, 42, 8, 9, 30]])
    cfg = GenerationConfig(max_new_tokens=6)
    plain = generate(model, ids, mask, cfg, static=False)
    assert fuse_decode_layers(model, interpret_on_cpu=True) == 2
    calls = []
    kernels = _kernels()
    original = kernels.decode_attention

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    kernels.decode_attention = counting
    try:
        assert torch.equal(static_generate(model, ids, mask, cfg, capture=False, plan="qkv+decodelayers"), plain)
    finally:
        kernels.decode_attention = original
    assert len(calls) == 2 * (cfg.max_new_tokens - 1)  # every step after the prompt, every layer


def test_static_decoder_fuses_only_when_asked():
    """The default on a CPU is the plain layers (an earlier fusing is undone); the plan's
    decodelayers fuses where the kernels run and is refused, naming why, where they do not."""
    from ctxkit.core.errors import UserError
    from ctxkit.fast import supported
    from ctxkit.decoding import GenerationConfig, left_pad
    from ctxkit.decoding.static_decode import static_generate
    from ctxkit.models.gpt2.model import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(num_layers=2, hidden_size=64, num_heads=4, vocab_size=97, max_position=64,
                                       ffn_size=128)).eval()
    ids, mask = left_pad([[5, 17, 42]])
    fuse_decode_layers(model)
    static_generate(model, ids, mask, GenerationConfig(max_new_tokens=2), capture=False)
    assert not any(isinstance(m, FusedDecodeLayer) for m in model.modules())
    why = supported("decode_layers", "cpu")
    if why is not None:  # no triton, or no interpreter: an explicit ask is refused before any work
        with pytest.raises(UserError, match="decodelayers: " + why.split(" (")[0]):
            static_generate(model, ids, mask, GenerationConfig(max_new_tokens=2), capture=False, plan="qkv+decodelayers")
        return
    static_generate(model, ids, mask, GenerationConfig(max_new_tokens=2), capture=False, plan="qkv+decodelayers")
    assert sum(isinstance(m, FusedDecodeLayer) for m in model.modules()) == 2


@pytest.mark.skipif(not (torch.cuda.is_available() and decode_kernels_available()), reason="compiled Triton kernels need a GPU")
@pytest.mark.parametrize("compile_step", [False, True])
def test_cuda_graph_decoding_with_fused_layers_is_the_plain_loop(compile_step):
    """On a GPU: the captured step (compiled or not) with the Triton layers gives the eager
    loop's greedy tokens, float32 weights (a bf16 near-tie could flip a token either way)."""
    from ctxkit.decoding import GenerationConfig, generate, left_pad
    from ctxkit.decoding.static_decode import static_generate
    from ctxkit.models.gpt2.model import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(num_layers=2, hidden_size=64, num_heads=4, vocab_size=97, max_position=64,
                                       ffn_size=256)).cuda().eval()
    ids, mask = left_pad([[5, 17, 42, 8, 9, 30]])
    ids, mask = ids.cuda(), mask.cuda()
    cfg = GenerationConfig(max_new_tokens=24)
    plain = generate(model, ids, mask, cfg, static=False)
    assert torch.equal(static_generate(model, ids, mask, cfg, plan="graphs+qkv+decodelayers" + ("+compile" if compile_step else "")), plain)
    assert sum(type(m) is FusedDecodeLayer for m in model.modules()) == 2
