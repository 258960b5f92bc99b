"""ctxkit.fast.dropout: dropout masks drawn outside compiled graphs as packed bits (MaskDropout).

The swapped module must be nn.Dropout's function (p rounded to 2^-16): each element kept
independently with probability 1 - p and scaled by 1 / (1 - p), the gradient the same mask
and scale, identity in eval mode; compiled graphs must neither merge two draws nor redraw a mask for the backward;
under CUDA-graph capture each replay must draw a fresh mask.
"""

import math

import pytest
import torch
from torch import nn

from ctxkit.fast import MaskDropout, apply, dropout_keep_mask, fast_dropout, unfast_dropout


def _binomial_bound(n: int, p: float, sigmas: float = 6.0) -> float:
    """Largest |kept - n (1 - p)| accepted: `sigmas` standard deviations of Binomial(n, 1 - p)."""
    return sigmas * math.sqrt(n * p * (1 - p))


def _effective(p: float) -> float:
    """p as MaskDropout draws it: rounded to a multiple of 2^-16."""
    return round(p * 65536) / 65536


@pytest.fixture(params=["pytorch", "triton"])
def mask_path(request, monkeypatch):
    """Both ways of drawing the packed mask: PyTorch's Bernoulli kernel (a CPU's) and the
    Triton kernel (on the CPU through Triton's interpreter, where triton is installed)."""
    from ctxkit.fast import dropout as module

    if request.param == "triton":
        request.getfixturevalue("triton_interpreter")
        if not module._kernel_runs("cpu"):
            pytest.skip("the Triton mask kernel does not run here (no triton, or no interpreter)")
    else:
        monkeypatch.setattr(module, "_kernel_runs", lambda device_type: False)
    return request.param


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_mask_dropout_keeps_each_element_with_probability_1_minus_p_and_scales_it(p, mask_path):
    torch.manual_seed(0)
    x = torch.randn(400, 500, dtype=torch.float64, requires_grad=True)
    drop = MaskDropout(p).train()
    y = drop(x)
    kept = y != 0
    n = x.numel()
    pe = _effective(p)
    assert abs(kept.sum().item() - n * (1 - pe)) <= _binomial_bound(n, pe)
    # Every bit position of the packed bytes keeps at the same rate (a packing error would not).
    by_bit = kept.reshape(-1, 8).sum(0).double()
    assert (by_bit - n / 8 * (1 - pe)).abs().max() <= _binomial_bound(n // 8, pe)
    # Neighbours are independent: both kept at rate (1 - p)^2.
    flat = kept.reshape(-1)
    pairs = (flat[0::2] & flat[1::2]).sum().item()
    q = (1 - pe) ** 2
    assert abs(pairs - n / 2 * q) <= 6.0 * math.sqrt(n / 2 * q * (1 - q))
    # Kept elements are x / (1 - p) (one float64 rounding apart), dropped ones exactly 0.
    eps = torch.finfo(torch.float64).eps
    torch.testing.assert_close(y[kept], x.detach()[kept] / (1 - pe), rtol=4 * eps, atol=0)
    assert (y[~kept] == 0).all()
    # The backward uses the same mask: d(sum y)/dx = keep / (1 - p).
    y.sum().backward()
    torch.testing.assert_close(x.grad, kept.double() / (1 - pe), rtol=4 * eps, atol=0)


def test_mask_dropout_is_identity_in_eval_mode_and_for_p_0_and_zero_for_p_1():
    x = torch.randn(8, 16)
    assert MaskDropout(0.3).eval()(x) is x
    assert MaskDropout(0.0).train()(x) is x
    assert (MaskDropout(1.0).train()(x) == 0).all()


@pytest.mark.parametrize("numel", [1000, 1001])  # whole bytes, and a partial last byte
def test_masks_follow_the_default_generator(mask_path, numel):
    x = torch.ones(numel)
    torch.manual_seed(5)
    a = dropout_keep_mask(x, 0.3)
    b = dropout_keep_mask(x, 0.3)
    torch.manual_seed(5)
    assert torch.equal(dropout_keep_mask(x, 0.3), a)  # reseeding reproduces the draw
    assert not torch.equal(a, b)  # successive draws differ
    assert a.dtype == torch.uint8 and a.shape == x.shape and set(a.unique().tolist()) == {0, 1}


def test_fast_dropout_swaps_dropout_modules_in_place_and_back():
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1), nn.Sequential(nn.Dropout(0.2), nn.Dropout(0.3, inplace=True)))
    keys = list(model.state_dict())
    first = model[1]
    assert fast_dropout(model) == 2
    assert type(model[1]) is MaskDropout and model[1] is first and model[1].p == 0.1
    assert type(model[2][0]) is MaskDropout and type(model[2][1]) is nn.Dropout  # in-place ones are left alone
    assert fast_dropout(model) == 0  # swapping twice is swapping once
    assert list(model.state_dict()) == keys
    assert unfast_dropout(model) == 2 and type(model[1]) is nn.Dropout
    assert apply(model, "maskdrop") is model and type(model[1]) is MaskDropout


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_mask_dropout_draws_once_per_call_and_reuses_the_mask_in_backward(backend):
    """Two dropouts of one input in a compiled graph draw two masks (not merged), and the
    gradient is each output's own mask (not redrawn for the backward)."""
    drop = MaskDropout(0.5).train()

    def f(x):
        return drop(x), drop(x)

    compiled = torch.compile(f, fullgraph=True, backend=backend)
    torch.manual_seed(0)
    x = torch.randn(64, 64, requires_grad=True)
    y1, y2 = compiled(x)
    assert not torch.equal(y1 != 0, y2 != 0)
    weights = torch.randn(64, 64)
    (y1 * weights).sum().backward()
    scale = 1 / (1 - _effective(0.5))
    torch.testing.assert_close(x.grad, (y1 != 0).float() * weights * scale, rtol=1e-6, atol=0)


