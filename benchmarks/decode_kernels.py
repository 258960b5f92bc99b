"""The batch-1 decoding kernels (ctxkit.fast.decode_kernels) one by one, against cuBLAS and
the weight-read time: an experiment for choosing their tiles, not a record.

Engineering measurement of a kernel, not a product figure (the product figures come from ctxkit bench).

    python benchmarks/decode_kernels.py            # GPT-2 small shapes, bf16, on CUDA

For each matrix of a GPT-2 small layer it prints the microseconds of ``row_linear`` per tile
choice (block_n, block_k, warps), of ``F.linear`` (cuBLAS) on the same row, and of reading
the matrix at the measured copy bandwidth, every call reading another copy of the matrix
from memory (as decoding does: the model does not fit the L2 cache); then ``decode_attention`` per block size over
64 / 288 / 1024 filled cache slots. Times are CUDA-graph replays of 100 launches (launch cost
as in a captured decoding step).
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F


# Kept local (not harness.seconds_per_call): it times replays of a CUDA graph holding
# ``launches`` calls, each reading another copy of the weights, so the figure is a kernel's
# time as inside a captured decoding step, without per-call launch cost from Python.
def graph_us(fn, launches: int = 100, reps: int = 20, copies: int = 1) -> float:
    """Microseconds per call of ``fn(i)`` replayed from a CUDA graph of ``launches`` calls;
    call ``i`` gets ``i % copies`` (which copy of the weights to read: enough copies to
    exceed the L2 cache make every call read from memory, as in decoding)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(3):
            fn(i % copies)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(launches):
            fn(i % copies)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (reps * launches)


def triton_next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    args = parser.parse_args(argv)
    from ctxkit.fast import decode_kernels as K  # Triton: imported once the arguments are read

    dev, bf16 = "cuda", torch.bfloat16
    big = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(big)
    copy_us = graph_us(lambda i, src=big, out=dst: out.copy_(src), launches=5, reps=5)  # (bound now: both are deleted below)
    bandwidth = 2 * big.numel() / (copy_us / 1e6)
    del big, dst
    print(f"{torch.cuda.get_device_name(0)}: copy bandwidth {bandwidth / 1e12:.2f} TB/s", flush=True)
    h = args.hidden
    shapes = {"qkv (LN)": (3 * h, h, True, None), "out proj (+res)": (h, h, False, None),
              "fc1 (LN, GELU)": (4 * h, h, True, "gelu_new"), "fc2 (+res)": (h, 4 * h, False, None)}
    for name, (n, k, ln, act) in shapes.items():
        copies = max(1, -(-256 * 2**20 // (n * k * 2)))  # 256 MB of copies: read from HBM, as in decoding
        x = torch.randn(1, k, device=dev, dtype=bf16)
        ws = [torch.randn(n, k, device=dev, dtype=bf16) / math.sqrt(k) for _ in range(copies)]
        b = torch.randn(n, device=dev, dtype=bf16)
        norm = (torch.ones(k, device=dev, dtype=bf16), torch.zeros(k, device=dev, dtype=bf16), 1e-5) if ln else None
        res = torch.randn(1, n, device=dev, dtype=bf16) if act is None and not ln else None
        launches = max(100, copies)
        cublas = graph_us(lambda i: F.linear(x, ws[i], b), launches=launches, copies=copies)
        row = [f"{name} {n}x{k}: read {n * k * 2 / bandwidth * 1e6:.2f} us, cuBLAS {cublas:.2f} us;"]
        results = {}
        for tile in [(bn, bk, warps) for bn in (1, 2, 4, 8) for bk in (256, 512, 1024, 2048, 4096) for warps in (2, 4, 8)
                     if bn * bk <= 4096 and bk <= max(256, triton_next_pow2(k))]:
            results[tile] = graph_us(lambda i, t=tile: K.row_linear(x, ws[i], b, ln=norm, activation=act, residual=res, tile=t),
                                     launches=launches, copies=copies)
        row += [f"{t}: {us:.2f}" for t, us in results.items()]
        best = min(results, key=results.get)
        default = K.tiles(n, k)
        row.append(f"| best {best}: {results[best]:.2f}, default {default}: {results.get(default, float('nan')):.2f}")
        print(" ".join(row), flush=True)
    d = h // args.heads
    for filled in (64, 288, 1024):
        kv = torch.randn(2, 1, args.heads, 1024, d, device=dev, dtype=bf16)
        q = torch.randn(1, h, device=dev, dtype=bf16)
        mask = torch.ones(1, 1024, dtype=torch.uint8, device=dev)
        where = torch.tensor([filled - 1], device=dev)
        counters = torch.zeros(args.heads, dtype=torch.int32, device=dev)
        cells = [f"{bs} slots/{warps}w: {graph_us(lambda i, b=bs, wp=warps: K.decode_attention(q, kv, mask, where, 0.125, block_s=b, num_warps=wp, counters=counters)):.2f}"
                 for bs in (32, 64, 128) for warps in (2, 4, 8)]
        print(f"attention over {filled} slots: " + ", ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
