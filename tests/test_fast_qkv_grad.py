"""ctxkit.fast.qkv_kernels / qkv_grad: the q/k/v gradients packed, the bias gradient summed, in one pass.

The kernel's packed output must be the concatenation exactly (it only moves numbers), and
its column sums must match float64 sums within float32 rounding of a sum of that length.
The swapped attention module is checked against a float64 module, forward and gradients,
and under autocast + torch.compile against its own eager run. On a Hopper GPU the kernel
runs in bf16; on the CPU through Triton's interpreter (the suite turns it on without a GPU;
the swapped module takes the kernel only in tests that ask, the ``triton_interpreter``
fixture) in fp16. Without triton, and for every call the kernel does not serve, the
swapped module must be the fused layer exactly.
"""

import copy
import importlib.util
import os

import pytest
import torch

from ctxkit.fast import FusedQKVAttention, apply, fuse_qkv
from ctxkit.fast.qkv_grad import PackedGradQKVAttention, pack_qkv_grad, unpack_qkv_grad
from ctxkit.layers.attention import MultiHeadAttention
from tolerance import assert_close_to_reference, magnitude

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton not installed (the gpu extra)")


def _targets():
    """(device, dtype) pairs where the kernel runs here."""
    out = []
    if os.environ.get("TRITON_INTERPRET") == "1":
        out.append(("cpu", torch.float16))
    if torch.cuda.is_available():
        out.append(("cuda", torch.bfloat16))
    return out


TARGETS = _targets() if HAS_TRITON else []
ids = lambda t: f"{t[0]}-{t[1]}".replace("torch.", "")  # noqa: E731


@needs_triton
@pytest.mark.parametrize("target", TARGETS, ids=ids)
def test_pack_is_the_concatenation_and_sums_match_float64(target):
    from ctxkit.fast import qkv_kernels

    device, dtype = target
    batch, heads, seq, head_dim = 3, 2, 50, 16  # 150 tokens: a ragged last tile of 128
    g = torch.Generator().manual_seed(0)

    def grad(layout):
        t = torch.randn(batch, seq, heads, head_dim, generator=g) * 3
        if layout == "bshd":  # (batch, heads, seq, head_dim) as a transposed view, as cuDNN may return
            return t.to(device, dtype).transpose(1, 2)
        if layout == "bhsd":
            return t.transpose(1, 2).contiguous().to(device, dtype)
        wide = torch.zeros(batch, heads, seq, 2 * head_dim)  # a strided slice
        wide[..., :head_dim] = t.transpose(1, 2)
        return wide.to(device, dtype)[..., :head_dim]

    dq, dk, dv = grad("bshd"), grad("bhsd"), grad("slice")
    packed, sums = qkv_kernels.pack_qkv_grad(dq, dk, dv)
    want = torch.cat([t.transpose(1, 2).reshape(batch * seq, heads * head_dim) for t in (dq, dk, dv)], dim=1)
    assert packed.shape == (batch * seq, 3 * heads * head_dim) and packed.is_contiguous() and packed.dtype == dtype
    assert torch.equal(packed.cpu(), want.cpu())
    want64 = want.double().sum(0)
    assert sums.dtype == torch.float32
    # A float32 sum of 150 half values (exact in float32): float32 rounding of the partial sums.
    assert_close_to_reference(sums.cpu(), want64.cpu(), dtype=torch.float32, scale=want.double().abs().sum(0).cpu(),
                              k=batch * seq, name="column sums")
    with pytest.raises(ValueError, match="share one 4-D shape"):
        qkv_kernels.pack_qkv_grad(dq, dk[:, :, :10], dv)
    with pytest.raises(ValueError, match="power of two"):
        qkv_kernels.pack_qkv_grad(*(torch.zeros(1, 1, 2, 12, device=device, dtype=dtype) for _ in range(3)))


def _attention_case(device, dtype):
    torch.manual_seed(3)
    ref = MultiHeadAttention(32, 4).double()
    for p in ref.parameters():  # half-representable weights: every module starts from the same numbers
        p.data = p.data.to(dtype).double()
    fast = copy.deepcopy(ref).to(device, dtype)
    assert pack_qkv_grad(fast) == 1 and type(fast) is PackedGradQKVAttention
    x = torch.randn(2, 70, 32).to(dtype).double()
    gy = torch.randn(2, 70, 32).to(dtype).double()
    return ref, fast, x, gy


@needs_triton
@pytest.mark.usefixtures("triton_interpreter")
@pytest.mark.parametrize("target", TARGETS, ids=ids)
def test_packed_attention_matches_float64_forward_and_gradients(target):
    device, dtype = target
    ref, fast, x, gy = _attention_case(device, dtype)
    x64 = x.clone().requires_grad_()
    out_grads = {}
    for role in "qkv":  # each projection's output gradient: what its bias gradient sums
        getattr(ref, f"{role}_proj").register_full_backward_hook(
            lambda m, gin, gout, role=role: out_grads.__setitem__(role, gout[0]))
    y64 = ref(x64, x64, x64)[0]
    y64.backward(gy)
    xi = x.to(device, dtype).requires_grad_()
    y = fast(xi, xi, xi)[0]
    y.backward(gy.to(device, dtype))
    k = (32, 70, 32)  # the projection, the attention's sums, the output projection
    assert_close_to_reference(y.detach().cpu(), y64.detach(), dtype=dtype, k=k, name="attention output")
    assert_close_to_reference(xi.grad.cpu(), x64.grad, dtype=dtype, k=k + (96,), name="input gradient")
    for (name, p64), p in zip(ref.named_parameters(), fast.parameters()):
        # Weight and bias gradients sum over 140 tokens of gradients that went through the
        # attention. The key bias's gradient is zero (softmax ignores a shift shared by all
        # keys): its error is set by the summed terms, sum |dk| over the tokens.
        scale = magnitude(p64.grad)
        if name[0] in "qkv" and name.endswith("bias"):
            scale = out_grads[name[0]].abs().sum((0, 1))
        assert_close_to_reference(p.grad.cpu(), p64.grad, dtype=dtype, k=k + (140,), scale=scale, name=name)


