"""Quaternion linear layers (Parcollet et al. 2019; Tay et al. 2019): the layer equals a float64
reference that multiplies quaternions component by component, has a quarter of the weights,
passes gradients to its four components; quaternionize swaps exactly the Transformer
projections; and the translator's quaternion option saves, loads and counts as expected."""

import copy
import json

import pytest
import torch
from torch import nn

from ctxkit.core.errors import UserError
from ctxkit.fast import fuse_qkv
from ctxkit.layers import (MultiHeadAttention, PositionwiseFFN, QuaternionLinear, TransformerEncoder, TransformerEncoderLayer,
                           hamilton_product, padding_mask, quaternionize)
from ctxkit.models.seq2seq.model import SEQ2SEQ_PRESETS, Seq2SeqConfig, TransformerSeq2Seq, load_seq2seq, save_seq2seq
from tolerance import assert_close_to_reference, assert_paths_agree

IN, OUT = 16, 24  # 4 and 6 quaternions: in != out catches a transposed block


def _hamilton(a, b, c, d, e, f, g, h):
    """(a + bi + cj + dk)(e + fi + gj + hk), written from i^2 = j^2 = k^2 = ijk = -1."""
    return (a * e - b * f - c * g - d * h,
            a * f + b * e + c * h - d * g,
            a * g - b * h + c * e + d * f,
            a * h + b * g - c * f + d * e)


def _reference(r, i, j, k, bias, x):
    """y[n, o] = sum_g W[o, g] (x) x[n, g] + bias, quaternion by quaternion, in the layout
    [r | i | j | k] of four contiguous component blocks."""
    groups = x.shape[-1] // 4
    xr, xi, xj, xk = (x[..., None, c * groups:(c + 1) * groups] for c in range(4))  # (..., 1, in/4)
    parts = _hamilton(r, i, j, k, xr, xi, xj, xk)  # each (..., out/4, in/4): one product per (o, g)
    y = torch.cat([p.sum(-1) for p in parts], dim=-1)  # sum over the input quaternions
    return y + bias if bias is not None else y


def _components(layer):
    return layer.r_weight, layer.i_weight, layer.j_weight, layer.k_weight


def _layer(seed=0, bias=True):
    torch.manual_seed(seed)
    layer = QuaternionLinear(IN, OUT, bias=bias)
    if bias:
        with torch.no_grad():
            layer.bias.normal_()  # zero at init; a real bias tests that it is added once
    return layer


def _sum_of_terms(layer, x):
    """Per output, sum |terms| of its reduction (the scale of its rounding, tests/tolerance.py)."""
    bias = layer.bias.detach().double().abs() if layer.bias is not None else 0
    return x.double().abs() @ layer.weight().detach().double().abs().t() + bias


def test_layer_equals_the_quaternion_by_quaternion_reference():
    layer = _layer()
    x = torch.randn(2, 5, IN)
    ref = _reference(*(p.detach().double() for p in _components(layer)), layer.bias.detach().double(), x.double())
    # float32: bounded by the sum of |terms| of each IN-term reduction.
    assert_close_to_reference(layer(x), ref, scale=_sum_of_terms(layer, x), k=IN, name="float32 output")
    # float64: agrees to ~1e-16, so a wrong sign or a swapped block fails by orders of magnitude.
    layer64 = copy.deepcopy(layer).double()
    assert_close_to_reference(layer64(x.double()), ref, scale=_sum_of_terms(layer, x), k=IN, name="float64 output")
    assert layer(x).shape == (2, 5, OUT)


def test_block_matrix_is_left_multiplication_by_the_weight_quaternion():
    # One input and one output quaternion: the layer is x -> w (x) x with w = (r, i, j, k).
    torch.manual_seed(1)
    layer = QuaternionLinear(4, 4, bias=False).double()
    w = torch.cat([p.detach().reshape(1) for p in _components(layer)])
    x = torch.randn(7, 4, dtype=torch.float64)
    expected = hamilton_product(w.expand(7, 4), x)
    assert_paths_agree(layer(x), expected, k=4, scale=_sum_of_terms(layer, x), name="w (x) x")  # two float64 paths
    # Left, not right multiplication: the quaternion product does not commute.
    assert (hamilton_product(x, w.expand(7, 4)) - expected).abs().max() > 1e-3


