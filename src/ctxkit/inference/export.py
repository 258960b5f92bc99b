"""ONNX export, int8 quantisation and an ONNX Runtime backend for fine-tuned runs.

A fine-tuned run (``ctxkit finetune``) is an encoder plus a task head. This module:

* exports it to ONNX with dynamic batch and sequence axes (``export_onnx``) and checks
  ONNX Runtime's outputs against PyTorch's on a padded batch (``verify_onnx``);
* quantises the exported graph's weights to int8 (``quantize_onnx``: ONNX Runtime's
  dynamic quantisation, int8 weights with per-batch activation scales);
* runs an ``.onnx`` file behind the module interface the tasks already use
  (:class:`OrtTaskModel`: ``model(input_ids=..., ...)["logits"]``), so ``ctxkit predict``,
  ``evaluate`` and ``serve`` work on an exported or quantised run unchanged;
* writes such a run folder (``quantize_run``): ``task.json`` plus ``best/`` holding the
  tokenizer, ``config.json`` and ``model.int8.onnx`` instead of PyTorch weights.

onnx / onnxruntime are imported on use, so ``import ctxkit`` does not need them.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Dict, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from ..tasks.ort_model import OrtTaskModel, _session
from ..core.deps import require_all
from ..core.diskspace import reporting_disk_full, tensor_bytes, unchanged_note
from ..core.durable import MANIFEST, atomic_write, write_folder
from ..core.errors import UserError
from ..tasks import load_run

__all__ = ["export_onnx", "verify_onnx", "quantize_onnx", "OrtTaskModel", "quantize_run", "ONNX_INPUTS", "folder_size_mb"]

ONNX_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
BACKEND_FILE = "backend.json"  # in best/: which ONNX file replaces the PyTorch weights

#: what export, verification and quantisation import (the `deploy` extra)
DEPLOY_NEEDS = ("onnx", "onnxruntime")


class _Logits(nn.Module):
    """A task model as ``(input_ids, attention_mask, token_type_ids) -> logits`` (a tensor,
    or a tuple for span heads), the fixed signature an exported graph needs."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor):
        return self.model(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)["logits"]


def _example_batch(vocab_size: int, batch: int = 3, seq: int = 24, seed: int = 0) -> Dict[str, Tensor]:
    """Random ids with a padded row and a second segment: exercises every input."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab_size, (batch, seq), generator=g)
    mask = torch.ones_like(ids)
    mask[-1, seq * 2 // 3:] = 0
    ids[mask == 0] = 0
    types = torch.zeros_like(ids)
    types[:, seq // 2:] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def _vocab_size(model: nn.Module) -> int:
    return model.encoder.config.vocab_size


def export_onnx(model: nn.Module, path: os.PathLike, opset: int = 17) -> Path:
    """Export a task model (:class:`~ctxkit.heads.EncoderWithHead`) to ONNX.

    Inputs ``input_ids``, ``attention_mask``, ``token_type_ids`` (int64, ``(batch, seq)``),
    both axes dynamic; outputs ``logits`` (``logits_0``, ``logits_1`` for span heads).

    Args:
        model: the fine-tuned model, on CPU, fp32.
        path: the ``.onnx`` file to write (its folder is created).
        opset: ONNX opset.

    Returns:
        ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    wrapped = _Logits(model).eval().cpu().float()
    example = _example_batch(_vocab_size(model))
    with torch.no_grad():
        out = wrapped(**example)
    outputs = [f"logits_{i}" for i in range(len(out))] if isinstance(out, tuple) else ["logits"]
    axes = {name: {0: "batch", 1: "seq"} for name in ONNX_INPUTS}
    for name, tensor in zip(outputs, out if isinstance(out, tuple) else (out,)):
        axes[name] = {0: "batch", 1: "seq"} if tensor.dim() >= 2 and tensor.size(1) == example["input_ids"].size(1) else {0: "batch"}
    args = tuple(example[k] for k in ONNX_INPUTS)
    tmp = path.with_name(path.name + ".tmp")
    # The graph holds the weights in fp32: that is what the file needs, refused early if it cannot fit.
    with reporting_disk_full(path, tensor_bytes(wrapped.state_dict()), intact=unchanged_note(path)):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the exporter's deprecation chatter is not the user's concern
                # The TorchScript exporter (torch >= 2.4) needs only `onnx`; the dynamo one would also
                # need onnxscript, so it is not used.
                torch.onnx.export(wrapped, args, str(tmp), input_names=list(ONNX_INPUTS), output_names=outputs,
                                  dynamic_axes=axes, opset_version=opset, dynamo=False)
            os.replace(tmp, path)  # a failed export never leaves a half-written file under the real name
        finally:  # the temporary file when the export failed, external-data files in any case
            for extra in path.parent.glob(tmp.name + "*"):
                extra.unlink()
    return path


