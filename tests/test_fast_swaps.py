"""ctxkit.fast: each fast variant swapped into a built model computes what the plain model
computes, keeps its parameters and state_dict keys, and swapping twice is swapping once.

"The same function" is checked per tests/README.md: both sides against a float64 run of
the plain model, within the bound derived from float32 (embeddings + layers as depth, the
FFN width as the longest sum). A swap that reorders nothing (the stream dtype without
autocast, compile segments in eager mode) is held to bit equality.
"""

import copy
import pickle

import pytest
import torch

from ctxkit.fast import (
    FusedQKVAttention,
    GeluEpilogueFFN,
    SegmentedEncoder,
    StreamDtypeAddNorm,
    StreamDtypeEmbeddings,
    apply,
    enable_gelu_epilogue,
    fuse_qkv,
    segment_encoders,
    set_stream_dtype,
)
from ctxkit.layers import AddNorm, MultiHeadAttention, PositionwiseFFN, RelativeMultiHeadAttention, TransformerEmbeddings, TransformerEncoder
from ctxkit.models import BertModel, get_preset
from tolerance import assert_close_to_reference, float64, to64

LAYERS = 2
BLOCK = dict(depth=1 + LAYERS, k=512)  # embeddings' LayerNorm + 2 layers of FFN width 512


def _bert(activation="gelu"):
    torch.manual_seed(0)
    config = get_preset("bert_2_128_2").config.replace(vocab_size=300, max_position=64, dropout=0.0, attention_dropout=0.0,
                                                       activation=activation)
    return BertModel(config).eval()


