"""fp8 matrix products (ctxkit.inference.fp8): the GPU's arithmetic, checked on the CPU
(torch._scaled_mm runs there too)."""

import pytest
import torch

from ctxkit.heads.classification import EncoderWithHead, SequenceClassificationHead
from ctxkit.fast import FusedQKVAttention
from ctxkit.inference.fp8 import FP8_MAX, Fp8Linear, convert_to_fp8
from ctxkit.models import BertModel, get_preset
from tolerance import assert_close_to_reference, assert_paths_agree, magnitude


def test_fp8_linear_is_a_row_scaled_e4m3_product():
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48)
    x = torch.randn(3, 5, 64)
    x[0, 0] *= 100  # a loud row: row-wise scales keep the quiet rows' precision
    fp8 = Fp8Linear(linear)
    assert fp8.qweight.dtype == torch.float8_e4m3fn and fp8.weight_scale.shape == (1, 48)
    got = fp8(x.to(torch.bfloat16)).float()
    want = linear(x)
    assert got.shape == want.shape
    # e4m3 keeps 3 mantissa bits: a few per cent per element, partly averaged out by the sums.
    rel = (got - want).abs() / want.abs().amax(-1, keepdim=True)
    assert rel.max() < 0.06 and rel.mean() < 0.02
    # The same numbers by hand: quantise, multiply in fp32, rescale.
    rows = x.reshape(-1, 64).to(torch.bfloat16).float()
    sx = rows.abs().amax(-1, keepdim=True) / FP8_MAX
    qx = (rows / sx).to(torch.float8_e4m3fn).float() * sx
    qw = fp8.qweight.float() * fp8.weight_scale.t()
    product = qx @ qw.t()
    manual = (product + linear.bias).view_as(got)
    # The same quantised numbers: only the bf16 output differs, rounded at most twice (the
    # product, then + bias), each at the size of its operands (tests/README.md)
    scale = (product.abs() + linear.bias.abs()).view_as(got).detach()
    assert_close_to_reference(got, manual.detach(), dtype=torch.bfloat16, scale=scale, depth=2, name="fp8 product vs by hand")
    with pytest.raises(ValueError, match="multiples of 16"):
        Fp8Linear(torch.nn.Linear(60, 48))


def test_converted_classifier_keeps_its_answers():
    torch.manual_seed(0)
    cfg = get_preset("bert_2_128_2").config.replace(vocab_size=300)
    model = EncoderWithHead(BertModel(cfg), SequenceClassificationHead(128, 2, 0.0)).eval()
    with torch.no_grad():
        model.head.classifier.weight.mul_(100)  # logits far apart, as after training
    ids = torch.randint(5, 300, (16, 12))
    mask = torch.ones_like(ids)
    mask[3, 7:] = 0
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask)["logits"]
    model = model.to(torch.bfloat16)
    assert convert_to_fp8(model) == 2 * 6  # q, k, v, out, fc1, fc2 per layer
    assert all(type(m) is not torch.nn.Linear for layer in model.encoder.encoder.layers for m in layer.modules())
    assert type(model.head.classifier) is torch.nn.Linear  # the head stays bf16
    attn = model.encoder.encoder.layers[0].self_attn
    assert isinstance(attn, FusedQKVAttention)  # swapped in by convert_to_fp8 (ctxkit.fast)
    assert attn.fused_qkv.out_features == 3 * 128  # self-attention: one fp8 GEMM for q, k, v
    x = torch.randn(2, 5, 128, dtype=torch.bfloat16)
    with torch.no_grad():  # the fused GEMM equals the three separate ones (same quantised input)
        fused = attn._project(x, None, None)
        kept = attn.fused_qkv
        del attn.fused_qkv
        separate = attn._project(x, None, None)
        attn.fused_qkv = kept
    for a, b in zip(fused, separate):  # fp32 sums in another order, then one bf16 rounding each
        assert_paths_agree(a.float(), b.float(), dtype=torch.bfloat16, scale=magnitude(b.float(), per_element=True),
                           name="fused vs separate q/k/v")
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=mask)["logits"].float()
    assert (got.argmax(-1) == ref.argmax(-1)).all()
    assert (got - ref).abs().max() < 0.1 * ref.abs().max()
    with pytest.raises(ValueError, match="no ctxkit Transformer layers"):
        convert_to_fp8(torch.nn.Sequential(torch.nn.Linear(16, 16)))


