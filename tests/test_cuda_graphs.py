"""Whole-step CUDA graphs train exactly like eager steps (GPU only; skipped on CPU CI)."""

import pytest
import torch

from ctxkit.heads.classification import EncoderWithHead, SequenceClassificationHead
from ctxkit.models import BertModel, get_preset
from ctxkit.training import TrainConfig, Trainer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")


def _features(n=256):
    g = torch.Generator().manual_seed(0)
    feats = []
    for i in range(n):
        length = int(torch.randint(4, 60, (1,), generator=g))
        ids = [2] + torch.randint(8, 500, (length,), generator=g).tolist() + [3]
        feats.append({"input_ids": ids, "token_type_ids": [0] * len(ids), "attention_mask": [1] * len(ids), "labels": i % 2})
    return feats


def _model():
    torch.manual_seed(0)
    config = get_preset("bert_4_256_4").config.replace(vocab_size=512, dropout=0.0, attention_dropout=0.0)
    return EncoderWithHead(BertModel(config), SequenceClassificationHead(256, 2, 0.0))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_graphed_steps_match_eager_steps(tmp_path, precision):
    feats = _features()
    common = dict(epochs=2, batch_size=16, lr=1e-4, device="cuda", precision=precision, progress=False, pad_multiple=16, seed=3)
    eager = Trainer(_model(), feats, TrainConfig(cuda_graphs=False, **common), tmp_path / "eager")
    graphed = Trainer(_model(), feats, TrainConfig(cuda_graphs=True, **common), tmp_path / "graphed")
    a, b = eager.train(), graphed.train()
    assert graphed.graphed is not None and graphed.graphed.replays > 0.6 * len(b.losses)
    tol = 2e-4 if precision == "fp32" else 3e-2
    assert b.losses == pytest.approx(a.losses, rel=tol, abs=tol)
    for p, q in zip(eager.model.parameters(), graphed.model.parameters()):
        assert torch.allclose(p, q, atol=tol * 10, rtol=tol * 10)
