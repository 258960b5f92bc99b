"""MasterAdamW (bf16 weights, fp32 masters, one flat update) and clipped_step: the update
against a float64 AdamW, skipped parameters, state round trips, the Trainer option (same
numbers as bf16 autocast, exact resume, fp32 masters saved), the Triton kernels against a
float64 AdamW (on the CPU through Triton's interpreter, tests/README.md), and the CUDA
kernel against the PyTorch path."""

import importlib.util
import json
import math
import os

import pytest
import torch
from torch import nn

from ctxkit.core.errors import UserError
from ctxkit.training import TrainConfig, Trainer
from ctxkit.training.master import MasterAdamW, build_master_adamw, low_precision_parameters
from ctxkit.training.optim import build_adamw, clipped_step
from test_trainer import _model, _toy_features
from tolerance import assert_close_to_reference

EPS32 = torch.finfo(torch.float32).eps


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(11, 8)
        self.fc1 = nn.Linear(8, 300)  # (2400 weights: a whole kernel block and a partial one)
        self.norm = nn.LayerNorm(300)
        self.fc2 = nn.Linear(300, 11)

    def forward(self, ids, labels):
        logits = self.fc2(self.norm(torch.relu(self.fc1(self.emb(ids)))))
        return {"loss": nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten())}


