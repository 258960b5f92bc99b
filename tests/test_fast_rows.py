"""ctxkit.fast.rows: one-row linears as fused reductions inside compiled graphs.

Eagerly (and for more than one row) the swapped modules are exactly ``F.linear``; inside a
compiled graph a single row is multiplied and summed in float32, which must be the same
function as the GEMM (bounded against float64). The swap keeps parameters and state_dict.
"""

import pytest
import torch
import torch.nn.functional as F

from ctxkit.fast import (FusedQKVAttention, OneRowFusedQKVAttention, OneRowLinear, fuse_qkv, one_row_linear,
                         one_row_linears)
from ctxkit.layers.attention import MultiHeadAttention
from tolerance import assert_close_to_reference, magnitude, tol


def _inputs(rows, features=48, out=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*rows, features, generator=g), torch.randn(out, features, generator=g) / features**0.5,
            torch.randn(out, generator=g))


def test_eager_calls_are_exactly_f_linear():
    for rows in ((1, 1), (3, 5)):
        x, w, b = _inputs(rows)
        assert torch.equal(one_row_linear(x, w, b), F.linear(x, w, b))
        assert torch.equal(one_row_linear(x, w), F.linear(x, w))


@pytest.mark.parametrize("rows", [(1, 1), (1,), (2, 3)])
def test_compiled_product_is_the_same_function(rows):
    """aot_eager traces the reduction branch (is_compiling() is True) without code generation."""
    x, w, b = _inputs(rows)
    torch._dynamo.reset()
    got = torch.compile(one_row_linear, backend="aot_eager", fullgraph=True)(x, w, b)
    reference = F.linear(x.double(), w.double(), b.double())
    assert got.shape == reference.shape and got.dtype == torch.float32
    # Per element the sum of |terms| is the scale the rounding happened at (float32 sums of 48 terms).
    scale = magnitude(x.double().abs() @ w.double().abs().T + b.double().abs(), per_element=True)
    assert_close_to_reference(got, reference, scale=scale, k=48, name="one-row product")


def test_compiled_gradients_are_the_linear_gradients():
    """The reduction branch is differentiable: input, weight and bias gradients as F.linear's."""
    x, w, b = (t.double().requires_grad_() for t in _inputs((1, 1)))
    grad_out = torch.randn(1, 1, 40, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    torch._dynamo.reset()
    torch.compile(one_row_linear, backend="aot_eager", fullgraph=True)(x, w, b).backward(grad_out)
    got = [t.grad.clone() for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    F.linear(x, w, b).backward(grad_out)
    # Scales: the sum of |terms| per element (the input gradient sums 40 products; the weight
    # gradient is one product per element; the bias gradient is the output gradient itself).
    scales = (grad_out.abs() @ w.detach().abs(), grad_out.abs()[0].T @ x.detach().abs()[0], grad_out.abs()[0, 0])
    for g, scale, (name, t) in zip(got, scales, (("input", x), ("weight", w), ("bias", b))):
        assert_close_to_reference(g, t.grad, scale=scale, k=40, name=f"{name} gradient")


def test_bf16_row_sums_in_float32():
    x, w, b = (t.to(torch.bfloat16) for t in _inputs((1, 1), features=256))
    torch._dynamo.reset()
    got = torch.compile(one_row_linear, backend="aot_eager", fullgraph=True)(x, w, b)
    reference = F.linear(x.double(), w.double(), b.double())
    assert got.dtype == torch.bfloat16
    # The float32 products and sum (bounded by the sum of |terms|), then one bf16 rounding of the result.
    terms = x.double().abs() @ w.double().abs().T + b.double().abs()
    bound = tol(torch.float32, terms, k=256) + tol(torch.bfloat16, reference.abs())
    diff = (got.double() - reference).abs()
    assert (diff <= bound).all(), f"worst error / bound {float((diff / bound).max()):.3g}"


def test_swap_keeps_parameters_and_is_idempotent():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))
    attn = MultiHeadAttention(16, 4)
    model.append(attn)
    fuse_qkv(model)
    x = torch.randn(2, 5, 16)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    params = [id(p) for p in model.parameters()]
    with torch.no_grad():
        before = attn(model[:3](x))[0]
    count = one_row_linears(model)
    # 2 plain Linears + the fused attention (its own q/k/v/out Linears are swapped too)
    assert count == 2 + 1 + 4
    assert type(model[0]) is OneRowLinear and type(attn) is OneRowFusedQKVAttention
    assert isinstance(attn, FusedQKVAttention) and isinstance(attn, MultiHeadAttention)
    assert one_row_linears(model) == count  # idempotent
    assert [id(p) for p in model.parameters()] == params
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items()) and state.keys() == model.state_dict().keys()
    with torch.no_grad():
        assert torch.equal(attn(model[:3](x))[0], before)  # eagerly the very same computation


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled CUDA-graph decoding needs a GPU")
def test_batch_one_compiled_decoding_equals_the_plain_loop():
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
    assert torch.equal(static_generate(model, ids, mask, cfg, plan="graphs+compile+qkv+rows"), plain)
    assert any(type(m) is OneRowLinear for m in model.modules())