def verify_onnx(model: nn.Module, path: os.PathLike, atol: float = 1e-4, batch: int = 4, seq: int = 37) -> float:
    """Largest absolute difference between PyTorch and ONNX Runtime on a padded batch of a
    shape the export never saw.

    Raises:
        ValueError: when it exceeds ``atol`` (the export is wrong; do not ship it).
    """
    example = _example_batch(_vocab_size(model), batch, seq, seed=1)
    with torch.no_grad():
        ref = _Logits(model).eval().cpu().float()(**example)
    refs = ref if isinstance(ref, tuple) else (ref,)
    got = _session(path).run(None, {k: v.numpy() for k, v in example.items()})
    mask = example["attention_mask"].bool().numpy()
    diff = 0.0
    for r, g in zip(refs, got):
        r = r.numpy()
        if r.ndim >= 2 and r.shape[1] == seq:  # per-token outputs: padded positions are meaningless
            r, g = r[mask], g[mask]
        diff = max(diff, float(np.abs(r - g).max()))
    if diff > atol:
        raise UserError(f"{path}: ONNX Runtime differs from PyTorch by {diff:.2e} (> {atol:.0e})")
    return diff


def quantize_onnx(src: os.PathLike, dst: os.PathLike) -> Path:
    """Dynamic int8 quantisation of an exported model's MatMul/Gemm weights and embedding tables
    (Gather: the word embeddings are a quarter of a small model's bytes)."""
    require_all(DEPLOY_NEEDS, "int8 quantisation")
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # Written beside dst and renamed: a failure (a full disk) leaves no partial file under its name.
    return atomic_write(dst, lambda tmp: quantize_dynamic(str(src), tmp, weight_type=QuantType.QInt8,
                                                          op_types_to_quantize=["MatMul", "Gemm", "Gather"]))


def folder_size_mb(paths: Sequence[os.PathLike]) -> float:
    """Total size of files in megabytes (10^6 bytes)."""
    return sum(Path(p).stat().st_size for p in paths) / 1e6


def quantize_run(run_dir: os.PathLike, out_dir: os.PathLike, verify: bool = True) -> dict:
    """Write an int8 copy of a fine-tuned run: ``ctxkit predict / evaluate / serve`` load it.

    Args:
        run_dir: a finished ``ctxkit finetune`` run.
        out_dir: the new run folder (``task.json``, ``best/`` with tokenizer, config and
            ``model.int8.onnx``).
        verify: check the fp32 export against PyTorch first (1e-4).

    Returns:
        ``{"fp32_mb", "int8_mb", "ratio", "max_abs_diff_fp32_export"}``.
    """

    require_all(DEPLOY_NEEDS, "ctxkit quantize")  # before the run loads
    run_dir, out = Path(run_dir), Path(out_dir)
    _, model, _, _ = load_run(run_dir, device="cpu")
    src_best = run_dir / "best"
    diff = None

    def write(best_out: Path) -> None:
        nonlocal diff
        fp32 = export_onnx(model, best_out / "model.fp32.onnx")
        diff = verify_onnx(model, fp32) if verify else None
        quantize_onnx(fp32, best_out / "model.int8.onnx")
        fp32.unlink()
        for item in src_best.iterdir():
            # The source's MANIFEST.json describes its weights, not this folder: write_folder writes a new one.
            if item.is_file() and item.suffix in (".json", ".txt") and item.name != MANIFEST:
                shutil.copy2(item, best_out / item.name)
        (best_out / BACKEND_FILE).write_text(json.dumps({"backend": "onnxruntime", "file": "model.int8.onnx",
                                                         "precision": "int8", "source_run": str(run_dir)}, indent=2)
                                             + "\n", encoding="utf-8")

    out.mkdir(parents=True, exist_ok=True)
    # Swapped in whole, like a training run's best/; it holds the fp32 export and the int8 copy
    # (a quarter of it) at once, which a disk without room for both refuses before they start.
    int8 = write_folder(out / "best", write, needed=tensor_bytes(model.state_dict()) * 5 // 4) / "model.int8.onnx"
    atomic_write(out / "task.json", lambda tmp: shutil.copyfile(run_dir / "task.json", tmp))
    weights = [p for p in src_best.iterdir() if p.suffix in (".safetensors", ".bin")]
    fp32_mb, int8_mb = folder_size_mb(weights), folder_size_mb([int8])
    return {"fp32_mb": round(fp32_mb, 2), "int8_mb": round(int8_mb, 2), "ratio": round(int8_mb / fp32_mb, 3),
            "max_abs_diff_fp32_export": diff}
