"""ctxkit.fast.gemm_kernels / gelu_gemm: the exact GELU (and its derivative) in GEMM epilogues.

The kernel is checked against float64 computations of each epilogue's formula from the
same half-precision inputs, and the swapped feed-forward block against the plain block and a
float64 block, forward and gradients, with bounds from the dtype and magnitudes
(tests/tolerance.py). On a Hopper GPU the kernels run compiled in bf16; on the CPU through
Triton's interpreter (the suite turns it on without a GPU; the swapped block takes the
kernels only in tests that ask, the ``triton_interpreter`` fixture) in fp16, which the
interpreter represents exactly (its bf16 tensor-descriptor loads are broken). These need
triton (the test extra brings it; for users the ``gpu`` extra); without it, and for every
call the kernels do not serve, the swapped block must be the plain block exactly.
"""

import copy
import os

import pytest
import torch
import torch.nn.functional as F

from ctxkit.fast import GemmGeluFFN, apply, fuse_gelu_gemm, gelu_gemm_available, unfuse_gelu_gemm
from ctxkit.layers.ffn import PositionwiseFFN
from tolerance import assert_close_to_reference, assert_same_function, magnitude

needs_triton = pytest.mark.skipif(not gelu_gemm_available(), reason="triton not installed (the gpu extra)")


def _targets():
    """(device, dtype) pairs where the kernels run here."""
    out = []
    if os.environ.get("TRITON_INTERPRET") == "1":
        out.append(("cpu", torch.float16))
    if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9:
        out.append(("cuda", torch.bfloat16))
    return out


TARGETS = _targets() if gelu_gemm_available() else []


def _kernels():
    from ctxkit.fast import gemm_kernels

    return gemm_kernels


def _small(device):
    """Small tiles in the interpreter (speed); the shipped tiling on a GPU."""
    if device == "cpu":
        return _kernels().GemmConfig(block_m=32, block_n=32, block_k=16, group_m=2, stages=2, warps=4, epi_split=2)
    return None


def _gelu_prime64(p):
    return 0.5 * (1 + torch.erf(p / 2 ** 0.5)) + p * torch.exp(-0.5 * p * p) / (2 * torch.pi) ** 0.5


@needs_triton
@pytest.mark.parametrize("target", TARGETS, ids=lambda t: f"{t[0]}-{t[1]}".replace("torch.", ""))
@pytest.mark.parametrize("m", [200, 64])  # a ragged last row tile, and an exact one
def test_linear_epilogue_matches_float64(target, m):
    device, dtype = target
    K = _kernels()
    g = torch.Generator().manual_seed(m)
    n, k = 96, 48
    x = torch.randn(m, k, generator=g).to(device, dtype)
    w1 = (torch.randn(n, k, generator=g) * 0.3).to(device, dtype)
    b1 = torch.randn(n, generator=g).to(device, dtype)
    w2 = (torch.randn(k, n, generator=g) * 0.3).to(device, dtype)  # a second product's (out, in) weight
    gy = torch.randn(m, k, generator=g).to(device, dtype)
    cfg = _small(device)
    pre64 = x.double() @ w1.double().T + b1.double()

    out, side = K.linear_epilogue(x, w1, b1, epilogue="bias", config=cfg)
    assert side is None and out.dtype == dtype and out.shape == (m, n)
    # One rounding of a float32 sum of k products of half inputs: the half rounding dominates.
    assert_close_to_reference(out.cpu(), pre64.cpu(), dtype=dtype, scale=magnitude(pre64, per_element=True), k=1,
                              name="x @ W.T + b")
    out, pre = K.linear_epilogue(x, w1, b1, epilogue="gelu", store_pre=True, config=cfg)
    assert_close_to_reference(pre.cpu(), pre64.cpu(), dtype=dtype, scale=magnitude(pre64, per_element=True), name="stored pre")
    want = F.gelu(pre64)
    assert_close_to_reference(out.cpu(), want.cpu(), dtype=dtype, scale=magnitude(want, per_element=True), name="gelu")
    assert not torch.equal(out, pre)
    # gelu_grad: (gy @ W2) * gelu'(pre) from the stored (rounded) pre, W2 read as (K, N).
    grad, bias_grad = K.linear_epilogue(gy, w2, epilogue="gelu_grad", pre=pre, weight_kn=True, config=cfg)
    want = (gy.double() @ w2.double()) * _gelu_prime64(pre.double())
    assert_close_to_reference(grad.cpu(), want.cpu(), dtype=dtype, scale=magnitude(want, per_element=True), name="gelu_grad")
    # The bias gradient sums the float32 values before rounding: float32 sums over m rows.
    assert bias_grad.dtype == torch.float32 and bias_grad.shape == (n,)
    assert_close_to_reference(bias_grad.cpu(), want.sum(0).cpu(), dtype=dtype, scale=want.abs().sum(0).cpu(),
                              name="bias gradient")