def _reference_adamw(params64, grads64, state, lr, wd, betas, eps, max_norm, step):
    """torch's AdamW formula with clip_grad_norm_'s factor, in float64."""
    total = math.sqrt(sum(float((g * g).sum()) for g in grads64))
    clip = min(1.0, max_norm / (total + 1e-6)) if max_norm > 0 else 1.0
    b1, b2 = betas
    for i, (p, g) in enumerate(zip(params64, grads64)):
        g = g * clip
        m, v = state.setdefault(i, (torch.zeros_like(p), torch.zeros_like(p)))
        p -= lr * wd[i] * p
        m.mul_(b1).add_(g, alpha=1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        p -= lr / (1 - b1 ** step) * m / (v.sqrt() / math.sqrt(1 - b2 ** step) + eps)


def _bf16_grads(params, seed):
    g = torch.Generator().manual_seed(seed)
    # bf16 values (what a bf16 GEMM hands back), large enough that clipping acts.
    return [(torch.randn(p.shape, generator=g) * 3).to(torch.bfloat16).float() for p in params]


def test_update_matches_float64_adamw_and_keeps_bf16_copies():
    model = Toy()
    low = low_precision_parameters(model)
    assert {id(p) for p in low} == {id(model.fc1.weight), id(model.fc1.bias), id(model.fc2.weight), id(model.fc2.bias)}
    start = [p.detach().double().clone() for p in model.parameters()]
    groups = [{"params": [p for p in model.parameters() if p.dim() > 1], "weight_decay": 0.1},
              {"params": [p for p in model.parameters() if p.dim() == 1], "weight_decay": 0.0}]
    wd = [0.1 if p.dim() > 1 else 0.0 for p in model.parameters()]
    opt = MasterAdamW(groups, low_precision=low, lr=1e-2, betas=(0.9, 0.99), eps=1e-8)
    assert model.fc1.weight.dtype == torch.bfloat16 and model.norm.weight.dtype == torch.float32
    assert model.emb.weight.dtype == torch.float32
    ref, state = [p.clone() for p in start], {}
    for step in range(1, 6):
        grads = _bf16_grads(list(model.parameters()), step)
        for p, g in zip(model.parameters(), grads):
            p.grad = g.to(p.dtype)
        opt.step(max_grad_norm=1.0)
        _reference_adamw(ref, [g.double() for g in grads], state, 1e-2, wd, (0.9, 0.99), 1e-8, 1.0, step)
    assert float(opt.last_grad_norm) > 1.0  # clipping acted
    with opt.full_precision():
        masters = [p.detach().clone() for p in model.parameters()]
        assert all(p.dtype == torch.float32 for p in model.parameters())
    for m, r, s in zip(masters, ref, start):
        # fp32 rounding of a few operations per step on values of size |p| + 5 * lr.
        bound = 16 * 5 * EPS32 * (s.abs().max() + 5 * 1e-2)
        assert (m.double() - r).abs().max() <= bound
    # The model computes with the rounded masters.
    for p, m in zip(model.parameters(), masters):
        assert torch.equal(p.detach(), m.to(p.dtype))


def test_parameters_without_gradients_are_left_alone():
    model = Toy()
    opt = build_master_adamw(model, 1e-2)
    before = model.fc2.weight.detach().clone()
    other = model.fc1.weight.detach().clone()
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    model.fc2.weight.grad = None
    with pytest.warns(UserWarning, match="no gradient"):
        opt.step(max_grad_norm=1.0)
    assert torch.equal(model.fc2.weight.detach(), before)
    assert not torch.equal(model.fc1.weight.detach(), other)  # the others moved


def test_state_round_trip_continues_bit_exactly():
    def run(model, opt, seeds):
        for s in seeds:
            for p, g in zip(model.parameters(), _bf16_grads(list(model.parameters()), s)):
                p.grad = g.to(p.dtype)
            opt.step(max_grad_norm=1.0)

    a = Toy()
    opt_a = build_master_adamw(a, 1e-2)
    run(a, opt_a, [1, 2])
    with opt_a.full_precision():
        weights = {k: v.clone() for k, v in a.state_dict().items()}
    saved = opt_a.state_dict()
    run(a, opt_a, [3, 4])
    b = Toy()
    opt_b = build_master_adamw(b, 1e-2)
    b.load_state_dict(weights)
    opt_b.load_state_dict(saved)
    run(b, opt_b, [3, 4])
    for x, y in zip(a.parameters(), b.parameters()):
        assert torch.equal(x, y)
    with pytest.raises(UserError, match="not a MasterAdamW state"):
        opt_b.load_state_dict(torch.optim.AdamW(Toy().parameters()).state_dict())


def test_clipped_step_with_fused_adamw_matches_clip_grad_norm():
    a, b = Toy(), Toy()
    opt_a, opt_b = build_adamw(a, 1e-2), build_adamw(b, 1e-2)
    for step in range(1, 4):
        for model in (a, b):
            for p, g in zip(model.parameters(), _bf16_grads(list(model.parameters()), step)):
                p.grad = g.clone()
        clipped_step(opt_a, a.parameters(), 1.0)
        torch.nn.utils.clip_grad_norm_(b.parameters(), 1.0)
        opt_b.step()
    for x, y in zip(a.parameters(), b.parameters()):
        # g / (1 / c) vs g * c: one rounding apart per step, on values of size |p| + lr.
        assert (x - y).abs().max() <= 16 * 3 * EPS32 * (y.abs().max() + 1e-2)


def _cfg(**kw):
    return dict(epochs=1, batch_size=8, lr=1e-3, device="cpu", progress=False, log_every=1, seed=5, precision="bf16", **kw)


def test_trainer_master_weights_gives_autocast_numbers_and_saves_masters(tmp_path):
    feats = _toy_features(48)
    plain = Trainer(_model(0.0), feats, TrainConfig(**_cfg()), tmp_path / "plain").train()
    trainer = Trainer(_model(0.0), feats, TrainConfig(**_cfg(fast="auto+master")), tmp_path / "master")
    master = trainer.train()
    assert isinstance(trainer.optimizer, MasterAdamW)
    assert len(master.losses) == len(plain.losses) == 6
    # The same forward values and gradients: only the order of the norm's sums and one
    # rounding of the clip factor differ, which may move a bf16 rounding of a weight.
    for x, y in zip(master.losses, plain.losses):
        assert abs(x - y) <= 2 ** -8 * abs(y)
    assert master.losses[0] == plain.losses[0]  # the first forward is identical
    from ctxkit.core.checkpoint import read_weights

    saved = read_weights(tmp_path / "master" / "checkpoint")
    assert all(v.dtype == torch.float32 for v in saved.values())
    with trainer.optimizer.full_precision():
        live = {k: v.detach() for k, v in trainer.model.state_dict().items()}
    for k, v in saved.items():
        assert torch.equal(v, live[k]), k


def test_trainer_master_weights_resume_equals_uninterrupted(tmp_path):
    feats = _toy_features()
    cfg = dict(_cfg(fast="auto+master"), epochs=2)
    full = Trainer(_model(), feats, TrainConfig(**cfg), tmp_path / "full").train()
    Trainer(_model(), feats, TrainConfig(**cfg, max_steps=7), tmp_path / "cut").train()
    state = json.loads((tmp_path / "cut" / "checkpoint" / "trainer_state.json").read_text())
    assert state["step"] == 7
    torch.manual_seed(1234)
    resumed = Trainer(_model(), feats, TrainConfig(**cfg), tmp_path / "cut").train(resume=True)
    assert resumed.losses == full.losses


def test_trainer_master_weights_refuses_what_it_cannot_do(tmp_path):
    feats = _toy_features(16)
    with pytest.raises(UserError, match="precision is fp32"):
        Trainer(_model(), feats, TrainConfig(**dict(_cfg(fast="auto+master"), precision="fp32")), tmp_path / "a")
    with pytest.raises(UserError, match="lamb"):
        Trainer(_model(), feats, TrainConfig(**_cfg(fast="auto+master", optimizer="lamb")), tmp_path / "b")


def _kernel_targets():
    """(device, low-precision dtype) where the Triton update runs here. The interpreter rounds
    float32 to bfloat16 by truncation (Triton 3.7's ignores ``fp_downcast_rounding`` there;
    float16 goes through NumPy, which rounds to nearest even), so on the CPU the low copies
    are float16: the same kernel, another ``GRAD_DTYPE`` and store type."""
    if importlib.util.find_spec("triton") is None:
        return []
    return ([("cpu", torch.float16)] if os.environ.get("TRITON_INTERPRET") == "1" else []) + (
        [("cuda", torch.bfloat16)] if torch.cuda.is_available() else [])


@pytest.mark.usefixtures("triton_interpreter")
@pytest.mark.parametrize("target", _kernel_targets(), ids=lambda t: f"{t[0]}-{t[1]}".replace("torch.", ""))
def test_triton_update_and_norm_match_float64_adamw(target):
    device, dtype = target
    model = Toy().to(device)
    start = [p.detach().double().cpu().clone() for p in model.parameters()]
    wd = [0.1 if p.dim() > 1 else 0.0 for p in model.parameters()]
    groups = [{"params": [p for p in model.parameters() if p.dim() > 1], "weight_decay": 0.1},
              {"params": [p for p in model.parameters() if p.dim() == 1], "weight_decay": 0.0}]
    opt = MasterAdamW(groups, low_precision=low_precision_parameters(model), lr=1e-2, betas=(0.9, 0.99), eps=1e-8,
                      dtype=dtype)
    assert opt._use_kernels() and model.fc1.weight.dtype == dtype
    ref, state = [p.clone() for p in start], {}
    for step in range(1, 4):
        for p, g in zip(model.parameters(), _bf16_grads(list(model.parameters()), step)):
            p.grad = g.to(device, p.dtype)
        grads64 = [p.grad.double().cpu() for p in model.parameters()]  # what the kernels read
        opt.step(max_grad_norm=1.0)
        assert all(kind.tables is not None for kind in opt.kinds)  # the kernels' path, not the gathered one
        # The norm: float32 sums of squares per 2048-element block, then over the blocks.
        norm64 = math.sqrt(sum(float((g * g).sum()) for g in grads64))
        assert_close_to_reference(opt.last_grad_norm.cpu().reshape(1), torch.tensor([norm64], dtype=torch.float64),
                                  dtype=torch.float32, k=sum(g.numel() for g in grads64), name="gradient norm")
        _reference_adamw(ref, grads64, state, 1e-2, wd, (0.9, 0.99), 1e-8, 1.0, step)
    assert float(opt.last_grad_norm) > 1.0  # clipping acted
    with opt.full_precision():
        masters = [p.detach().cpu().clone() for p in model.parameters()]
    for m, r, s in zip(masters, ref, start):
        # fp32 rounding of a few operations per step on values of size |p| + 3 * lr.
        assert (m.double() - r).abs().max() <= 16 * 3 * EPS32 * (s.abs().max() + 3 * 1e-2)
    for kind in opt.kinds:  # the low copies are the masters rounded once (to nearest even)
        if kind.low:
            assert torch.equal(kind.flat, kind.master.to(kind.flat.dtype))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the Triton update kernel runs on CUDA")
def test_cuda_kernel_matches_pytorch_path():
    pytest.importorskip("triton")
    models = [Toy().cuda(), Toy().cuda()]
    opts = [build_master_adamw(m, 1e-2) for m in models]
    opts[1]._kernels = False  # the PyTorch arithmetic on gathered gradients
    assert opts[0]._use_kernels()
    for step in range(1, 6):
        grads = _bf16_grads(list(models[0].parameters()), step)
        for model, opt in zip(models, opts):
            for p, g in zip(model.parameters(), grads):
                p.grad = g.to(p.dtype).cuda()
            opt.step(max_grad_norm=1.0)
    for ka, kb in zip(opts[0].kinds, opts[1].kinds):
        scale = float(kb.master.abs().max()) + 5e-2
        assert float((ka.master - kb.master).abs().max()) <= 16 * 5 * EPS32 * scale
        assert float((ka.exp_avg_sq - kb.exp_avg_sq).abs().max()) <= 16 * 5 * EPS32 * float(kb.exp_avg_sq.abs().max())
        if ka.low:  # the bf16 copies are the rounded masters
            assert torch.equal(ka.flat, ka.master.to(ka.flat.dtype))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_cuda_graph_replays_update_like_eager_steps():
    pytest.importorskip("triton")
    from ctxkit.training.graphs import GraphedTrainStep

    def batch(i):
        g = torch.Generator().manual_seed(i)
        return {"ids": torch.randint(0, 11, (4, 6), generator=g).cuda(), "labels": torch.randint(0, 11, (4, 6), generator=g).cuda()}

    runs = []
    for graphed in (False, True):
        model = Toy().cuda()
        opt = build_master_adamw(model, 1e-2, capturable=graphed)
        amp = lambda: torch.autocast("cuda", torch.bfloat16, cache_enabled=False)  # noqa: E731
        step = GraphedTrainStep(model, opt, 1.0, amp)
        losses = [float((step(batch(i)) if graphed else step.eager(batch(i)))["loss"]) for i in range(6)]
        if graphed:
            assert step.replays == 5  # the first step eager, then captured and replayed
        runs.append((losses, opt.kinds[0].master.clone()))
    (la, ma), (lb, mb) = runs
    # The same kernels in the same order: the graph's table refills point at its own gradients.
    for x, y in zip(la, lb):
        assert abs(x - y) <= 4 * EPS32 * abs(y)
    assert float((ma - mb).abs().max()) <= 16 * 6 * EPS32 * (float(mb.abs().max()) + 6e-2)
    start = build_master_adamw(Toy().cuda(), 1e-2).kinds[0].master
    assert float((ma - start).abs().max()) > 1e-3  # six updates of about lr each moved the weights