def _inputs():
    ids = torch.randint(5, 300, (3, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    return ids, mask


def _run(model, ids, mask):
    return model(ids, mask).last_hidden_state


def _identity(model):
    return [(name, id(p)) for name, p in model.named_parameters()], list(model.state_dict())


SWAPS = {  # plan option -> (plain module, its fast variant)
    "qkv": (MultiHeadAttention, FusedQKVAttention),
    "bf16res": (AddNorm, StreamDtypeAddNorm),
    "seg2": (TransformerEncoder, SegmentedEncoder),
}


@pytest.mark.parametrize("name", sorted(SWAPS))
def test_swap_keeps_outputs_parameters_and_keys_and_is_idempotent(name):
    plain, fast = SWAPS[name]
    model = _bert()
    ids, mask = _inputs()
    reference = _run(float64(model), ids, mask)
    with torch.no_grad():
        before = _run(model, ids, mask)
    params, keys = _identity(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # holds the parameters across the swap
    assert apply(model, name) is model
    swapped = [m for m in model.modules() if isinstance(m, plain)]
    assert swapped and all(isinstance(m, fast) for m in swapped)
    assert _identity(model) == (params, keys)  # same Parameter objects, same state_dict keys
    assert {id(p) for g in optimizer.param_groups for p in g["params"]} == {id(p) for p in model.parameters()}
    with torch.no_grad():
        after = _run(model, ids, mask)
    if name == "qkv":  # one GEMM for three: float32 sums in another order
        assert_close_to_reference(before, reference, name="plain", **BLOCK)
        assert_close_to_reference(after, reference, name=f"{name} swapped", **BLOCK)
    else:  # the same operations without autocast (the cast is inert) or torch.compile (no breaks)
        assert torch.equal(after, before)
    classes = [type(m) for m in model.modules()]
    apply(model, name)
    assert [type(m) for m in model.modules()] == classes  # swapping twice = swapping once
    assert _identity(model) == (params, keys)
    with torch.no_grad():
        assert torch.equal(_run(model, ids, mask), after)
    model.load_state_dict(_bert().state_dict())  # checkpoints load as before
    clone = copy.deepcopy(model)
    assert [type(m) for m in clone.modules()] == classes


def test_fused_attention_values_and_gradients_match_float64_in_training():
    model = _bert().train()
    fused = copy.deepcopy(model)
    assert fuse_qkv(fused) == LAYERS
    ids, mask = _inputs()
    reference = float64(model).train()
    ref_out = _run(reference, ids, mask)
    weights64 = torch.linspace(-1, 1, 128, dtype=torch.float64)
    (ref_out * weights64).sum().backward()
    for m in (model, fused):
        out = _run(m, ids, mask)
        assert_close_to_reference(out, ref_out.detach(), name=type(m.encoder.layers[0].self_attn).__name__, **BLOCK)
        (out * weights64.float()).sum().backward()
    ref_grads = dict(reference.named_parameters())
    for (name, p), (_, q) in zip(model.named_parameters(), fused.named_parameters()):
        if p.grad is None or name.endswith("k_proj.bias"):  # exactly 0: softmax ignores a shift of all scores
            continue
        # Back down through the layers again; a weight's gradient also sums over the 36 tokens.
        for g, side in ((p.grad, "plain"), (q.grad, "fused")):
            assert_close_to_reference(g, ref_grads[name].grad, depth=2 * BLOCK["depth"], k=512 * 36, name=f"{side} {name}")


def test_fused_relative_attention_is_made_once_and_pickles():
    torch.manual_seed(0)
    attn = RelativeMultiHeadAttention(32, 4).eval()
    x, memory = torch.randn(2, 5, 32), torch.randn(2, 3, 32)
    pos = torch.randn(8, 32)
    reference = float64(attn)(to64(x), to64(pos), to64(memory))[0]
    with torch.no_grad():
        plain = attn(x, pos, memory)[0]
        fuse_qkv(attn)
        fused = attn(x, pos, memory)[0]
        alone = attn(x, torch.randn(5, 32))[0]  # q, k, v of one input: one GEMM
    assert isinstance(attn, FusedQKVAttention) and isinstance(attn, RelativeMultiHeadAttention)
    other = RelativeMultiHeadAttention(32, 4)
    fuse_qkv(other)
    assert type(other) is type(attn)  # one class per teaching class
    for name, out in (("plain", plain), ("fused", fused)):
        assert_close_to_reference(out, reference, depth=4, k=32, name=name)  # projections, scores, mix, output
    assert alone.shape == (2, 5, 32)
    again = pickle.loads(pickle.dumps(attn))
    assert type(again) is type(attn)


def test_fused_weights_are_cached_in_inference_only():
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 2)
    fuse_qkv(attn)
    x = torch.randn(1, 3, 16)
    attn(x)
    assert getattr(attn, "_fused_cache", None) is None  # autograd on: concatenated per call
    with torch.inference_mode():
        attn(x)
    assert len(attn._fused_cache) == 1  # q/k/v


def test_gelu_epilogue_equals_tanh_gelu_without_grad_and_the_plain_layer_with_grad():
    model = _bert(activation="gelu_new")  # tanh GELU: the epilogue computes the same function
    ids, mask = _inputs()
    reference = _run(float64(model), ids, mask)
    params, keys = _identity(model)
    assert enable_gelu_epilogue(model) == LAYERS
    assert all(type(m) is GeluEpilogueFFN for m in model.modules() if isinstance(m, PositionwiseFFN))
    assert _identity(model) == (params, keys)
    with torch.no_grad():
        fast = _run(model, ids, mask)
    assert_close_to_reference(fast, reference, name="GELU epilogue", **BLOCK)
    with_grad = _run(model, ids, mask)  # autograd on: the plain, differentiable layer
    with_grad.sum().backward()
    assert model.encoder.layers[0].ffn.fc1.weight.grad is not None
    assert enable_gelu_epilogue(model) == LAYERS  # idempotent
    relu = _bert(activation="relu")
    assert enable_gelu_epilogue(relu) == 0 and not any(isinstance(m, GeluEpilogueFFN) for m in relu.modules())


def test_stream_dtype_under_autocast_and_back():
    model = _bert()
    ids, mask = _inputs()
    n = set_stream_dtype(model, torch.bfloat16)
    assert n == 1 + 2 * LAYERS
    assert isinstance(model.embeddings, StreamDtypeEmbeddings)
    seen = []
    hook = model.encoder.layers[0].register_forward_hook(lambda m, i, o: seen.append((i[0].dtype, o[0].dtype)))
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        _run(model, ids, mask)
    hook.remove()
    assert seen == [(torch.bfloat16, torch.bfloat16)]
    assert set_stream_dtype(model, None) == n
    assert type(model.embeddings) is TransformerEmbeddings
    assert all(type(m) is AddNorm and "stream_dtype" not in vars(m) for m in model.modules() if isinstance(m, AddNorm))


def test_segments_set_breaks_and_one_segment_restores_the_plain_encoder():
    torch.manual_seed(0)
    enc = TransformerEncoder(4, 32, 4, 64)
    assert segment_encoders(enc, 2) == 1
    assert isinstance(enc, SegmentedEncoder) and enc.compile_breaks == {1}
    x = torch.randn(2, 5, 32)
    enc.eval()
    with torch.no_grad():
        out = enc(x, output_hidden_states=True)
    assert len(out.hidden_states) == 5
    segment_encoders(enc, 1)
    assert type(enc) is TransformerEncoder and "compile_breaks" not in vars(enc)
    with torch.no_grad():
        assert torch.equal(enc(x).last_hidden_state, out.last_hidden_state)
    with pytest.raises(ValueError, match="segments"):
        segment_encoders(enc, 0)


def test_plain_layers_carry_no_switches():
    model = _bert()
    switches = {"fused_qkv", "_fused_cache", "stream_dtype", "compile_breaks", "gelu_epilogue"}
    for module in model.modules():
        assert not switches & set(vars(module)), type(module).__name__
        assert not any(hasattr(type(module), s) for s in switches), type(module).__name__
    for cls in (MultiHeadAttention, PositionwiseFFN, AddNorm, TransformerEmbeddings, TransformerEncoder):
        assert not {"_fused", "prepare_inference", "_fused_cache"} & set(vars(cls))


def test_trainer_speed_options_and_decoding_fuse_the_model_in_place():
    from ctxkit.decoding import GenerationConfig, generate
    from ctxkit.models.gpt2.model import GPT2LMHeadModel
    from ctxkit.zoo.presets import GPT2_PRESETS
    from ctxkit.fast import resolve
    from ctxkit.training.speed import prepare_model

    model = _bert()
    prepare_model(model, resolve("auto+bf16res", use="train", device="cpu"))
    assert all(isinstance(m, FusedQKVAttention) for m in model.modules() if isinstance(m, MultiHeadAttention))
    assert isinstance(model.embeddings, StreamDtypeEmbeddings)
    torch.manual_seed(0)
    lm = GPT2LMHeadModel(GPT2_PRESETS["gpt2_2_128_2"].replace(vocab_size=100)).eval()
    generate(lm, torch.randint(0, 100, (1, 4)), config=GenerationConfig(max_new_tokens=2), static=False)
    assert all(isinstance(m, FusedQKVAttention) for m in lm.modules() if isinstance(m, MultiHeadAttention))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_encoder_runs_fused_attention_from_a_prepared_cache():
    from ctxkit.inference.gpu import GPUEncoder

    model = _bert()
    ids, _ = _inputs()
    reference = _run(float64(model), ids, None)
    gpu = GPUEncoder(model, dtype=torch.float32, plan="graphs+qkv")
    attn = gpu.model.encoder.layers[0].self_attn
    assert isinstance(attn, FusedQKVAttention) and len(attn._fused_cache) == 1  # concatenated before any capture
    out = gpu(ids).last_hidden_state.cpu()
    assert gpu.last_path == "graph"
    # TF32 (10-bit mantissa) may be on for CUDA matmuls: then bound by bf16's epsilon, above it.
    assert_close_to_reference(out, reference, dtype=torch.bfloat16 if torch.backends.cuda.matmul.allow_tf32 else torch.float32,
                              name="GPU encoder", **BLOCK)


def test_compile_norm_split_sets_inductor_and_rejects_bad_values():
    from ctxkit.core.errors import UserError
    from ctxkit.fast import FastPlan
    from ctxkit.training.speed import prepare_model, set_norm_grad_split

    triton_config = torch._inductor.config.triton
    if not hasattr(triton_config, "mix_order_reduction_split_size"):  # torch < 2.10: nothing to set
        assert set_norm_grad_split(64) is False
        return
    before = triton_config.mix_order_reduction_split_size
    try:
        prepare_model(_bert(), FastPlan.parse("compile+normsplit64"))
        assert triton_config.mix_order_reduction_split_size == 64
        with pytest.raises(UserError, match="power of two"):
            set_norm_grad_split(48)
        assert triton_config.mix_order_reduction_split_size == 64  # a refused value changes nothing
        assert set_norm_grad_split(None) is True and triton_config.mix_order_reduction_split_size is None
    finally:
        triton_config.mix_order_reduction_split_size = before
