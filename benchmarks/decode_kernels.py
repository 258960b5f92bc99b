"""The batch-1 decoding kernels (ctxkit.fast.decode_kernels) one by one, against cuBLAS and
the weight-read time: an experiment for choosing their tiles, not a record.

    python benchmarks/decode_kernels.py            # GPT-2 small shapes, bf16, on CUDA

For each matrix of a GPT-2 small layer it prints the microseconds of ``row_linear`` per tile
choice (block_n, block_k, warps), of ``F.linear`` (cuBLAS) on the same row, and of reading
the matrix at the measured copy bandwidth; then ``decode_attention`` per block size over
64 / 288 / 1024 filled cache slots. Times are CUDA-graph replays of 100 launches (launch cost
as in a captured decoding step).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from ctxkit.fast import decode_kernels as K  # noqa: E402


def graph_us(fn, launches: int = 100, reps: int = 20) -> float:
    """Microseconds per call of ``fn`` replayed from a CUDA graph of ``launches`` calls."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(launches):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (reps * launches)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    args = parser.parse_args(argv)
    dev, bf16 = "cuda", torch.bfloat16
    big = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(big)
    copy_us = graph_us(lambda: dst.copy_(big), launches=5, reps=5)
    bandwidth = 2 * big.numel() / (copy_us / 1e6)
    del big, dst
    print(f"{torch.cuda.get_device_name(0)}: copy bandwidth {bandwidth / 1e12:.2f} TB/s", flush=True)
    h = args.hidden
    shapes = {"qkv (LN)": (3 * h, h, True, None), "out proj (+res)": (h, h, False, None),
              "fc1 (LN, GELU)": (4 * h, h, True, "gelu_new"), "fc2 (+res)": (h, 4 * h, False, None)}
    for name, (n, k, ln, act) in shapes.items():
        x = torch.randn(1, k, device=dev, dtype=bf16)
        w = torch.randn(n, k, device=dev, dtype=bf16) / math.sqrt(k)
        b = torch.randn(n, device=dev, dtype=bf16)
        norm = (torch.ones(k, device=dev, dtype=bf16), torch.zeros(k, device=dev, dtype=bf16), 1e-5) if ln else None
        res = torch.randn(1, n, device=dev, dtype=bf16) if act is None and not ln else None
        row = [f"{name} {n}x{k}: read {w.numel() * 2 / bandwidth * 1e6:.2f} us, cuBLAS {graph_us(lambda: F.linear(x, w, b)):.2f} us;"]
        for tile in [(bn, bk, warps) for bn in (1, 2, 4, 8, 16) for bk in (128, 256, 512) for warps in (2, 4, 8)
                     if bn * bk <= 8192]:
            us = graph_us(lambda t=tile: K.row_linear(x, w, b, ln=norm, activation=act, residual=res, tile=t))
            row.append(f"{tile}: {us:.2f}")
        default = K.tiles(n, k)
        row.append(f"default {default}: {graph_us(lambda: K.row_linear(x, w, b, ln=norm, activation=act, residual=res)):.2f}")
        print(" ".join(row), flush=True)
    d = h // args.heads
    for filled in (64, 288, 1024):
        kv = torch.randn(2, 1, args.heads, 1024, d, device=dev, dtype=bf16)
        q = torch.randn(1, h, device=dev, dtype=bf16)
        mask = torch.ones(1, 1024, dtype=torch.uint8, device=dev)
        where = torch.tensor([filled - 1], device=dev)
        cells = [f"{bs} slots/{warps}w: {graph_us(lambda b=bs, wp=warps: K.decode_attention(q, kv, mask, where, 0.125, block_s=b, num_warps=wp)):.2f}"
                 for bs in (32, 64, 128) for warps in (2, 4, 8)]
        print(f"attention over {filled} slots: " + ", ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
