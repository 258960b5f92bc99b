"""A compiled CPU backend for encoder task models: frozen weights + Inductor's C++ GEMMs.

``torch.compile`` with weight freezing lets Inductor pre-pack every weight matrix and,
with max-autotune, pick its own C++ GEMM templates where they beat oneDNN/MKL; the
elementwise work between GEMMs is fused. On this project's 2-core AMD CPU that makes bf16
inference ~1.3x faster than eager autocast (docs/performance.md). The cost is a
compilation per input shape (~40 s for BERT-base), so sequence lengths are padded up to a
multiple of ``length_multiple``: a handful of shapes serve every input, and the padding
is masked like any other (exact for every head; per-token outputs are cut back).
"""

from __future__ import annotations

import contextlib
from typing import Dict, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.errors import UserError

__all__ = ["CompiledCPUModel", "CPU_INFERENCE_OPTIONS"]

CPU_INFERENCE_OPTIONS = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"}


class CompiledCPUModel(nn.Module):
    """Wrap a task model (``model(input_ids=..., ...)["logits"]``) for compiled CPU inference.

    Args:
        model: an :class:`~ctxkit.heads.EncoderWithHead` in eval mode on CPU.
        precision: "fp32" or "bf16" (autocast; the CPU needs AVX-512 BF16 or AMX to gain).
        length_multiple: pad sequences to a multiple of this (fewer shapes, fewer compiles).

    Inference only (runs under ``torch.inference_mode``).
    """

    def __init__(self, model: nn.Module, precision: str = "bf16", length_multiple: int = 32):
        super().__init__()
        if precision not in ("fp32", "bf16"):
            raise UserError(f"precision must be 'fp32' or 'bf16', got {precision!r}")
        self.model = model.eval()
        self.precision = precision
        self.length_multiple = length_multiple
        self.compiled = torch.compile(self.model, dynamic=False)

    def forward(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None, token_type_ids: Optional[Tensor] = None, **_) -> Dict:
        seq = input_ids.size(1)
        pad = -seq % self.length_multiple
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        if pad:
            input_ids, mask, types = (F.pad(t, (0, pad)) for t in (input_ids, mask, types))
        bf16 = torch.autocast("cpu", dtype=torch.bfloat16) if self.precision == "bf16" else contextlib.nullcontext()
        with torch._inductor.config.patch(CPU_INFERENCE_OPTIONS), torch.inference_mode(), bf16:
            out = self.compiled(input_ids=input_ids, token_type_ids=types, attention_mask=mask)["logits"]
        parts = out if isinstance(out, tuple) else (out,)
        # Per-token outputs (NER, span starts/ends) lose the padding again; logits go fp32.
        parts = tuple((p[:, :seq] if p.dim() >= 2 and p.size(1) == seq + pad else p).float() for p in parts)
        return {"logits": parts if isinstance(out, tuple) else parts[0]}
