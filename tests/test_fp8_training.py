"""ctxkit.fast.fp8_training: the float8 training option (torchao, row-wise scales).

Where it cannot run (no torchao, no GPU with float8 tensor cores) it must refuse before
any compute with a message saying what is missing; on such a GPU it swaps the Transformer
layers' Linears only and trains close to bf16 (the convergence figure itself comes from
benchmarks/fp8_training.py on real data).
"""

import importlib.util

import pytest
import torch

from ctxkit.core.errors import UserError
from ctxkit.models import get_preset
from ctxkit.pretraining.train import PretrainingModel
from ctxkit.training import TrainConfig, Trainer
from ctxkit.fast.fp8_training import enable_fp8_training, fp8_training_unavailable
from ctxkit.fast import FastPlan
from ctxkit.training.speed import prepare_model

HAS_FP8 = (importlib.util.find_spec("torchao") is not None and torch.cuda.is_available()
           and torch.cuda.get_device_capability() >= (8, 9))


def _model():
    cfg = get_preset("bert_2_128_2").config.replace(vocab_size=300, max_position=64)
    torch.manual_seed(0)
    return PretrainingModel(cfg)


def test_fp8_training_refuses_where_it_cannot_run(tmp_path):
    model = _model()  # on the CPU
    why = fp8_training_unavailable(torch.device("cpu"))
    assert why is not None and ("torchao" in why or "CUDA GPU" in why)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(UserError, match="fp8train needs"):
        enable_fp8_training(model)
    with pytest.raises(UserError, match="fp8train needs"):  # through the trainer's plan too
        prepare_model(model, FastPlan.parse("fp8train"))
    with pytest.raises(UserError, match="fp8train: needs"):  # and refused when the plan is resolved, before any work
        Trainer(model, [{"input_ids": [1, 2, 3]}], TrainConfig(device="cpu", fast="auto+fp8train-qkv", progress=False), tmp_path)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # nothing changed
    assert all(type(m) is torch.nn.Linear for m in model.modules() if isinstance(m, torch.nn.Linear))


@pytest.mark.skipif(not HAS_FP8, reason="needs torchao and a GPU with float8 tensor cores")
def test_fp8_training_swaps_the_layer_linears_and_tracks_bf16():
    from torchao.float8.float8_linear import Float8Linear

    ref, model = _model().cuda(), _model().cuda()
    keys = set(model.state_dict())
    swapped = enable_fp8_training(model)
    fp8 = {n for n, m in model.named_modules() if isinstance(m, Float8Linear)}
    assert swapped == len(fp8) == 2 * 6  # q, k, v, out, fc1, fc2 per layer
    assert all(".layers." in f".{n}." for n in fp8)  # embeddings, heads and the MLM decoder stay bf16
    assert set(model.state_dict()) == keys
    ids = torch.randint(5, 300, (15, 63), device="cuda")  # 945 tokens: not a multiple of 16
    losses = []
    for m in (ref, model):
        with torch.autocast("cuda", torch.bfloat16):
            out = m.bert(ids)[0]
        loss = out.float().square().mean()
        loss.backward()
        losses.append((loss.item(), m.bert.bert.encoder.layers[0].ffn.fc1.weight.grad.float()))
    # float8 e4m3 keeps 3 mantissa bits: a few per cent, not bf16's 0.4 %.
    assert abs(losses[1][0] - losses[0][0]) <= 0.05 * abs(losses[0][0])
    g_ref, g = losses[0][1], losses[1][1]
    assert (g - g_ref).norm() <= 0.15 * g_ref.norm()