@needs_triton
@pytest.mark.parametrize("target", TARGETS, ids=lambda t: f"{t[0]}-{t[1]}".replace("torch.", ""))
def test_linear_epilogue_rejects_bad_operands(target):
    device, dtype = target
    K = _kernels()
    x = torch.zeros(8, 48, device=device, dtype=dtype)
    w = torch.zeros(32, 48, device=device, dtype=dtype)
    b = torch.zeros(32, device=device, dtype=dtype)
    with pytest.raises(ValueError, match="do not multiply"):
        K.linear_epilogue(x, w.t().contiguous(), b)
    with pytest.raises(ValueError, match="one dtype"):
        K.linear_epilogue(x.float(), w, b)
    with pytest.raises(ValueError, match="16-byte aligned"):
        K.linear_epilogue(torch.zeros(8, 50, device=device, dtype=dtype)[:, 1:49], w, b)
    with pytest.raises(ValueError, match="bias of shape"):
        K.linear_epilogue(x, w, None, epilogue="gelu")
    with pytest.raises(ValueError, match="pre-activation"):
        K.linear_epilogue(x, w.t().contiguous(), epilogue="gelu_grad", weight_kn=True)
    with pytest.raises(ValueError, match="epilogue must be"):
        K.linear_epilogue(x, w, b, epilogue="relu")


