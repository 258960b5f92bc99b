"""XLNet behind ctxkit's task heads: outputs, padding, and a fine-tuning run that learns."""

import pytest
import torch

from ctxkit.models.presets import XLNET_PRESETS
from ctxkit.models.xlnet import XLNetModel
from ctxkit.models.xlnet_encoder import XLNetEncoder
from ctxkit.tasks import get_task
from ctxkit.training import TrainConfig, Trainer, predict

pytestmark = pytest.mark.usefixtures("one_thread")


def _encoder(dropout=0.0):
    torch.manual_seed(0)
    config = XLNET_PRESETS["xlnet_12_768_12"].replace(vocab_size=40, d_model=32, n_heads=4, d_inner=64, n_layers=2,
                                                      dropout=dropout)
    return XLNetEncoder(XLNetModel(config))


def test_summary_is_the_last_real_token_and_padding_changes_nothing():
    enc = _encoder().eval()
    ids = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    with torch.no_grad():
        out = enc(ids, None, mask)
        alone = enc(ids[1:, :3], None, mask[1:, :3])
    assert out.last_hidden_state.shape == (2, 5, 32) and out.pooler_output.shape == (2, 32)
    torch.testing.assert_close(out.last_hidden_state[1, :3], alone.last_hidden_state[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.pooler_output[1], alone.pooler_output[0], rtol=1e-5, atol=1e-5)
    expected = torch.tanh(enc.pooler(out.last_hidden_state[1, 2]))
    torch.testing.assert_close(out.pooler_output[1], expected, rtol=1e-6, atol=1e-6)


def test_sentence_classification_with_a_task_head_learns(tmp_path):
    """SST-2's task model (ctxkit's head) on XLNet learns "does token 7 occur?" from data."""
    g = torch.Generator().manual_seed(1)
    feats = []
    for i in range(192):
        n = int(torch.randint(4, 12, (1,), generator=g))
        ids = torch.randint(8, 40, (n,), generator=g).tolist()
        label = i % 2
        if label:
            ids[int(torch.randint(0, n, (1,), generator=g))] = 7
        feats.append({"input_ids": ids, "token_type_ids": [0] * n, "attention_mask": [1] * n, "labels": label})
    model = get_task("sst-2").build_model(_encoder(dropout=0.1))
    config = TrainConfig(epochs=6, batch_size=16, lr=2e-3, device="cpu", progress=False, seed=0)
    Trainer(model, feats, config, tmp_path).train()
    logits = predict(model, feats, batch_size=64, device="cpu")
    accuracy = sum(int(l.argmax() == f["labels"]) for l, f in zip(logits, feats)) / len(feats)
    assert accuracy >= 0.95
