"""The ceiling of fp8 inference on this GPU: BERT-base's four GEMM shapes in bf16 and as
float8 e4m3 ``torch._scaled_mm`` with one scale per tensor and with per-row / per-column
scales (what :class:`ctxkit.inference.fp8.Fp8Linear` uses), plus the kernels of a whole
fp8 and bf16 forward pass (``--profile``: ``GPUEncoder`` with the fast plans ``qkv+compile``
and ``qkv+compile+fp8``, compiled, no CUDA graphs, so the profiler sees every kernel).

    python benchmarks/fp8_gemm.py --profile

Diagnostic only (prints tables, writes no records).

Engineering measurement of a kernel, not a product figure (the product figures come from ctxkit bench).
"""

from __future__ import annotations

import argparse
import copy

import torch

from ffn_epilogue import kernel_table, time_ms  # per-call median and profiler table (see ffn_epilogue.py)

from ctxkit.inference.gpu import GPUEncoder
from ctxkit.models.bert.model import BertModel
from ctxkit.zoo.presets import PRESETS

SHAPES = {"q/k/v": (768, 2304), "attention output": (768, 768), "fc1": (768, 3072), "fc2": (3072, 768)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=256 * 128)
    parser.add_argument("--profile", action="store_true", help="profile a batch-256 forward pass, bf16 and fp8")
    args = parser.parse_args(argv)
    m, f8 = args.tokens, torch.float8_e4m3fn
    print(f"{'GEMM':18s} {'bf16 ms':>8s} {'fp8/tensor':>10s} {'fp8/row':>8s}   (TFLOP/s bf16, tensor, row)")
    for name, (k, n) in SHAPES.items():
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        a8, w8 = a.to(f8), w.to(f8)
        one = torch.ones((), device="cuda")
        rows, cols = torch.ones(m, 1, device="cuda"), torch.ones(1, n, device="cuda")
        times = [time_ms(lambda: a @ w.t()),
                 time_ms(lambda: torch._scaled_mm(a8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)),
                 time_ms(lambda: torch._scaled_mm(a8, w8.t(), scale_a=rows, scale_b=cols, out_dtype=torch.bfloat16))]
        flop = 2 * m * k * n
        print(f"{name:18s} " + " ".join(f"{t:8.3f}" for t in times) + "   (" + ", ".join(f"{flop / t / 1e9:.0f}" for t in times) + ")")
    if args.profile:
        model = BertModel(PRESETS["bert_12_768_12"].config).eval()
        ids = torch.randint(1000, 20000, (256, 128), device="cuda")
        for label, plan in (("bf16", "qkv+compile"), ("fp8", "qkv+compile+fp8")):
            enc = GPUEncoder(copy.deepcopy(model), plan=plan)
            enc(ids)
            print(f"-- {label}: batch 256 x 128, 5 forward passes")
            print(kernel_table(lambda: enc(ids), 5, rows=14))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