@pytest.mark.parametrize("precision", ["fp8", "bf16-gelu-tanh"])
def test_gpu_only_precisions_are_refused_outside_the_gpu_backend(precision):
    from ctxkit.inference.backends import with_backend

    model = EncoderWithHead(BertModel(get_preset("bert_2_128_2").config.replace(vocab_size=300)), SequenceClassificationHead(128, 2, 0.0))
    for backend in ("compiled", "auto", "pytorch"):
        with pytest.raises(ValueError, match=f"{precision} is a precision of the gpu backend"):
            with_backend(model, backend, precision)


def _fused_path_runs_here() -> bool:
    from ctxkit.fast.gelu_gemm import _runs_on, gelu_gemm_available

    return gelu_gemm_available() and _runs_on("cpu", None)


@pytest.mark.parametrize("activation", [None, "gelu"])
@pytest.mark.parametrize("fused", [False, True], ids=["pytorch", "triton"])
def test_fp8_epilogue_linear_is_one_rounding_of_the_scaled_e4m3_product(activation, fused, monkeypatch, request):
    """Fp8EpilogueLinear: scales, bias and GELU applied to the float32 sum of the exact e4m3
    products, rounded once -- through PyTorch, or the Triton kernel (Triton's interpreter on
    the CPU, where it stores fp16 exactly; bf16 on a GPU is tests/test_fast_gemm.py's)."""
    from ctxkit.fast import Fp8EpilogueLinear
    from ctxkit.fast import gelu_gemm

    if fused:
        request.getfixturevalue("triton_interpreter")  # the kernel on CPU tensors, where it runs there
    if fused and not _fused_path_runs_here():
        pytest.skip("the Triton kernel does not run here (no triton, or no interpreter)")
    if not fused:
        monkeypatch.setattr(gelu_gemm, "_runs_on", lambda *a: False)
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48)
    x = torch.randn(3, 5, 64)
    x[0, 0] *= 100  # a loud row: row-wise scales keep the quiet rows' precision
    dtype = torch.float16 if fused else torch.bfloat16
    mod = Fp8EpilogueLinear(linear, activation=activation, out_dtype=dtype)
    got = mod(x.to(dtype))
    assert got.dtype == dtype and got.shape == (3, 5, 48)
    rows = x.reshape(-1, 64).to(dtype).float()
    sx = rows.abs().amax(-1, keepdim=True).clamp(min=1e-12) / FP8_MAX
    q = (rows / sx).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).double()
    qw = mod.qweight.double()
    scales = sx.double() * mod.weight_scale.double()
    bias = linear.bias.detach().to(dtype).double()
    want = (q @ qw.t()) * scales + bias
    scale = (q.abs() @ qw.abs().t()) * scales + bias.abs()
    if activation == "gelu":
        want = torch.nn.functional.gelu(want)
    assert_close_to_reference(got.reshape(-1, 48), want, dtype=dtype, scale=scale, name=f"fp8 epilogue {activation}")
    with pytest.raises(ValueError, match="activation must be"):
        Fp8EpilogueLinear(linear, activation="relu")
    with pytest.raises(ValueError, match="needs a Linear with a bias"):
        Fp8EpilogueLinear(torch.nn.Linear(64, 48, bias=False))


def test_norm_inputs_scope_converts_qkv_and_fc1_and_keeps_the_answers():
    from ctxkit.fast import Fp8EpilogueLinear, Fp8GeluFFN

    torch.manual_seed(0)
    cfg = get_preset("bert_2_128_2").config.replace(vocab_size=300)
    model = EncoderWithHead(BertModel(cfg), SequenceClassificationHead(128, 2, 0.0)).eval()
    with torch.no_grad():
        model.head.classifier.weight.mul_(100)  # logits far apart, as after training
    ids = torch.randint(5, 300, (16, 12))
    mask = torch.ones_like(ids)
    mask[3, 7:] = 0
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask)["logits"]
    model = model.to(torch.bfloat16)
    assert convert_to_fp8(model, "norm_inputs") == 2 * 4  # q, k, v (one product) and fc1 per layer
    for layer in model.encoder.encoder.layers:
        assert isinstance(layer.self_attn.fused_qkv, Fp8EpilogueLinear) and layer.self_attn.fused_qkv.activation is None
        assert type(layer.ffn) is Fp8GeluFFN and layer.ffn.fc1.activation == "gelu"
        assert type(layer.ffn.fc2) is torch.nn.Linear and type(layer.self_attn.out_proj) is torch.nn.Linear  # stay bf16
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=mask)["logits"].float()
    assert (got.argmax(-1) == ref.argmax(-1)).all()
    assert (got - ref).abs().max() < 0.1 * ref.abs().max()
    with pytest.raises(ValueError, match="fp8 scope"):
        convert_to_fp8(model, "everything")
