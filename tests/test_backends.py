"""Backends: the auto decision is made once per run folder and reused; a precision asked of
the pytorch backend reaches the model (CPU here; tests/test_gpu_precision.py on CUDA)."""

import json
import os

import numpy as np
import pytest
import torch

from ctxkit.core.checkpoint import save_weights
from ctxkit.core.errors import UserError
from ctxkit.heads.classification import EncoderWithHead, SequenceClassificationHead
from ctxkit.inference import backends
from ctxkit.inference.backends import AUTO_CHOICE_DIR, PrecisionModel, with_backend
from ctxkit.models import BertModel, get_preset
from ctxkit.training import predict

TINY = get_preset("bert_2_128_2").config.replace(vocab_size=100, num_layers=1, hidden_size=32, num_heads=2, ffn_size=64,
                                                 max_position=128, dropout=0.0, attention_dropout=0.0)


def _model(seed=0):
    torch.manual_seed(seed)
    return EncoderWithHead(BertModel(TINY), SequenceClassificationHead(32, 2, 0.0)).eval()


def _run_folder(tmp_path, model):
    """A run folder as far as the auto decision is concerned: weights in best/."""
    save_weights(model.state_dict(), tmp_path / "run" / "best" / "model.safetensors")
    return tmp_path / "run"


