"""Sparse Transformer attention (FlexAttention, block-sparse) vs dense causal attention.

    python benchmarks/sparse_attention.py                 # one GPU: seq 2048 .. 16384, bf16
    python benchmarks/sparse_attention.py --smoke         # CPU, tiny shapes: checks the script runs

For each sequence length, batch 1, 8 heads of 64, bf16, inputs ``(1, 8, seq, 64)`` that
need gradients: forward + backward (``torch.autograd.grad`` of the output against a fixed
random gradient) of

* ``SparsePattern("strided", 128)`` and ``SparsePattern("fixed", 128)`` (c = 8) through
  :meth:`~ctxkit.layers.SparsePattern.attend` (compiled FlexAttention);
* the peer: dense causal SDPA, ``is_causal=True`` (the flash kernel);
* dense SDPA with the pattern's boolean mask (the memory-efficient kernel with a bias), where
  it fits: the same function as the sparse kernel, computed densely.

Times: CUDA events, median of --reps after --warmup calls (the first compiles). Memory:
``torch.cuda.max_memory_allocated`` during one forward + backward, above what was allocated
before it (inputs, the cached block masks and the boolean mask excluded). Each record also
holds the score tiles the sparse kernel computes against causal attention's, and the largest
difference between the sparse output and SDPA with the boolean mask (both bf16).

Writes speed records (``ctxkit`` = the sparse kernel, ``peer`` = causal flash SDPA,
``speedup`` = peer / ctxkit, for memory the factor saved) to
benchmarks/results/sparse_attention.json (--results to change; a rerun replaces the records
of the same cases and card) and prints a markdown table.
``--smoke`` runs on CPU with tiny shapes and float32 (FlexAttention has no CPU backward:
the sparse path's backward there is the dense fallback) and writes no records unless
--results is given.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from harness import RESULTS, command_line, write_records

from ctxkit.layers import SparsePattern

DEFAULT_RESULTS = RESULTS / "sparse_attention.json"


# Kept local (not harness.seconds_per_call, a mean over back-to-back calls): the records hold
# the median of per-call times and the peak memory of one call above what was allocated.
def measure(fn, device: str, warmup: int, reps: int):
    """``(median ms, peak MiB above the start or None)`` of ``fn()``."""
    cuda = device == "cuda"
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    peak = None
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    return statistics.median(times), peak


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--stride", type=int, default=128, help="l of both patterns (about sqrt(seq))")
    parser.add_argument("--summary", type=int, default=None, help="c of the fixed pattern (default l // 16 = 8)")
    parser.add_argument("--block-size", type=int, default=128, help="FlexAttention tile size")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--no-mask-sdpa", action="store_true", help="skip dense SDPA with the boolean masks")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, float32, no records unless --results")
    parser.add_argument("--results", default=None, help="records file (default benchmarks/results/sparse_attention.json)")
    args = parser.parse_args(argv)
    if args.smoke:
        device, dtype = "cpu", torch.float32
        args.seq, args.heads, args.head_dim, args.stride, args.block_size = [64, 100], 2, 16, 8, 16
        args.warmup, args.reps = 1, 2
    elif not torch.cuda.is_available():
        print("this benchmark needs a GPU; --smoke runs a CPU check of the script", file=sys.stderr)
        return 2
    else:
        device, dtype = "cuda", torch.bfloat16
    results = Path(args.results) if args.results else (None if args.smoke else DEFAULT_RESULTS)
    device_name = (f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}" if device == "cuda"
                   else f"CPU, {torch.get_num_threads()} threads, torch {torch.__version__}")
    # Where the records went is no part of how they were made (and names a machine's path).
    command = command_line("sparse_attention.py", argv if argv is not None else sys.argv[1:])
    patterns = {"strided": SparsePattern("strided", args.stride, block_size=args.block_size),
                "fixed": SparsePattern("fixed", args.stride, summary=args.summary, block_size=args.block_size)}
    dt_name = {torch.bfloat16: "bf16", torch.float32: "fp32"}[dtype]
    records, rows = [], []
    for n in args.seq:
        if device == "cuda":
            torch._dynamo.reset()  # fresh recompile budgets for each length (one process compiles them all)
            torch.cuda.empty_cache()
        g = torch.Generator(device=device).manual_seed(n)
        shape = (args.batch, args.heads, n, args.head_dim)
        q, k, v = (torch.randn(shape, device=device, dtype=dtype, generator=g).requires_grad_() for _ in range(3))
        grad_out = torch.randn(shape, device=device, dtype=dtype, generator=g)

        def fwd_bwd(attn, q=q, k=k, v=v, grad_out=grad_out):
            def run():
                out = attn(q, k, v)
                torch.autograd.grad(out, (q, k, v), grad_out)
            return run

        def fwd(attn, q=q, k=k, v=v):
            def run():
                with torch.no_grad():
                    attn(q, k, v)
            return run

        causal = lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True)  # noqa: E731
        peer_fb, peer_mem = measure(fwd_bwd(causal), device, args.warmup, args.reps)
        peer_f, _ = measure(fwd(causal), device, args.warmup, args.reps)
        for kind, pattern in patterns.items():
            layout = pattern.block_mask(n, device)
            variants = {}
            variants[f"sparse {kind} (FlexAttention)"] = pattern.attend
            mask = None
            if not args.no_mask_sdpa:
                try:
                    mask = pattern.dense(n, device)
                    variants["dense SDPA, boolean mask"] = lambda a, b, c, m=mask: F.scaled_dot_product_attention(a, b, c, attn_mask=m)
                except torch.cuda.OutOfMemoryError:
                    mask = None
            timing = {}
            for name, attn in variants.items():
                try:
                    timing[name] = measure(fwd_bwd(attn), device, args.warmup, args.reps) + measure(fwd(attn), device, args.warmup, args.reps)[:1]
                except torch.cuda.OutOfMemoryError:
                    print(f"seq {n}, {kind}: {name} does not fit", flush=True)
                    torch.cuda.empty_cache()
            diff = None
            if mask is not None and "dense SDPA, boolean mask" in timing:
                with torch.no_grad():
                    diff = float((pattern.attend(q, k, v).float() - F.scaled_dot_product_attention(q, k, v, attn_mask=mask).float()).abs().max())
            del mask
            ours_name = f"sparse {kind} (FlexAttention)"
            ours_fb, ours_mem, ours_f = timing[ours_name]
            masked = timing.get("dense SDPA, boolean mask")
            case = (f"{kind} l={args.stride}" + (f" c={pattern.summary}" if kind == "fixed" else "")
                    + f", causal, seq {n}, batch {args.batch}, {args.heads} heads x {args.head_dim}, {dt_name}")
            extra = {"pattern": repr(pattern), "block_size": args.block_size, "tiles_computed": layout.nonempty_blocks(),
                     "tiles_causal": layout.causal_blocks(), "max_abs_diff_vs_dense_mask": diff}
            stamp = {"device": device_name, "date": datetime.date.today().isoformat(), "command": command}
            peer_name = "dense causal SDPA (is_causal=True, flash)" if device == "cuda" else "dense causal SDPA (is_causal=True)"
            for metric, unit, ours, peer, mask_value in [
                ("forward+backward time (median)", "ms", ours_fb, peer_fb, masked[0] if masked else None),
                ("forward time (median)", "ms", ours_f, peer_f, masked[2] if masked else None),
                ("peak memory, forward+backward", "MiB", ours_mem, peer_mem, masked[1] if masked else None),
            ]:
                if ours is None:
                    continue
                records.append({"benchmark": "sparse_attention", "case": case, "metric": metric, "unit": unit,
                                "ctxkit": round(ours, 3), "peer_name": peer_name, "peer": round(peer, 3),
                                "speedup": round(peer / ours, 3) if ours else None,
                                "all": {ours_name: round(ours, 3), peer_name: round(peer, 3),
                                        "dense SDPA, boolean mask": None if mask_value is None else round(mask_value, 3)},
                                **extra, **stamp})
            rows.append((n, kind, layout.nonempty_blocks(), layout.causal_blocks(), ours_fb, peer_fb, masked[0] if masked else None,
                         ours_f, peer_f, ours_mem, peer_mem, masked[1] if masked else None, diff))
            print(f"seq {n} {kind}: sparse {ours_fb:.3f} ms fwd+bwd vs causal SDPA {peer_fb:.3f} ms", flush=True)
    print()
    print(f"{device_name}; batch {args.batch}, {args.heads} heads x {args.head_dim}, {dt_name}, l = {args.stride}")
    print()
    print("| seq | pattern | tiles (sparse / causal) | fwd+bwd ms: sparse | causal SDPA | SDPA + bool mask | fwd ms: sparse | causal SDPA "
          "| peak MiB: sparse | causal SDPA | SDPA + bool mask | max diff vs bool mask |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")

    def f(x, digits=2):
        return "" if x is None else f"{x:.{digits}f}"

    for n, kind, tiles, causal_tiles, fb, pfb, mfb, fo, pfo, mem, pmem, mmem, diff in rows:
        print(f"| {n} | {kind} | {tiles} / {causal_tiles} | {f(fb)} | {f(pfb)} | {f(mfb)} | {f(fo)} | {f(pfo)} | {f(mem, 0)} | {f(pmem, 0)} "
              f"| {f(mmem, 0)} | {'' if diff is None else f'{diff:.3g}'} |")
    if results is not None:
        write_records(results.name, records, str(results))
        print(f"\nwrote {len(records)} records to {results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
