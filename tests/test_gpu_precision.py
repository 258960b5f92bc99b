"""On CUDA the precision asked of a backend is the precision that runs: `--precision fp32`
with the pytorch backend is fp32 (predict()'s default bf16 autocast no longer lowers it),
bf16 is bf16 autocast, and the gpu backend gets no autocast laid on top (GPU only)."""

import copy

import numpy as np
import pytest
import torch

from ctxkit.heads.classification import EncoderWithHead, SequenceClassificationHead
from ctxkit.inference.backends import with_backend
from ctxkit.models import BertModel, get_preset
from ctxkit.training import predict

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _features(n=64):
    g = torch.Generator().manual_seed(0)
    feats = []
    for _ in range(n):
        ids = [2] + torch.randint(8, 500, (int(torch.randint(4, 60, (1,), generator=g)),), generator=g).tolist() + [3]
        feats.append({"input_ids": ids, "token_type_ids": [0] * len(ids), "attention_mask": [1] * len(ids)})
    return feats


def _model():
    torch.manual_seed(0)
    config = get_preset("bert_4_256_4").config.replace(vocab_size=512, dropout=0.0, attention_dropout=0.0)
    model = EncoderWithHead(BertModel(config), SequenceClassificationHead(256, 2, 0.0))
    with torch.no_grad():
        model.head.classifier.weight.mul_(100)  # wide logits: bf16 rounding shows far above fp32's
    return model.cuda().eval()


@pytest.fixture
def no_tf32():
    """fp32 means fp32 matrix products: no TF32 for the reference (PyTorch's default, made sure)."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_fp32_request_runs_fp32_on_cuda_and_bf16_runs_bf16(no_tf32):
    model, feats = _model(), _features()
    fp32 = np.stack(predict(model, feats, batch_size=16, device="cuda", precision="fp32"))  # eager fp32, no TF32
    bf16 = np.stack(predict(model, feats, batch_size=16, device="cuda", precision="bf16"))  # bf16 autocast
    default = np.stack(predict(model, feats, batch_size=16, device="cuda"))  # "auto" on CUDA: bf16 autocast
    scale = np.abs(fp32).max()
    assert np.abs(bf16 - fp32).max() > 1e-3 * scale  # bf16 rounding is visible at this scale
    np.testing.assert_allclose(default, bf16, rtol=0, atol=1e-6 * scale)

    seen = []
    fc1 = model.encoder.encoder.layers[0].ffn.fc1
    hook = fc1.register_forward_hook(lambda m, i, o: seen.append(o.dtype))

    wrapped, description = with_backend(model, "pytorch", "fp32")
    assert description == f"PyTorch ({next(model.parameters()).device}, fp32, no autocast)"
    got = np.stack(predict(wrapped, feats, batch_size=16, device="cuda"))  # the tasks' call: precision "auto"
    assert set(seen) == {torch.float32}
    np.testing.assert_allclose(got, fp32, rtol=1e-5, atol=1e-5 * scale)
    assert np.abs(got - bf16).max() > 1e-3 * scale

    seen.clear()
    wrapped, description = with_backend(model, "pytorch", "bf16")
    assert description.endswith(", bf16 autocast)")
    got = np.stack(predict(wrapped, feats, batch_size=16, device="cuda", precision="fp32"))  # the declared bf16 wins
    assert set(seen) == {torch.bfloat16}
    np.testing.assert_allclose(got, bf16, rtol=0, atol=1e-6 * scale)
    hook.remove()


def test_gpu_backend_fp32_gets_no_autocast_from_predict(no_tf32):
    """`--backend gpu --precision fp32` through the tasks' predict() call (precision "auto",
    which used to add bf16 autocast on CUDA) stays within fp32 distance of the eager fp32 run."""
    model, feats = _model(), _features()
    fp32 = np.stack(predict(model, feats, batch_size=16, device="cuda", precision="fp32"))
    bf16 = np.stack(predict(model, feats, batch_size=16, device="cuda", precision="bf16"))
    gpu, description = with_backend(copy.deepcopy(model), "gpu", "fp32")
    assert description.startswith("GPU encoder (fp32 weights") and gpu.inference_precision == "native"
    got = np.stack(predict(gpu, feats, batch_size=16, device="cuda"))
    err, bf16_err = np.abs(got - fp32).max(), np.abs(bf16 - fp32).max()
    assert err < 1e-3 * np.abs(fp32).max() and err < 0.1 * bf16_err, (err, bf16_err)