def _features(n=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    feats = []
    for _ in range(n):
        ids = [2] + torch.randint(5, 100, (int(torch.randint(3, 30, (1,), generator=g)),), generator=g).tolist() + [3]
        feats.append({"input_ids": ids, "token_type_ids": [0] * len(ids), "attention_mask": [1] * len(ids)})
    return feats


class _Timings:
    """Stands in for ``median_ms``: counts the timings taken and says which backend is faster
    (choose_backend times PyTorch, then ONNX Runtime)."""

    def __init__(self, winner):
        self.calls = 0
        self.ms = (2.0, 1.0) if winner == "onnxruntime" else (1.0, 2.0)

    def __call__(self, fn, reps=5, warmup=1):
        fn()
        self.calls += 1
        return self.ms[(self.calls - 1) % 2]


def test_auto_decides_once_per_run_folder_and_again_when_the_weights_change(tmp_path, monkeypatch):
    model = _model()
    run = _run_folder(tmp_path, model)
    timings = _Timings("onnxruntime")
    monkeypatch.setattr(backends, "median_ms", timings)
    batch = {k: torch.tensor([v]) for k, v in _features(1, seed=1)[0].items()}

    first, description = with_backend(model, "auto", None, run_dir=run)
    assert timings.calls == 2 and type(first).__name__ == "OrtTaskModel"
    assert description.startswith("auto: ONNX Runtime (fp32 export") and "decision kept in" in description
    record = json.loads((run / AUTO_CHOICE_DIR / "choice.json").read_text())
    assert record["backend"] == "onnxruntime" and record["key"]["precision"] == "fp32"
    assert record["key"]["cpu"] == backends._cpu_name() and record["key"]["threads"] == torch.get_num_threads()
    assert (run / AUTO_CHOICE_DIR / record["onnx"]).is_file()

    # Second call: read back, no export and no timing.
    def no_export(*args, **kwargs):
        raise AssertionError("the kept decision must not export again")

    monkeypatch.setattr("ctxkit.inference.export.export_onnx", no_export)
    again, description = with_backend(model, "auto", "fp32", run_dir=run)  # fp32 is the default: the same decision
    assert timings.calls == 2 and type(again).__name__ == "OrtTaskModel"
    assert description.startswith(f"auto (decided {record['decided'][:10]} for this run folder on {backends._cpu_name()}): "
                                  "ONNX Runtime (fp32 export")
    with torch.inference_mode():
        assert torch.equal(again(**batch)["logits"], first(**batch)["logits"])
    monkeypatch.undo()

    # New weights in best/ (a new fine-tuning): the old decision no longer holds.
    changed = _model(seed=1)
    save_weights(changed.state_dict(), run / "best" / "model.safetensors")
    stat = os.stat(run / "best" / "model.safetensors")
    os.utime(run / "best" / "model.safetensors", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    timings = _Timings("pytorch")
    monkeypatch.setattr(backends, "median_ms", timings)
    monkeypatch.setattr(backends, "_onnxruntime", _stub_onnxruntime)
    chosen, description = with_backend(changed, "auto", None, run_dir=run)
    assert timings.calls == 2 and chosen is changed
    assert description.startswith("auto: PyTorch (cpu, fp32); ONNX Runtime 2.0 ms vs PyTorch 1.0 ms")
    record = json.loads((run / AUTO_CHOICE_DIR / "choice.json").read_text())
    assert record["backend"] == "pytorch" and "onnx" not in record
    assert not list((run / AUTO_CHOICE_DIR).glob("*.onnx"))  # the export of the old decision is gone
    chosen, description = with_backend(changed, "auto", None, run_dir=run)
    assert timings.calls == 2 and chosen is changed and description.startswith("auto (decided ")


class _StubOrt(torch.nn.Module):
    def forward(self, **batch):
        return {"logits": torch.zeros(len(batch["input_ids"]), 2)}


def _stub_onnxruntime(model, path):
    """An 'export' without the exporter, where the test is about the kept decision, not ONNX."""
    path.write_bytes(b"not really onnx")
    return _StubOrt(), "ONNX Runtime (stub)"


def test_a_read_only_run_folder_still_decides_with_a_warning(tmp_path, monkeypatch, caplog):
    model = _model()
    run = _run_folder(tmp_path, model)
    timings = _Timings("pytorch")
    monkeypatch.setattr(backends, "median_ms", timings)
    monkeypatch.setattr(backends, "_onnxruntime", _stub_onnxruntime)

    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr("ctxkit.core.checkpoint.atomic_write", read_only)
    for expected_calls in (2, 4):  # nothing kept: each call decides
        with caplog.at_level("WARNING", logger="ctxkit"):
            chosen, description = with_backend(model, "auto", None, run_dir=run)
        assert chosen is model and timings.calls == expected_calls
        assert description == "auto: PyTorch (cpu, fp32); ONNX Runtime 2.0 ms vs PyTorch 1.0 ms on a 4x64 batch"
        assert "could not keep the backend choice" in caplog.text and "Read-only file system" in caplog.text
        caplog.clear()
    assert not (run / AUTO_CHOICE_DIR / "choice.json").exists()

    # A damaged choice.json is decided again and replaced; an explicit precision is honoured on reuse.
    monkeypatch.undo()
    monkeypatch.setattr(backends, "median_ms", timings)
    monkeypatch.setattr(backends, "_onnxruntime", _stub_onnxruntime)
    (run / AUTO_CHOICE_DIR).mkdir()
    (run / AUTO_CHOICE_DIR / "choice.json").write_text("{not json")
    chosen, _ = with_backend(model, "auto", None, run_dir=run)
    assert timings.calls == 6 and chosen is model
    chosen, description = with_backend(model, "auto", "fp32", run_dir=run)
    assert timings.calls == 6 and isinstance(chosen, PrecisionModel) and chosen.inference_precision == "fp32"
    # Without run_dir (or a folder without best/) nothing is kept.
    with_backend(model, "auto", None)
    assert timings.calls == 8
    with caplog.at_level("WARNING", logger="ctxkit"):
        with_backend(model, "auto", None, run_dir=tmp_path / "elsewhere")
    assert timings.calls == 10 and "no best/ folder" in caplog.text and not (tmp_path / "elsewhere" / AUTO_CHOICE_DIR).exists()


def test_pytorch_backend_runs_at_the_precision_asked_for_on_cpu():
    model = _model()
    with torch.no_grad():  # wide logits, so that bf16 rounding shows
        model.head.classifier.weight.mul_(50)
    feats = _features()
    fp32 = np.stack(predict(model, feats, batch_size=8, device="cpu", precision="fp32"))
    bf16 = np.stack(predict(model, feats, batch_size=8, device="cpu", precision="bf16"))  # autocast, the caller's way
    assert np.abs(bf16 - fp32).max() > 1e-3 * np.abs(fp32).max()  # far above fp32 rounding

    seen = []
    hook = model.encoder.encoder.layers[0].ffn.fc1.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    wrapped, description = with_backend(model, "pytorch", "bf16")
    assert description == "PyTorch (cpu, bf16 autocast)" and isinstance(wrapped, PrecisionModel)
    assert wrapped.encoder is model.encoder and wrapped.head is model.head  # the task model's attributes read through
    got = np.stack(predict(wrapped, feats, batch_size=8, device="cpu"))  # "auto" alone would run fp32 on CPU
    np.testing.assert_array_equal(got, bf16)
    assert set(seen) == {torch.bfloat16}  # the matrix product ran in bf16

    seen.clear()
    wrapped, description = with_backend(model, "pytorch", "fp32")
    assert description == "PyTorch (cpu, fp32, no autocast)"
    got = np.stack(predict(wrapped, feats, batch_size=8, device="cpu", precision="bf16"))  # the declared fp32 wins
    np.testing.assert_array_equal(got, fp32)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):  # an enclosing autocast cannot lower it
        ids = torch.tensor([feats[0]["input_ids"]])
        np.testing.assert_allclose(wrapped(input_ids=ids)["logits"].numpy(), fp32[:1], rtol=1e-5, atol=1e-6)
    assert set(seen) == {torch.float32}
    hook.remove()

    unwrapped, description = with_backend(model, "pytorch")
    assert unwrapped is model and description == "PyTorch (cpu, fp32)"
    with pytest.raises(UserError, match="onnxruntime backend runs an fp32 export"):
        with_backend(model, "onnxruntime", "bf16")
    with pytest.raises(UserError, match="precision must be one of"):
        with_backend(model, "pytorch", "fp16")