def test_trainer_plan_swaps_dropout():
    from ctxkit.fast import resolve
    from ctxkit.training.speed import prepare_model

    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1))
    prepare_model(model, resolve("auto+maskdrop", use="train", device="cpu"))
    assert type(model[1]) is MaskDropout
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1))
    prepare_model(model, resolve("auto", use="train", device="cpu"))  # on a CPU auto leaves dropout alone
    assert type(model[1]) is nn.Dropout


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_graph_replays_draw_fresh_masks_and_a_graphed_pretraining_step_trains():
    drop = MaskDropout(0.5).train()
    x = torch.ones(4096, device="cuda")
    static = drop(x)  # warm up outside the graph
    graph = torch.cuda.graph if hasattr(torch.cuda, "graph") else None
    g = torch.cuda.CUDAGraph()
    with graph(g):
        static = drop(x)
    g.replay()
    first = static.clone()
    g.replay()
    assert not torch.equal(first, static)  # graph-safe RNG: a new mask per replay
    n = x.numel()
    assert abs((static != 0).sum().item() - n / 2) <= _binomial_bound(n, 0.5)

    from ctxkit.models import get_preset
    from ctxkit.pretraining.train import PretrainingModel
    from ctxkit.training.graphs import GraphedTrainStep
    from ctxkit.training.optim import build_adamw

    cfg = get_preset("bert_4_256_4").config.replace(vocab_size=1000)
    torch.manual_seed(0)
    model = PretrainingModel(cfg).cuda().train()
    assert fast_dropout(model) > 0
    model.compile()
    opt = build_adamw(model, 1e-3, 0.01, capturable=True)
    step = GraphedTrainStep(model, opt, 1.0, lambda: torch.autocast("cuda", torch.bfloat16, cache_enabled=False))
    ids = torch.randint(5, 1000, (8, 64), device="cuda")
    positions = torch.arange(1, 64, 6, device="cuda").expand(8, -1).contiguous()
    batch = {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "masked_positions": positions,
             "masked_labels": ids.gather(1, positions), "next_sentence_label": torch.zeros(8, dtype=torch.long, device="cuda")}
    losses = [float(step(batch)["loss"]) for _ in range(12)]
    assert all(math.isfinite(v) for v in losses)
    assert step.replays > 0
    assert sum(losses[-3:]) < sum(losses[:3])  # one repeated batch: the loss falls