def test_hamilton_product_signs_and_norm():
    one, i, j, k = torch.eye(4, dtype=torch.float64)
    for a, b, want in ((i, j, k), (j, k, i), (k, i, j), (j, i, -k), (i, i, -one), (k, k, -one)):
        assert torch.equal(hamilton_product(a, b), want)  # ij = k, jk = i, ki = j, ji = -k, i^2 = k^2 = -1
    g = torch.Generator().manual_seed(2)
    q = torch.randn(50, 4, generator=g, dtype=torch.float64)
    x = torch.randn(50, 4, generator=g, dtype=torch.float64)
    assert_paths_agree(hamilton_product(q, x), torch.stack(_hamilton(*q.unbind(-1), *x.unbind(-1)), -1), k=4, name="product")
    # |q (x) x| = |q| |x| (the norm is multiplicative); it fails for a wrong sign in the product.
    assert_close_to_reference(hamilton_product(q, x).norm(dim=-1), q.norm(dim=-1) * x.norm(dim=-1), k=8, name="|q x| = |q||x|")
    # The layer built from a unit quaternion is a rotation of R^4: its 4x4 matrix is orthogonal.
    layer = QuaternionLinear(4, 4, bias=False).double()
    unit = q[0] / q[0].norm()
    with torch.no_grad():
        for p, v in zip(_components(layer), unit):
            p.fill_(v)
    m = layer.weight()
    assert_close_to_reference(m @ m.t(), torch.eye(4, dtype=torch.float64), scale=1.0, k=4, name="W W^T = I")
    assert_close_to_reference(layer(x).norm(dim=-1), x.norm(dim=-1), k=8, name="|u (x) x| = |x|")
    # A wrong sign in any block (here out_i's k term) breaks orthogonality.
    broken = m.clone()
    broken[1, 2] *= -1
    assert (broken @ broken.t() - torch.eye(4, dtype=torch.float64)).abs().max() > 1e-3