def _fp8_operands(m, n, k, device, seed=0):
    """Row-scaled e4m3 x (m, k) and W (n, k) with their float32 scales, and a bias."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    x[0] *= 50  # a loud row: its scale must not touch the other rows
    w = torch.randn(n, k, generator=g) * 0.05
    xs = (x.abs().amax(1) / 448).float()
    ws = (w.abs().amax(1) / 448).float()
    q = (x / xs[:, None]).to(torch.float8_e4m3fn)
    qw = (w / ws[:, None]).to(torch.float8_e4m3fn)
    b = torch.randn(n, generator=g)
    return [t.to(device) for t in (q, xs, qw, ws, b)]


@needs_triton
@pytest.mark.parametrize("target", TARGETS, ids=lambda t: f"{t[0]}-{t[1]}".replace("torch.", ""))
@pytest.mark.parametrize("epilogue", ["bias", "gelu"])
def test_fp8_linear_epilogue_matches_float64(target, epilogue):
    """float8 operands: acc * x_scale * w_scale + bias (+ GELU) from the exact e4m3 products,
    one rounding to the output dtype (the interpreter's bf16 store: fp16 there)."""
    device, dtype = target
    K = _kernels()
    m, n, k = 200, 96, 256
    q, xs, qw, ws, b = _fp8_operands(m, n, k, device)
    cfg = K.GemmConfig(block_m=64, block_n=64, block_k=128, stages=2, warps=4, epi_split=2) if device == "cpu" else None
    out, side = K.linear_epilogue(q, qw, b.to(dtype), epilogue=epilogue, x_scale=xs, w_scale=ws, out_dtype=dtype, config=cfg)
    assert side is None and out.dtype == dtype and out.shape == (m, n)
    # e4m3 products are exact; float32 sums of k of them, then the scales.
    want = (q.double() @ qw.double().T) * xs.double()[:, None] * ws.double()[None, :] + b.to(dtype).double()
    scale = ((q.double().abs() @ qw.double().abs().T) * xs.double()[:, None] * ws.double()[None, :]
             + b.to(dtype).double().abs()).cpu()
    if epilogue == "gelu":
        want = F.gelu(want)
    # Per-element bounds: the loud first row (50x) must not cost the quiet rows precision.
    assert_close_to_reference(out.cpu(), want.cpu(), dtype=dtype, scale=scale, name=f"fp8 {epilogue}")


@needs_triton
@pytest.mark.parametrize("target", TARGETS, ids=lambda t: f"{t[0]}-{t[1]}".replace("torch.", ""))
def test_fp8_linear_epilogue_rejects_bad_scales(target):
    device, dtype = target
    K = _kernels()
    q, xs, qw, ws, b = _fp8_operands(32, 32, 128, device)
    with pytest.raises(ValueError, match="x_scale"):
        K.linear_epilogue(q, qw, b, epilogue="bias", w_scale=ws)
    with pytest.raises(ValueError, match="w_scale"):
        K.linear_epilogue(q, qw, b, epilogue="bias", x_scale=xs, w_scale=ws[:16].contiguous())
    with pytest.raises(ValueError, match="float8 operands only"):
        K.linear_epilogue(q.to(dtype), qw.to(dtype), b.to(dtype), epilogue="bias", x_scale=xs, w_scale=ws)
    with pytest.raises(ValueError, match="'bias' or 'gelu'"):
        K.linear_epilogue(q, qw, b, epilogue="gelu", store_pre=True, x_scale=xs, w_scale=ws)
    with pytest.raises(ValueError, match="out_dtype"):
        K.linear_epilogue(q, qw, b, epilogue="bias", x_scale=xs, w_scale=ws, out_dtype=torch.float32)


def _ffn_case(device, dtype, seed=0):
    torch.manual_seed(seed)
    plain = PositionwiseFFN(32, 128)
    ref = copy.deepcopy(plain).double()
    plain = plain.to(device, dtype)
    fast = copy.deepcopy(plain)
    assert fuse_gelu_gemm(fast) == 1 and type(fast) is GemmGeluFFN
    x = torch.randn(3, 70, 32, dtype=torch.float64)
    gy = torch.randn(3, 70, 32, dtype=torch.float64)
    return plain, fast, ref, x, gy


def _run(module, x, gy, device, dtype):
    xi = x.to(device, dtype).requires_grad_()
    y = module(xi)
    y.backward(gy.to(device, dtype))
    grads = {n: p.grad.cpu() for n, p in module.named_parameters()}
    return y.detach().cpu(), xi.grad.cpu(), grads


@needs_triton
@pytest.mark.usefixtures("triton_interpreter")
@pytest.mark.parametrize("target", TARGETS, ids=lambda t: f"{t[0]}-{t[1]}".replace("torch.", ""))
def test_gemm_gelu_ffn_is_the_plain_block_forward_and_backward(target):
    device, dtype = target
    plain, fast, ref, x, gy = _ffn_case(device, dtype)
    x64 = x.clone().requires_grad_()
    y64 = ref(x64)
    y64.backward(gy)
    want_grads = {n: p.grad for n, p in ref.named_parameters()}
    theirs, ours = _run(plain, x, gy, device, dtype), _run(fast, x, gy, device, dtype)
    assert not torch.equal(ours[0], theirs[0]) or dtype == torch.float32  # really another computation
    # Two chained products (k = 32 and 128), each output rounded once.
    assert_same_function(ours[0], theirs[0], y64.detach(), dtype=dtype, k=128, depth=2, name="FFN output",
                         labels=("GemmGeluFFN", "PositionwiseFFN"))
    assert_same_function(ours[1], theirs[1], x64.grad, dtype=dtype, k=128, depth=3, name="input gradient",
                         labels=("GemmGeluFFN", "PositionwiseFFN"))
    for name, want in want_grads.items():  # weight gradients sum over 210 positions
        assert_same_function(ours[2][name], theirs[2][name], want, dtype=dtype, k=210, depth=3, name=name,
                             labels=("GemmGeluFFN", "PositionwiseFFN"))
    with torch.no_grad():  # inference: the kernel without the stored pre-activation
        y = fast(x.to(device, dtype)).cpu()
    assert torch.equal(y, ours[0])


@needs_triton
@pytest.mark.usefixtures("triton_interpreter")
@pytest.mark.parametrize("target", TARGETS, ids=lambda t: f"{t[0]}-{t[1]}".replace("torch.", ""))
def test_gemm_gelu_ffn_under_autocast_and_compile(target):
    device, dtype = target
    if device == "cpu" and dtype == torch.float16:
        autocast_dtype = torch.float16
    else:
        autocast_dtype = torch.bfloat16
    torch.manual_seed(1)
    fast = PositionwiseFFN(32, 128).to(device)  # float32 master weights, half compute under autocast
    fuse_gelu_gemm(fast)
    x = torch.randn(2, 40, 32, device=device)
    with torch.autocast(device, autocast_dtype):
        eager = fast(x)
        assert eager.dtype == autocast_dtype
        eager.float().sum().backward()
    grads = [p.grad.clone() for p in fast.parameters()]
    assert all(g.dtype == torch.float32 for g in grads)  # reached the float32 parameters
    fast.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    # No graph break around the kernels; on the CPU Dynamo and AOTAutograd only (what this
    # checks is the tracing: Inductor's C++ build of the graph would add ~10 s here).
    compiled = torch.compile(fast, fullgraph=True, backend="inductor" if device == "cuda" else "aot_eager")
    with torch.autocast(device, autocast_dtype):
        again = compiled(x)
        again.float().sum().backward()
    assert torch.equal(again, eager)
    for a, b in zip(grads, fast.parameters()):
        # Inductor may keep a float32 -> half -> float32 round trip in float32 (the bias
        # gradient's): one half rounding apart at most.
        assert_close_to_reference(b.grad.cpu(), a.cpu(), dtype=autocast_dtype, scale=magnitude(a, per_element=True),
                                  name="compiled gradient")


def test_gemm_gelu_ffn_falls_back_to_the_plain_block_exactly(monkeypatch):
    """float32 (the kernels serve half precision only), and CPU without the interpreter: the
    swapped block is the plain block, bit for bit; without triton nothing is swapped."""
    from ctxkit.fast import gelu_gemm

    torch.manual_seed(2)
    plain = PositionwiseFFN(16, 64)
    fast = copy.deepcopy(plain)
    swapped = fuse_gelu_gemm(fast)
    assert swapped == (1 if gelu_gemm_available() else 0)
    x = torch.randn(2, 5, 16, requires_grad=True)
    y_plain, y_fast = plain(x), fast(x)
    assert torch.equal(y_plain, y_fast)
    gp = torch.autograd.grad(y_plain.sum(), [x, *plain.parameters()])
    gf = torch.autograd.grad(y_fast.sum(), [x, *fast.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(gp, gf))
    assert fast.state_dict().keys() == plain.state_dict().keys()
    assert unfuse_gelu_gemm(fast) == swapped and type(fast) is PositionwiseFFN
    monkeypatch.setattr(gelu_gemm, "gelu_gemm_available", lambda: False)
    assert gelu_gemm.fuse_gelu_gemm(copy.deepcopy(plain)) == 0


def test_fuse_gelu_gemm_takes_only_erf_gelu_blocks_with_plain_linears():
    if not gelu_gemm_available():
        pytest.skip("triton not installed (the gpu extra)")
    model = torch.nn.ModuleDict({"erf": PositionwiseFFN(16, 64, activation="gelu"),
                                 "tanh": PositionwiseFFN(16, 64, activation="gelu_new"),
                                 "relu": PositionwiseFFN(16, 64, activation="relu"),
                                 "odd": PositionwiseFFN(15, 60)})  # 30-byte rows: not TMA-aligned
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert fuse_gelu_gemm(model) == 1 and fuse_gelu_gemm(model) == 1  # idempotent
    assert type(model["erf"]) is GemmGeluFFN
    assert all(type(model[k]) is PositionwiseFFN for k in ("tanh", "relu", "odd"))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    fresh = torch.nn.Sequential(PositionwiseFFN(16, 64))
    assert apply(fresh, "gelugemm") is fresh and type(fresh[0]) is GemmGeluFFN


@pytest.mark.skipif(not (torch.cuda.is_available() and gelu_gemm_available()
                         and torch.cuda.get_device_capability()[0] >= 9), reason="needs a Hopper GPU and triton")
def test_pretraining_step_with_gemm_gelu_matches_plain_on_gpu():
    """A BERT pretraining step under bf16 autocast: same loss and gradients as the plain
    model, within bf16 rounding of a 4-layer stack."""
    from ctxkit.models import get_preset
    from ctxkit.pretraining.train import PretrainingModel

    cfg = get_preset("bert_4_256_4").config.replace(dropout=0.0, attention_dropout=0.0, vocab_size=1000)
    torch.manual_seed(0)
    plain = PretrainingModel(cfg).cuda()
    fast = copy.deepcopy(plain)
    assert fuse_gelu_gemm(fast) == cfg.num_layers
    ids = torch.randint(5, 1000, (8, 64), device="cuda")
    results = []
    for model in (plain, fast):
        with torch.autocast("cuda", torch.bfloat16):
            hidden = model.bert(ids)[0]
        loss = hidden.float().square().mean()
        loss.backward()
        results.append((loss.item(), {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}))
    assert results[0][1].keys() == results[1][1].keys()
    assert abs(results[0][0] - results[1][0]) <= 2e-2 * abs(results[0][0])
    for name, g in results[0][1].items():
        other = results[1][1][name]
        scale = g.abs().max().item()
        assert (other - g).abs().max().item() <= 0.05 * scale + 1e-8, name


@needs_triton
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(), reason="no Triton target")
def test_normal_cdf_pdf_and_gelu_of_the_epilogue_match_float64_over_a_wide_range():
    """The epilogue's erf (Abramowitz & Stegun 7.1.26) against float64, -12..12: absolute
    error of Phi below 1e-7 and of phi below float32 rounding, no cancellation in the tail;
    the GELU written as relu(x) - |x| Phi(-|x|) within Phi's error times |x|."""
    import triton
    import triton.language as tl

    # A jitted function finds what it calls among its module's globals (not closures); this
    # module cannot import the kernels at the top (importing it must not need triton).
    globals()["_normal_cdf_pdf"] = _kernels()._normal_cdf_pdf
    globals()["_gelu"] = _kernels()._gelu

    @triton.jit
    def probe(x_ptr, cdf_ptr, pdf_ptr, gelu_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
        cdf, pdf = _normal_cdf_pdf(x)  # noqa: F821
        tl.store(cdf_ptr + offs, cdf, mask=offs < n)
        tl.store(pdf_ptr + offs, pdf, mask=offs < n)
        tl.store(gelu_ptr + offs, _gelu(x), mask=offs < n)  # noqa: F821

    device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
    x = torch.linspace(-12, 12, 4801, dtype=torch.float32, device=device)
    cdf, pdf, gelu = torch.empty_like(x), torch.empty_like(x), torch.empty_like(x)
    probe[(triton.cdiv(x.numel(), 1024),)](x, cdf, pdf, gelu, x.numel(), BLOCK=1024)
    x64 = x.double().cpu()
    want_cdf = 0.5 * torch.special.erfc(-x64 / 2 ** 0.5)
    want_pdf = torch.exp(-0.5 * x64 * x64) / (2 * torch.pi) ** 0.5
    # erf to 1.5e-7 (the formula) plus float32 rounding of 1 - tail and the fast reciprocal
    assert (cdf.double().cpu() - want_cdf).abs().max().item() < 3e-7
    assert (pdf.double().cpu() - want_pdf).abs().max().item() < 4 * torch.finfo(torch.float32).eps * want_pdf.max().item()
    want_gelu = x64 * want_cdf  # Phi's error scaled by |x|, plus float32 rounding of the result
    gelu_bound = 3e-7 * x64.abs() + 2 * torch.finfo(torch.float32).eps * want_gelu.abs() + 1e-30
    assert ((gelu.double().cpu() - want_gelu).abs() <= gelu_bound).all()
    assert (gelu.cpu()[x64 < -6] <= 0).all() and (gelu.cpu()[x64 > 6] == x.cpu()[x64 > 6]).all()
    far = x64 < -6  # the tail comes from the product, not from 1 - (something near 1)
    assert (cdf.cpu()[far] > 0).all() and (cdf.cpu()[far].double() <= 2 * want_cdf[far] + 1e-12).all()
