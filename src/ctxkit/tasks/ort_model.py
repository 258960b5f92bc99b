"""An exported task model (``.onnx``) run by ONNX Runtime behind the module interface the
tasks use, so ``predict``, ``evaluate`` and ``serve`` work on exported and quantised runs
unchanged. Kept apart from :mod:`ctxkit.inference.export` (which needs the tasks to write
run folders) so that loading a run does not import the exporter.

onnxruntime is imported on use.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, Optional

import numpy as np
import torch
from torch import Tensor, nn

from ..core.deps import require

__all__ = ["OrtTaskModel"]


def _session(path: os.PathLike, threads: Optional[int] = None):
    ort = require("onnxruntime", "running an exported model")

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or torch.get_num_threads()
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])



class OrtTaskModel(nn.Module):
    """An exported task model run by ONNX Runtime behind the PyTorch module interface.

    ``forward`` takes and returns what :class:`~ctxkit.heads.EncoderWithHead` does
    (without the loss), so :func:`ctxkit.training.predict` and the tasks use it as is.

    Args:
        path: the ``.onnx`` file.
        config: the encoder's config (for code that reads ``model.encoder.config``).
        threads: ONNX Runtime intra-op threads (default: PyTorch's thread count).
    """

    def __init__(self, path: os.PathLike, config=None, threads: Optional[int] = None):
        super().__init__()
        self.path = Path(path)
        self.session = _session(self.path, threads)
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.config = config

    def forward(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None, token_type_ids: Optional[Tensor] = None, **_) -> Dict:
        feed = {"input_ids": input_ids.cpu().numpy().astype(np.int64),
                "attention_mask": (torch.ones_like(input_ids) if attention_mask is None else attention_mask).cpu().numpy().astype(np.int64),
                "token_type_ids": (torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids).cpu().numpy().astype(np.int64)}
        out = [torch.from_numpy(o) for o in self.session.run(self.outputs, feed)]
        return {"logits": out[0] if len(out) == 1 else tuple(out)}