@needs_triton
@pytest.mark.usefixtures("triton_interpreter")
@pytest.mark.parametrize("target", TARGETS, ids=ids)
def test_packed_attention_under_autocast_and_compile(target):
    device, dtype = target
    torch.manual_seed(4)
    fast = MultiHeadAttention(32, 4).to(device)  # float32 parameters, half compute under autocast
    plain = copy.deepcopy(fast)
    fuse_qkv(plain)
    pack_qkv_grad(fast)
    x = torch.randn(2, 40, 32, device=device)
    results = []
    for module in (plain, fast):
        with torch.autocast(device, dtype):
            out = module(x, x, x)[0]
            assert out.dtype == dtype
            out.float().square().sum().backward()
        results.append((out.detach(), [p.grad.clone() for p in module.parameters()]))
    assert torch.equal(results[0][0], results[1][0])  # the same products in the forward
    names = [n for n, _ in fast.named_parameters()]
    # The q/k/v bias gradients: float32 sums over 80 tokens in another order, rounded to half
    # once. The key bias's is zero up to rounding (softmax ignores a shift shared by all keys),
    # so the scale is that of the sums that do not cancel, the query and value biases'.
    bias_scale = max(magnitude(g) for n, g in zip(names, results[0][1]) if n in ("q_proj.bias", "v_proj.bias"))
    for name_p, a, b in zip(names, results[0][1], results[1][1]):
        assert b.dtype == torch.float32
        if name_p.endswith("bias") and name_p[0] in "qkv":
            assert_close_to_reference(b.cpu(), a.cpu(), dtype=dtype, k=80, scale=bias_scale, name=name_p)
        else:
            assert torch.equal(a, b), name_p
    eager_grads = results[1][1]
    fast.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    # No graph break around the kernel; on the CPU Dynamo and AOTAutograd only (the tracing
    # is the point; Inductor's C++ build would add seconds).
    compiled = torch.compile(fast, fullgraph=True, backend="inductor" if device == "cuda" else "aot_eager")
    with torch.autocast(device, dtype):
        again = compiled(x, x, x)[0]
        again.float().square().sum().backward()
    assert_close_to_reference(again.float().cpu(), results[1][0].float().cpu(), dtype=dtype,
                              scale=magnitude(results[1][0].float(), per_element=True), name="compiled output")
    for name_p, a, p in zip(names, eager_grads, fast.parameters()):
        scale = bias_scale if name_p.endswith("bias") and name_p[0] in "qkv" else magnitude(a)
        assert_close_to_reference(p.grad.cpu(), a.cpu(), dtype=dtype, k=(32, 40, 32, 80), scale=scale,
                                  name=f"compiled gradient of {name_p}")


def test_packed_attention_falls_back_to_the_fused_layer_exactly():
    """float32 inputs (the kernel serves half precision), cross-attention, and CPU without the
    interpreter or without triton: the fused layer's computation, bit for bit."""
    torch.manual_seed(5)
    plain = MultiHeadAttention(16, 2)
    fused = copy.deepcopy(plain)
    fuse_qkv(fused)
    fast = copy.deepcopy(plain)
    assert pack_qkv_grad(fast) == 1 and pack_qkv_grad(fast) == 1  # idempotent
    x = torch.randn(2, 5, 16, requires_grad=True)
    mem = torch.randn(2, 7, 16)
    for args in ((x, x, x), (x, mem, mem)):
        y_fused, y_fast = fused(*args)[0], fast(*args)[0]
        assert torch.equal(y_fused, y_fast)
        gf = torch.autograd.grad(y_fused.sum(), [x, *fused.parameters()])
        gp = torch.autograd.grad(y_fast.sum(), [x, *fast.parameters()])
        assert all(torch.equal(a, b) for a, b in zip(gf, gp))
    assert fast.state_dict().keys() == plain.state_dict().keys()
    assert unpack_qkv_grad(fast) == 1 and type(fast) is FusedQKVAttention


def test_pack_qkv_grad_swaps_only_plain_and_fused_attention():
    class Relative(MultiHeadAttention):  # a subclass projects its own way: left alone
        pass

    model = torch.nn.ModuleDict({"plain": MultiHeadAttention(16, 2), "fused": MultiHeadAttention(16, 2),
                                 "relative": Relative(16, 2)})
    fuse_qkv(model["fused"])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert pack_qkv_grad(model) == 2
    assert type(model["plain"]) is PackedGradQKVAttention and type(model["fused"]) is PackedGradQKVAttention
    assert type(model["relative"]) is Relative
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    fresh = torch.nn.Sequential(MultiHeadAttention(16, 2))
    assert apply(fresh, "qkvpack") is fresh and type(fresh[0]) is PackedGradQKVAttention
