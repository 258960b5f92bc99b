"""Where a BERT-base feed-forward block spends its time on a GPU (bf16, inference), and
what folding the activation into the GEMM's epilogue saves.

    python benchmarks/ffn_epilogue.py                # batch 256 x seq 128 tokens

Times (CUDA events, median of --reps) for one block at ``--tokens`` rows:
``fc1 GEMM`` alone, ``fc1 + GELU`` eager / compiled / cuBLASLt epilogue (the tanh GELU
that ``torch._addmm_activation(use_gelu=True)`` folds into the GEMM), and the whole
block ``LayerNorm(x + fc2(gelu(fc1(x))))`` compiled, with and without the epilogue GELU.
Prints a table; diagnostic only (no records). The same tanh-GELU epilogue runs in
``GPUEncoder(model, plan="graphs+compile+qkv+gelutanh")``.

Engineering measurement of a kernel, not a product figure (the product figures come from ctxkit bench).
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F

from ctxkit.fast import linear_gelu_tanh


def kernel_table(fn, calls: int, rows: int = 10) -> str:
    """The CUDA kernels of ``calls`` calls of ``fn``, longest total first."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=90)


# Kept local (not harness.seconds_per_call, a mean over back-to-back calls): the median of
# per-call CUDA-event times, each call timed on its own (fp8_gemm.py uses it too).
def time_ms(fn, reps: int = 50) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=256 * 128)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--hidden", type=int, default=3072)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--profile", action="store_true", help="also print the kernels of each whole-block variant")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(args.tokens, args.dim, device=dev, dtype=dt)
    w1 = torch.randn(args.hidden, args.dim, device=dev, dtype=dt) * 0.02
    b1 = torch.randn(args.hidden, device=dev, dtype=dt) * 0.02
    w2 = torch.randn(args.dim, args.hidden, device=dev, dtype=dt) * 0.02
    b2 = torch.randn(args.dim, device=dev, dtype=dt) * 0.02
    ln_w, ln_b = torch.ones(args.dim, device=dev, dtype=dt), torch.zeros(args.dim, device=dev, dtype=dt)

    def block(h, gelu_epilogue: bool):
        inner = linear_gelu_tanh(h, w1, b1) if gelu_epilogue else F.gelu(F.linear(h, w1, b1))
        return F.layer_norm(h + F.linear(inner, w2, b2), (args.dim,), ln_w, ln_b)

    compiled_gelu = torch.compile(lambda h: F.gelu(F.linear(h, w1, b1)))
    compiled_block = torch.compile(lambda h: block(h, False))
    compiled_block_epi = torch.compile(lambda h: block(h, True))
    flop = 2 * args.tokens * args.dim * args.hidden
    rows = [
        ("fc1 GEMM (mm, no bias)", lambda: x @ w1.t(), flop),
        ("fc1 + bias + GELU, eager", lambda: F.gelu(F.linear(x, w1, b1)), flop),
        ("fc1 + bias + GELU, torch.compile", lambda: compiled_gelu(x), flop),
        ("fc1 + bias + tanh GELU in the cuBLASLt epilogue", lambda: linear_gelu_tanh(x, w1, b1), flop),
        ("whole block, torch.compile", lambda: compiled_block(x), 2 * flop),
        ("whole block, torch.compile + epilogue GELU", lambda: compiled_block_epi(x), 2 * flop),
    ]
    with torch.inference_mode():
        ref = F.gelu(F.linear(x.float(), w1.float(), b1.float()))
        diff = (linear_gelu_tanh(x, w1, b1).float() - ref).abs().max().item()
        base = (F.gelu(F.linear(x, w1, b1)).float() - ref).abs().max().item()
        print(f"max |error| vs fp32 erf GELU: epilogue {diff:.4g}, bf16 erf GELU {base:.4g}")
        print(f"{'case':52s} {'ms':>8s} {'TFLOP/s':>8s}")
        for name, fn, f in rows:
            ms = time_ms(fn, args.reps)
            print(f"{name:52s} {ms:8.3f} {f / ms / 1e9:8.1f}")
        if args.profile:
            for name, fn, _ in rows[-2:]:
                print(f"-- {name} (10 calls)")
                print(kernel_table(fn, 10, rows=8))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