@pytest.mark.parametrize("bias", [True, False])
def test_parameter_count_is_a_quarter(bias):
    layer = QuaternionLinear(IN, OUT, bias=bias)
    assert sum(p.numel() for p in layer.parameters()) == IN * OUT // 4 + (OUT if bias else 0)
    assert [p.shape for p in _components(layer)] == [(OUT // 4, IN // 4)] * 4
    assert layer.weight().shape == (OUT, IN)


def test_gradients_reach_every_component():
    layer = _layer(seed=3).double()
    x = torch.randn(3, 5, IN, dtype=torch.float64)
    upstream = torch.randn(3, 5, OUT, dtype=torch.float64)
    (layer(x) * upstream).sum().backward()
    leaves = [p.detach().clone().requires_grad_() for p in (*_components(layer), layer.bias)]
    (_reference(*leaves, x) * upstream).sum().backward()
    # Each component's gradient sums, over the 15 rows, the four blocks it appears in; bound it
    # by the sum over all 16 block pairs of |upstream| |x| (at most 4x the true sum of |terms|).
    gy, gx = upstream.abs().reshape(15, 4, OUT // 4), x.abs().reshape(15, 4, IN // 4)
    scale = torch.einsum("nbo,ncg->og", gy, gx)
    for name, ours, ref in zip("rijk", _components(layer), leaves):
        assert ours.grad is not None and ours.grad.abs().max() > 0
        assert_close_to_reference(ours.grad, ref.grad, scale=scale, k=4 * 15, name=f"d loss / d {name}")
    assert_close_to_reference(layer.bias.grad, leaves[4].grad, k=15, name="d loss / d bias")


def test_initialisation_matches_the_real_glorot_variance():
    torch.manual_seed(4)
    w = QuaternionLinear(256, 512).weight().detach().double()
    glorot = 2 / (256 + 512)
    # 131072 draws: the sample variance is within a few percent of its expectation.
    assert abs(w.var().item() / glorot - 1) < 0.05 and abs(w.mean().item()) < 0.05 * glorot ** 0.5
    he = QuaternionLinear(256, 512, criterion="he").weight().detach().double()
    assert abs(he.var().item() / (2 / 256) - 1) < 0.05
    assert torch.equal(QuaternionLinear(8, 8).bias, torch.zeros(8))


def test_sizes_must_be_divisible_by_four():
    with pytest.raises(UserError, match="divisible by 4.*in_features=6"):
        QuaternionLinear(6, 8)
    with pytest.raises(UserError, match="unknown quaternion init criterion"):
        QuaternionLinear(8, 8, criterion="xavier")
    ffn = nn.Sequential(PositionwiseFFN(8, 30))
    with pytest.raises(UserError, match=r"0\.fc1 \(8 -> 30\), 0\.fc2 \(30 -> 8\)"):
        quaternionize(ffn)
    assert isinstance(ffn[0].fc1, nn.Linear) and not isinstance(ffn[0].fc1, QuaternionLinear)  # nothing half-replaced


def test_quaternionize_encoder_layer_and_stack():
    torch.manual_seed(5)
    layer = TransformerEncoderLayer(16, 2, 32, dropout=0.0, attention_dropout=0.0).double()
    norms = [layer.self_attn_res.norm, layer.ffn_res.norm]
    real = sum(p.numel() for p in layer.parameters())
    same, count = quaternionize(layer)
    assert same is layer and count == 6
    names = {name for name, m in layer.named_modules() if isinstance(m, QuaternionLinear)}
    assert names == {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj", "ffn.fc1", "ffn.fc2"}
    assert not any(type(m) is nn.Linear for m in layer.modules())
    assert [layer.self_attn_res.norm, layer.ffn_res.norm] == norms  # everything else untouched
    assert all(p.dtype == torch.float64 for p in layer.parameters())
    weights = 4 * 16 * 16 + 2 * 16 * 32
    assert real - sum(p.numel() for p in layer.parameters()) == weights * 3 // 4
    assert quaternionize(layer)[1] == 0  # already quaternion: nothing to do

    encoder = TransformerEncoder(2, 16, 2, 32, dropout=0.0, attention_dropout=0.0)
    assert quaternionize(encoder, names=("fc1", "fc2"))[1] == 4  # names pick the projections
    assert quaternionize(encoder)[1] == 8
    encoder.eval()
    x = torch.randn(2, 6, 16)
    mask = padding_mask(torch.tensor([[1] * 6, [1] * 4 + [0] * 2]))
    out = encoder(x, mask=mask).last_hidden_state
    assert out.shape == (2, 6, 16) and torch.isfinite(out).all()
    ref = copy.deepcopy(encoder).double()(x.double(), mask=mask).last_hidden_state
    assert_close_to_reference(out, ref, k=32, depth=2, name="quaternion encoder")
    # Training always fuses q/k/v (ctxkit.fast): with quaternion projections it calls them one by one.
    fused = copy.deepcopy(encoder)
    assert fuse_qkv(fused) == 2
    assert_close_to_reference(fused(x, mask=mask).last_hidden_state, ref, k=32, depth=2, name="fused, autograd on")
    with torch.inference_mode():
        assert_close_to_reference(fused(x, mask=mask).last_hidden_state, ref, k=32, depth=2, name="fused, inference")


def test_quaternionize_keeps_device_dtype_and_bias():
    attn = MultiHeadAttention(8, 2, bias=False).to(torch.float64)
    quaternionize(attn)
    assert attn.q_proj.bias is None and attn.q_proj.r_weight.dtype == torch.float64
    meta = PositionwiseFFN(8, 16).to("meta")
    quaternionize(meta)
    assert meta.fc1.r_weight.is_meta and meta.fc1.bias.shape == (16,)


# ---- the translator's quaternion option

TINY = Seq2SeqConfig(2, 2, 16, 2, 32, vocab_size=24, max_position=16, dropout=0.0, attention_dropout=0.0)


def _stack_params(model):
    return sum(p.numel() for p in model.encoder.parameters()) + sum(p.numel() for p in model.decoder.parameters())


def test_quaternion_translator_counts_saves_and_loads(tmp_path):
    torch.manual_seed(6)
    real = TransformerSeq2Seq(TINY)
    quat = TransformerSeq2Seq(TINY.replace(quaternion=True))
    # Every projection of both stacks: encoder 4 d^2 + 2 d f, decoder 8 d^2 + 2 d f per layer.
    d, f = TINY.hidden_size, TINY.ffn_size
    weights = 2 * (4 * d * d + 2 * d * f) + 2 * (8 * d * d + 2 * d * f)
    total = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert total(real) - total(quat) == weights * 3 // 4 == _stack_params(real) - _stack_params(quat)
    assert sum(isinstance(m, QuaternionLinear) for m in quat.modules()) == 2 * 6 + 2 * 10  # decoder: self + cross + FFN
    assert not isinstance(quat.embed, QuaternionLinear) and quat.output is None  # embeddings (tied output) stay real

    save_seq2seq(quat, tmp_path / "q")
    loaded = load_seq2seq(tmp_path / "q")
    assert loaded.config.quaternion and loaded.config == quat.config
    src = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 0]])
    tgt = torch.tensor([[1, 5, 6, 7, 2], [1, 8, 9, 2, 0]])
    quat.eval()
    memory = quat.encode(src)
    assert torch.equal(loaded.decode(tgt, loaded.encode(src)), quat.decode(tgt, memory))
    # An old config.json, written before the field existed, still loads (as a real model).
    save_seq2seq(real, tmp_path / "r")
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    del config["quaternion"]
    (tmp_path / "r" / "config.json").write_text(json.dumps(config))
    old = load_seq2seq(tmp_path / "r")
    assert not old.config.quaternion and not any(isinstance(m, QuaternionLinear) for m in old.modules())


def test_quaternion_presets_pair_with_the_real_ones():
    pairs = {"quaternion_3_256_8": "transformer_3_256_8", "quaternion_3_512_8": "transformer_3_512_8"}
    for quat, real in pairs.items():
        assert SEQ2SEQ_PRESETS[quat] == SEQ2SEQ_PRESETS[real].replace(quaternion=True)
    # The counts quoted beside the presets (8000-token joint BPE; built on meta: no values).
    counts = {}
    for name in ("transformer_3_256_8", "quaternion_3_256_8", "quaternion_3_448_8", "quaternion_3_512_8", "transformer_3_512_8"):
        with torch.device("meta"):
            model = TransformerSeq2Seq(SEQ2SEQ_PRESETS[name].replace(vocab_size=8000))
        counts[name] = sum(p.numel() for p in model.parameters())
    assert counts == {"transformer_3_256_8": 7_578_624, "quaternion_3_256_8": 3_449_856, "quaternion_3_448_8": 7_843_584,
                      "quaternion_3_512_8": 9_652_224, "transformer_3_512_8": 26_167_296}
    with pytest.raises(UserError, match="divisible by 4"):
        TransformerSeq2Seq(TINY.replace(quaternion=True, ffn_size=30))


def test_translate_train_quaternion_flag(tmp_path):
    from ctxkit.cli import build_parser
    from ctxkit.tasks.translation import train_translation
    from ctxkit.training import TrainConfig

    files = ["--train-src", "a", "--train-tgt", "b", "--valid-src", "c", "--valid-tgt", "d", "--out", "o"]
    assert build_parser().parse_args(["translate-train", *files, "--quaternion"]).quaternion
    assert not build_parser().parse_args(["translate-train", *files]).quaternion
    with pytest.raises(UserError, match="not the RNN preset"):  # before any file is read
        train_translation(("a", "b"), ("c", "d"), tmp_path / "o", TrainConfig(), preset="rnn_attention_256_512", quaternion=True)
