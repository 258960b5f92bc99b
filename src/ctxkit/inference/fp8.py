"""FP8 (e4m3) matrix products for encoder inference: a separate, declared precision.

The implementation lives in :mod:`ctxkit.fast.fp8` (with the other fast variants swapped
into a built model); this module keeps the inference-side names.
"""

from __future__ import annotations

from ..fast.fp8 import FP8_MAX, FP8_SCOPES, Fp8EpilogueLinear, Fp8GeluFFN, Fp8Linear, convert_to_fp8

__all__ = ["FP8_MAX", "FP8_SCOPES", "Fp8EpilogueLinear", "Fp8GeluFFN", "Fp8Linear", "convert_to_fp8"]
